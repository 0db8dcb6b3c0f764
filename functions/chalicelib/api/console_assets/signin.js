// Sign in: the admin token, checked against the API before it is kept (in api.js's memory only).

import * as api from "./api.js";
import { h, uid } from "./dom.js";

export function showSignIn(main, { message, onSignedIn }) {
  const fieldId = uid("admin-token");
  const errorId = uid("signin-error");
  const field = h("input", {
    id: fieldId,
    type: "password",
    autocomplete: "off",
    spellcheck: "false",
    required: true,
    "aria-describedby": errorId,
  });
  const error = h("p", { id: errorId, class: "error", role: "alert" }, message || "");
  const button = h("button", { type: "submit", class: "primary" }, "Sign in");

  async function submit(event) {
    event.preventDefault();
    const token = field.value.trim();
    if (!token) {
      error.textContent = "Enter the admin token.";
      field.focus();
      return;
    }
    button.disabled = true;
    error.textContent = "";
    try {
      await api.signIn(token);
    } catch (refused) {
      error.textContent = refused.message;
      field.setAttribute("aria-invalid", "true");
      button.disabled = false;
      field.select();
      field.focus();
      return;
    }
    field.value = "";
    onSignedIn();
  }

  const form = h(
    "form",
    { class: "card signin", onsubmit: submit, novalidate: true },
    h("h1", {}, "Sign in"),
    h("p", {}, "The admin token is kept in this page's memory only: a reload asks for it again."),
    h("div", { class: "field" }, h("label", { for: fieldId }, "Admin token"), field),
    error,
    h("div", { class: "actions" }, button),
  );
  main.replaceChildren(form);
  document.title = "Sign in · ModelForge console";
  field.focus();
}
