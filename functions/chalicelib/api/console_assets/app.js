// The console: sign in, then the Hardware page. No state outlives the page.

import * as api from "./api.js";
import { h } from "./dom.js";
import { showHardware } from "./hardware.js";
import { showSignIn } from "./signin.js";

const main = document.getElementById("main");
const session = document.getElementById("session");
let leave = null;

function signedOut(message) {
  if (leave) leave();
  leave = null;
  api.signOut();
  for (const dialog of document.querySelectorAll("dialog")) dialog.close();
  session.replaceChildren();
  showSignIn(main, { message, onSignedIn: signedIn });
}

function signedIn() {
  session.replaceChildren(h("button", { type: "button", class: "quiet", onclick: () => signedOut() }, "Sign out"));
  leave = showHardware(main);
}

api.onTokenRefused((error) => signedOut(error.message));
signedOut();
