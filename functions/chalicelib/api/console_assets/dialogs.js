// Modal dialogs: native <dialog> opened with showModal() (the page behind is inert, Escape
// closes it), plus a focus trap so Tab and Shift+Tab cycle inside the dialog instead of
// leaving it for the browser's own controls.

import { h, uid } from "./dom.js";

const TABBABLE = "a[href], button, input, select, textarea, [tabindex]";

function tabbable(dialog) {
  return [...dialog.querySelectorAll(TABBABLE)].filter((element) => {
    if (element.disabled || element.tabIndex < 0 || element.closest("[hidden]")) return false;
    if (element.getClientRects().length === 0) return false;
    // of a radio group only the checked radio (or the first, when none is) takes Tab
    if (element.type === "radio" && element.name) {
      const group = [...dialog.querySelectorAll(`input[type="radio"][name="${element.name}"]`)];
      const checked = group.find((radio) => radio.checked);
      return checked ? element === checked : element === group[0];
    }
    return true;
  });
}

function trapTab(event) {
  if (event.key !== "Tab") return;
  const dialog = event.currentTarget;
  const stops = tabbable(dialog);
  if (stops.length === 0) {
    event.preventDefault();
    return;
  }
  const first = stops[0];
  const last = stops[stops.length - 1];
  const inside = dialog.contains(document.activeElement);
  if (event.shiftKey && (document.activeElement === first || !inside)) {
    event.preventDefault();
    last.focus();
  } else if (!event.shiftKey && (document.activeElement === last || !inside)) {
    event.preventDefault();
    first.focus();
  }
}

/**
 * A modal dialog named by its heading `title`. `onClose` runs once when it closes (Escape, a
 * Close button, or close()); the dialog is then removed from the page with everything in it.
 */
export function openModal({ title, className, role, onClose }) {
  const titleId = uid("dialog-title");
  const heading = h("h2", { id: titleId }, title);
  const body = h("div", { class: "dialog-body" });
  const dialog = h("dialog", { "aria-labelledby": titleId, class: className, role }, heading, body);
  // Closing runs onClose at once, not when the "close" event comes (a task later): what the
  // dialog held (a one-time token) is gone by the time the dialog is.
  let closed = false;
  const close = () => {
    if (closed) return;
    closed = true;
    if (onClose) onClose();
    if (dialog.open) dialog.close();
    dialog.remove();
  };
  dialog.addEventListener("keydown", trapTab);
  dialog.addEventListener("cancel", (event) => {
    event.preventDefault(); // Escape: close here, the same way as every other path
    close();
  });
  dialog.addEventListener("close", close);
  document.body.append(dialog);
  dialog.showModal();
  return { dialog, heading, body, close };
}

/** Ask before an irreversible action: resolves true when `confirmLabel` is pressed. */
export function confirmAction({ title, message, confirmLabel }) {
  return new Promise((resolve) => {
    let confirmed = false;
    const modal = openModal({ title, role: "alertdialog", className: "confirm", onClose: () => resolve(confirmed) });
    const messageId = uid("confirm-message");
    modal.dialog.setAttribute("aria-describedby", messageId);
    const cancel = h("button", { type: "button", onclick: () => modal.close() }, "Cancel");
    const confirm = h(
      "button",
      { type: "button", class: "danger", onclick: () => { confirmed = true; modal.close(); } },
      confirmLabel,
    );
    modal.body.append(h("p", { id: messageId }, message), h("div", { class: "actions" }, cancel, confirm));
    cancel.focus();
  });
}
