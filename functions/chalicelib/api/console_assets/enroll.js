// The Enroll node wizard. The one-time token is held in this wizard's memory (`secret`) and
// shown in one field; closing the wizard, checking readiness, revoking the unused token or
// reaching its expiry clears it from the page. Nothing here writes it anywhere else.

import * as api from "./api.js";
import { openModal } from "./dialogs.js";
import { fill, h, uid } from "./dom.js";
import { clockTime, countdown } from "./format.js";
import { renderReadiness, verdictLine } from "./readiness.js";

/** What the wizard offers (modelforge_protocol.schemas.CONSOLE_ENROLLMENT_TTLS). */
export const EXPIRIES = [
  ["5 minutes", 300],
  ["15 minutes", 900],
  ["1 hour", 3600],
  ["24 hours", 86400],
];
const DEFAULT_EXPIRY = 900;
const ACCELERATOR_MODES = ["nvidia", "cpu", "auto"];
const STATE_VOLUME = "/var/lib/modelforge/agent-state";
/** The node's .env, written by the start command beside the repository's compose files (git-ignored). */
const ENV_FILE = ".env";
const HEREDOC = "MODELFORGE_ENV";
/** The agent image's user (scripts/_node_agent_compose.sh): it must own the state directory. */
const AGENT_UID = 65532;
/** The image sources (modelforge_protocol.schemas.IMAGE_SOURCES). */
const NO_CONTAINER = "no_container";
const WORKER_URL = "MODELFORGE_AGENT_WORKER_URL";
const RUNTIME_WORKER_UP =
  "docker compose -f docker-compose.yml -f docker-compose.runtime-worker.yml up -d --no-build --pull never runtime-worker";
/**
 * What a node costs a month on each API, US$, at the default 45 s heartbeat with the push channel:
 * bench/cost.py's model, the totals of bench/README.md's table [2] (a test compares them).
 */
export const NODE_MONTH_USD = { rest: "0.33", http: "0.18" };

function isLoopback(origin) {
  try {
    const host = new URL(origin).hostname.replace(/^\[|\]$/g, "");
    return host === "localhost" || host === "::1" || /^127\.\d+\.\d+\.\d+$/.test(host);
  } catch {
    return false;
  }
}

const EXECUTE_API_HOST = /\.execute-api\.[a-z0-9-]+\.amazonaws\.com$/;

/**
 * The node's API origin, locked to this console's: its API's URL when that is an origin (the local
 * stack, or a domain that maps the REST API at its root); the page's own origin when the API is
 * under a path on a custom domain (docs/DEPLOY.md's one domain: the console and admins under
 * /admin on the REST API, the node routes at the root on the HTTP API). At an execute-api URL the
 * stage path is kept, and the settings check refuses it with what to do (that host's root serves
 * nothing). `kind`: local, rest, http or stage.
 */
export function nodeOrigin(apiOrigin) {
  const url = new URL(apiOrigin);
  if (apiOrigin === url.origin) return { url: apiOrigin, kind: isLoopback(apiOrigin) ? "local" : "rest" };
  if (EXECUTE_API_HOST.test(url.hostname)) return { url: apiOrigin, kind: "stage" };
  return { url: url.origin, kind: "http" };
}

/** Which API a node enrolled here uses, and what a node-month costs there. */
export function nodeApiNote({ url, kind }) {
  const figures = "(a heartbeat every 45 s, the push channel included; bench/cost.py)";
  if (kind === "local") {
    return "Nodes use this local stack's one API, at this address; a local stack has no per-node cost.";
  }
  if (kind === "http") {
    return (
      `Nodes use ${url}, this domain's root, not the console's path: with the node routes mapped there to the HTTP API ` +
      `(docs/DEPLOY.md, one domain), about $${NODE_MONTH_USD.http} per node-month on the HTTP API ` +
      `(about $${NODE_MONTH_USD.rest} on the REST API) ${figures}.`
    );
  }
  if (kind === "stage") {
    return "This console is served under an API Gateway stage, which no node can use: open it through a custom domain (docs/DEPLOY.md).";
  }
  return (
    `Nodes use the REST API, which serves this console at this origin: about $${NODE_MONTH_USD.rest} per node-month ` +
    `on the REST API, against about $${NODE_MONTH_USD.http} on the HTTP API ${figures}. ` +
    "For the cheaper one, serve the console under /admin on a domain whose root maps the HTTP API (docs/DEPLOY.md, one domain)."
  );
}

function suggestHostname(displayName) {
  return displayName.trim().toLowerCase().replace(/[^a-z0-9._-]+/g, "_").replace(/^[^a-z0-9]+/, "").slice(0, 63);
}

function field(label, control, hint) {
  const hintId = hint ? uid("hint") : null;
  const problemId = uid("problem");
  if (!control.id) control.id = uid("field");
  control.setAttribute("aria-describedby", [hintId, problemId].filter(Boolean).join(" "));
  const problem = h("p", { id: problemId, class: "field-problem" });
  const wrapper = h(
    "div",
    { class: "field" },
    h("label", { for: control.id }, label),
    control,
    hint ? h("p", { id: hintId, class: "hint" }, hint) : null,
    problem,
  );
  return { wrapper, control, problem };
}

function radioGroup(legend, name, options, checkedValue, onchange) {
  const radios = options.map(([label, value]) => {
    const id = uid(name);
    const radio = h("input", { type: "radio", id, name, value, checked: value === checkedValue, onchange });
    return { radio, label: h("label", { class: "choice", for: id }, radio, ` ${label}`) };
  });
  // a radio group, as a screen reader announces it, named by its legend
  const legendId = uid("legend");
  const fieldset = h(
    "fieldset",
    { role: "radiogroup", "aria-labelledby": legendId },
    h("legend", { id: legendId }, legend),
    radios.map((entry) => entry.label),
  );
  return { fieldset, radios: radios.map((entry) => entry.radio) };
}

function block(title, text, copyLabel, note) {
  const headingId = uid("block");
  const pre = h("pre", { tabindex: "0", class: "block" }, text);
  const section = h(
    "section",
    { "aria-labelledby": headingId, class: "result-block" },
    h("h3", { id: headingId }, title),
    note ? h("p", { class: "hint" }, note) : null,
    pre,
  );
  return { section, pre, copyLabel };
}

export function envText(settings) {
  return settings.map(({ name, value }) => `${name}=${value}`).join("\n");
}

export function startCommand(settings, source) {
  const setting = (wanted) => settings.find(({ name }) => name === wanted);
  const stateVolume = setting("MODELFORGE_AGENT_STATE_VOLUME").value;
  const writeEnv = [
    `# This replaces ${ENV_FILE} there with the settings below; the script then asks for the token.`,
    `cat > ${ENV_FILE} <<'${HEREDOC}'`,
    envText(settings),
    HEREDOC,
  ];
  if (source === NO_CONTAINER) {
    return [
      "# In a Bash shell, from a checkout of the repository: with its .venv (scripts/dev-up makes it),",
      "# or with the agent's wheels installed (docs/NODES.md, Without containers).",
      "# Once, if the state directory does not exist yet (owned by the user that runs the agent):",
      `#   install -d -m 0700 ${stateVolume}`,
      ...writeEnv,
      "# The agent runs in the foreground (Ctrl-C stops it). To serve work, run the runtime worker",
      `# beside it and add ${WORKER_URL} to ${ENV_FILE} (docs/NODES.md, The runtime worker);`,
      "# without one, readiness says the node serves no work.",
      `bash scripts/node-agent-start.sh --no-container ${ENV_FILE}`,
    ].join("\n");
  }
  const worker = setting(WORKER_URL)
    ? ["# The runtime worker, which runs the work (the agent reaches it through a shared volume):", RUNTIME_WORKER_UP]
    : ["# A cpu node runs no runtime worker container (its Compose file reserves GPUs): readiness will", "# say the node serves no work."];
  return [
    "# In a Bash shell, from the node-agent repository (the folder with scripts/node-agent-start.sh).",
    "# Once, if the state directory does not exist yet:",
    `#   sudo install -d -m 0700 -o ${AGENT_UID} -g ${AGENT_UID} ${stateVolume}`,
    ...writeEnv,
    ...worker,
    `bash scripts/node-agent-start.sh ${ENV_FILE}`,
  ].join("\n");
}

export function recreationCommand(source) {
  if (source === NO_CONTAINER) {
    return [
      "# After the node has enrolled, from the same folder: stops the agent started above and runs it",
      "# again without the one-time token; the identity and credential stay in the state directory.",
      "# It is also the command for every later start.",
      `bash scripts/recreate-node-agent.sh --no-container ${ENV_FILE}`,
    ].join("\n");
  }
  return [
    "# After the node has enrolled, from the same folder: the container is recreated without the",
    "# one-time token; the identity and credential stay in the state directory.",
    `bash scripts/recreate-node-agent.sh ${ENV_FILE}`,
  ].join("\n");
}

export function openEnrollWizard({ onClosed }) {
  // The one-time token: here, in the field that shows it, and nowhere else.
  let secret = null;
  let tick = null;
  let enrollment = null;
  let tokenArea = null;
  /** "Revoke unused token": taken off the page once the token is used (or revoked). */
  let revoke = null;

  const modal = openModal({
    title: "Enroll node",
    className: "wizard",
    onClose: () => {
      clearSecret(null);
      if (onClosed) onClosed();
    },
  });
  const problems = h("div", { class: "error", role: "alert" });
  const status = h("p", { class: "muted", role: "status" });

  // --- step 1: the choices ---------------------------------------------------------------
  const displayName = field("Display name", h("input", { type: "text", required: true, maxlength: "128", autocomplete: "off" }));
  let hostnameEdited = false;
  const hostname = field(
    "Hostname",
    h("input", { type: "text", required: true, maxlength: "253", autocomplete: "off", spellcheck: "false", oninput: () => { hostnameEdited = true; } }),
    "The node's name as the agent reports it (MODELFORGE_AGENT_HOSTNAME).",
  );
  displayName.control.addEventListener("input", () => {
    if (!hostnameEdited) hostname.control.value = suggestHostname(displayName.control.value);
  });
  const expiry = radioGroup("Token expiry", uid("expiry"), EXPIRIES.map(([label, seconds]) => [label, String(seconds)]), String(DEFAULT_EXPIRY));
  const eligibleId = uid("eligible");
  const eligible = h(
    "div",
    { class: "field" },
    h("label", { class: "choice", for: eligibleId }, h("input", { type: "checkbox", id: eligibleId, disabled: true }), " Production eligible"),
    h("p", { class: "hint" }, "production_eligible=false: release-candidate enrollments are never production eligible."),
  );
  const nodeApi = nodeOrigin(api.API_ORIGIN);
  const origin = field(
    "API origin",
    h("input", { type: "text", readonly: true, value: nodeApi.url, spellcheck: "false" }),
    `The node reaches this control plane here (MODELFORGE_AGENT_CONTROL_PLANE_URL); locked to this console's origin. ${nodeApiNote(nodeApi)}`,
  );
  const accelerator = field(
    "Accelerator mode",
    h("select", {}, ACCELERATOR_MODES.map((mode) => h("option", { value: mode }, mode))),
    "nvidia: NVML and at least one GPU are required; cpu: a node without NVIDIA GPUs; auto: NVML only when NVIDIA devices are seen.",
  );
  const stateVolume = field(
    "State volume",
    h("input", { type: "text", required: true, value: STATE_VOLUME, spellcheck: "false", autocomplete: "off" }),
    "A durable directory on the node that keeps its identity and credential (on Unraid, under appdata).",
  );
  const manifestEntry = field(
    "Release manifest entry",
    h("textarea", { rows: "7", spellcheck: "false", autocomplete: "off" }),
    "On the node: verify the release bundle against its SHA256SUMS (modelforge release verify), load modelforge-<release>-images.tar with docker image load, then paste images.modelforge-node-agent from the matching release manifest here. The image/config ID is not checked: docker load may rewrite it.",
  );
  const imageReference = field(
    "Image reference",
    h("input", { type: "text", spellcheck: "false", autocomplete: "off", placeholder: "registry.example.com/modelforge-node-agent@sha256:…" }),
    "A registry image pinned by digest: name@sha256:<64 hex>. A tag alone is refused.",
  );
  const imageSource = radioGroup(
    "Image source",
    uid("image-source"),
    [["Local release bundle", "release_bundle"], ["Registry image", "registry"], ["No container", NO_CONTAINER]],
    "release_bundle",
    () => showImageSource(),
  );
  function chosen(group) {
    return group.radios.find((radio) => radio.checked).value;
  }
  function showImageSource() {
    const source = chosen(imageSource);
    manifestEntry.wrapper.hidden = source !== "release_bundle";
    imageReference.wrapper.hidden = source !== "registry";
  }
  showImageSource();

  const fields = {
    hostname,
    state_volume: stateVolume,
    manifest_entry: manifestEntry,
    image_reference: imageReference,
    control_plane_url: origin,
    accelerator_mode: accelerator,
  };
  const create = h("button", { type: "submit", class: "primary" }, "Create enrollment token");
  const form = h(
    "form",
    { novalidate: true, onsubmit: submit },
    displayName.wrapper,
    expiry.fieldset,
    eligible,
    origin.wrapper,
    hostname.wrapper,
    accelerator.wrapper,
    stateVolume.wrapper,
    imageSource.fieldset,
    manifestEntry.wrapper,
    imageReference.wrapper,
    h("div", { class: "actions" }, create),
  );
  const content = h("div", {}, form);
  const close = h("button", { type: "button", onclick: () => modal.close() }, "Close");
  modal.body.append(problems, status, content, h("div", { class: "actions end" }, close));
  displayName.control.focus();

  function showProblems(list) {
    for (const entry of Object.values(fields)) {
      entry.problem.textContent = "";
      entry.control.removeAttribute("aria-invalid");
    }
    if (list.length === 0) {
      problems.replaceChildren();
      return;
    }
    const items = list.map((problem) => {
      const entry = fields[problem.field];
      const label = entry ? entry.wrapper.querySelector("label").textContent : problem.field;
      if (entry) {
        entry.control.setAttribute("aria-invalid", "true");
        entry.problem.append(h("span", {}, problem.message), " ");
      }
      return h("li", {}, `${label}: ${problem.message}`);
    });
    fill(problems, h("p", {}, "Nothing was created. Fix these first:"), h("ul", {}, items));
    const first = list.map((problem) => fields[problem.field]).find(Boolean);
    if (first) first.control.focus();
  }

  async function submit(event) {
    event.preventDefault();
    const name = displayName.control.value.trim();
    if (!name) {
      showProblems([]);
      fill(problems, h("p", {}, "Display name: give the node a name (1 to 128 characters)."));
      displayName.control.setAttribute("aria-invalid", "true");
      displayName.control.focus();
      return;
    }
    displayName.control.removeAttribute("aria-invalid");
    create.disabled = true;
    status.textContent = "Checking the settings…";
    try {
      const source = chosen(imageSource);
      const body = {
        // locked: this console's own origin, never the field's (a text field drops line breaks)
        control_plane_url: nodeApi.url,
        hostname: hostname.control.value,
        accelerator_mode: accelerator.control.value,
        state_volume: stateVolume.control.value,
        image_source: chosen(imageSource),
      };
      if (source === "registry") body.image_reference = imageReference.control.value;
      else if (source === "release_bundle") body.manifest_entry = manifestEntry.control.value;
      const checked = (await api.post("admin/node-agent-settings/check", body)).data;
      if (!checked.ok) {
        status.textContent = "";
        showProblems(checked.problems);
        return;
      }
      showProblems([]);
      status.textContent = "Creating the enrollment token…";
      const minted = (await api.post("admin/node-enrollments", {
        display_name: name,
        expires_in_seconds: Number(chosen(expiry)),
        production_eligible: false,
      })).data;
      const { token, ...record } = minted;
      secret = token;
      enrollment = record;
      showResult(checked.settings, source);
    } catch (error) {
      status.textContent = "";
      fill(problems, h("p", {}, error.message));
    } finally {
      create.disabled = false;
    }
  }

  // --- step 2: the reveal, the settings and the commands ---------------------------------
  const verdict = verdictLine();
  const readinessDetails = h("div", {});

  function showResult(settings, source) {
    const expiresMs = Date.parse(enrollment.expires_at);
    // the token's lifetime as the API set it, counted on this browser's clock (immune to skew)
    const deadline = Date.now() + (expiresMs - Date.parse(enrollment.created_at));
    const tokenField = h("input", { type: "text", readonly: true, spellcheck: "false", autocomplete: "off", class: "token", value: secret });
    const tokenId = uid("token");
    tokenField.id = tokenId;
    const remaining = h("span", { role: "timer", class: "countdown" }, countdown(deadline - Date.now()));
    const copy = h("button", { type: "button", onclick: copySecret }, "Copy token");
    tokenArea = h(
      "section",
      { class: "token-area", "aria-labelledby": `${tokenId}-heading` },
      h("h3", { id: `${tokenId}-heading` }, "Enrollment token"),
      h("p", { class: "hint" }, "Shown once: the control plane keeps only its SHA-256. It is cleared from this page when you close the wizard, check readiness, revoke it, or when it expires."),
      h("div", { class: "field" }, h("label", { for: tokenId }, "One-time token"), h("div", { class: "token-row" }, tokenField, copy)),
      h("p", {}, "Expires in ", remaining, ` (at ${clockTime(expiresMs)}, this browser's clock).`),
    );
    tick = setInterval(() => {
      const left = deadline - Date.now();
      if (left <= 0) clearSecret("it expired; to enroll a node, close the wizard and open it again for a new token");
      else remaining.textContent = countdown(left);
    }, 1000);

    const blocks = [
      block("Generated .env", envText(settings), "Copy .env", `Non-secret settings only: the token is never in this file. The start command below writes it as ${ENV_FILE}.`),
      block("Start command", startCommand(settings, source), "Copy start command", source === NO_CONTAINER
        ? "Paste into a Bash shell from a checkout. scripts/node-agent-start.sh --no-container turns shell tracing off, asks for the token without echo, hands it to the agent process in a temporary mode-0600 env file that it removes on every exit, and runs the agent instead of Compose."
        : "Paste into a Bash shell from the node-agent repository. scripts/node-agent-start.sh turns shell tracing off, asks for the token without echo, passes it in a temporary mode-0600 env file that it removes on every exit, and starts with --no-build --pull never."),
      source === NO_CONTAINER
        ? block("Recreation command", recreationCommand(source), "Copy recreation command", "After the enrollment is consumed: restarts the agent process without the one-time token in its environment, keeping the node's persisted identity and credential.")
        : block("Container recreation command", recreationCommand(source), "Copy container recreation command", "After the enrollment is consumed: recreates the container without the one-time token in its environment, keeping the node's persisted identity and credential."),
    ];
    const readinessButton = h("button", { type: "button", class: "primary", onclick: checkReadiness }, "Check node readiness");
    revoke = h("button", { type: "button", class: "danger", onclick: revokeUnused }, "Revoke unused token");
    fill(
      content,
      h(
        "p",
        {},
        `Enrollment ${enrollment.enrollment_id} for "${enrollment.display_name}" created; production_eligible=${enrollment.production_eligible}.`,
      ),
      tokenArea,
      blocks.map((entry) => [entry.section, h("div", { class: "actions" }, h("button", { type: "button", onclick: () => copyText(entry.pre.textContent, entry.copyLabel) }, entry.copyLabel))]),
      h("div", { class: "actions" }, readinessButton, revoke),
      h("section", { class: "readiness", "aria-labelledby": `${tokenId}-ready` }, h("h3", { id: `${tokenId}-ready` }, "Node readiness"), verdict, readinessDetails),
    );
    status.textContent = "";
    tokenField.focus();
    tokenField.select();
  }

  async function copyText(text, what) {
    try {
      await navigator.clipboard.writeText(text);
      status.textContent = `${what.replace(/^Copy /, "")} copied to the clipboard.`;
    } catch (error) {
      status.textContent = `Could not copy (${error.message}): select the text and copy it.`;
    }
  }

  function copySecret() {
    // read from memory at the moment of the click: the button carries nothing
    if (secret !== null) copyText(secret, "Copy token");
  }

  /** Forget the token and take it off the page; `why` says so in its place (null: closing). */
  function clearSecret(why) {
    secret = null;
    if (tick !== null) clearInterval(tick);
    tick = null;
    if (tokenArea === null) return;
    const hadFocus = tokenArea.contains(document.activeElement);
    for (const input of tokenArea.querySelectorAll("input")) input.value = "";
    if (why === null) {
      tokenArea.remove();
      tokenArea = null;
      return;
    }
    const notice = h("p", { class: "cleared", tabindex: "-1" }, `The one-time token is no longer shown: ${why}.`);
    fill(tokenArea, h("h3", {}, "Enrollment token"), notice);
    tokenArea.removeAttribute("aria-labelledby");
    tokenArea = null;
    if (hadFocus) notice.focus();
  }

  async function checkReadiness(event) {
    const button = event.currentTarget;
    clearSecret("you checked readiness");
    button.disabled = true;
    problems.replaceChildren();
    try {
      const record = (await api.get(`admin/node-enrollments/${encodeURIComponent(enrollment.enrollment_id)}`)).data;
      if (record.status !== "pending") dropRevoke();
      // the exact node this enrollment record names; before any node used it, the record's own
      // readiness says so (no node id yet)
      const target = record.node_id || record.enrollment_id;
      const result = (await api.get(`admin/nodes/${encodeURIComponent(target)}/readiness`)).data;
      renderReadiness(verdict, readinessDetails, result);
    } catch (error) {
      fill(problems, h("p", {}, error.message));
    } finally {
      button.disabled = false;
      button.focus();
    }
  }

  async function revokeUnused(event) {
    const button = event.currentTarget;
    clearSecret("you revoked it");
    button.disabled = true;
    problems.replaceChildren();
    try {
      const revoked = (await api.post(`admin/node-enrollments/${encodeURIComponent(enrollment.enrollment_id)}/revoke`, {})).data;
      status.textContent = `Enrollment ${revoked.enrollment_id} is ${revoked.status}: its token can no longer enroll a node.`;
      dropRevoke();
    } catch (error) {
      fill(problems, h("p", {}, error.message));
      if (error.code === "enrollment_consumed") dropRevoke();
      else button.disabled = false;
    }
  }

  /** The token can no longer be revoked (a node used it, or it is revoked): no button offers it. */
  function dropRevoke() {
    if (revoke === null) return;
    const hadFocus = revoke === document.activeElement;
    revoke.remove();
    revoke = null;
    if (hadFocus) content.querySelector("button.primary")?.focus();
  }

  return modal;
}
