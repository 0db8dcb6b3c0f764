// The console: sign in, then the Hardware or the Work page (links in the top bar that switch the
// page in place: no navigation, no history entry, nothing in the URL). No state outlives the page.

import * as api from "./api.js";
import { h } from "./dom.js";
import { showHardware } from "./hardware.js";
import { showSignIn } from "./signin.js";
import { showWork } from "./work.js";

const main = document.getElementById("main");
const session = document.getElementById("session");
const nav = document.getElementById("pages");
const PAGES = { hardware: ["Hardware", showHardware], work: ["Work", showWork] };
let leave = null;
let current = "hardware";

function show(name) {
  if (!api.isSignedIn()) return;
  if (leave) leave();
  current = name;
  nav.replaceChildren(
    ...Object.entries(PAGES).map(([key, [label]]) =>
      h("a", { href: `#${key}`, "aria-current": key === name ? "page" : undefined, onclick: (event) => {
        event.preventDefault();
        show(key);
      } }, label),
    ),
  );
  leave = PAGES[name][1](main);
}

function signedOut(message) {
  if (leave) leave();
  leave = null;
  api.signOut();
  for (const dialog of document.querySelectorAll("dialog")) dialog.close();
  session.replaceChildren();
  nav.replaceChildren();
  showSignIn(main, { message, onSignedIn: signedIn });
}

function signedIn() {
  session.replaceChildren(h("button", { type: "button", class: "quiet", onclick: () => signedOut() }, "Sign out"));
  show(current);
}

api.onTokenRefused((error) => signedOut(error.message));
signedOut();
