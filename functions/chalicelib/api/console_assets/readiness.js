// A readiness answer on the page: "Ready" only when every check passes, each check with its
// result as text, its detail and its next step.

import { fill, h } from "./dom.js";
import { timeText } from "./format.js";

const CHECK_NAMES = {
  connection: "Connection",
  inventory_age: "Inventory age",
  protocol_compatibility: "Protocol compatibility",
  agent_health: "Agent health",
  telemetry_age: "Telemetry age",
  identity_unique: "Identity unique",
  worker: "Runtime worker",
};

/** The verdict line: a live status named "Readiness", so a screen reader hears the change. */
export function verdictLine() {
  return h("p", { class: "verdict", role: "status", "aria-label": "Readiness" });
}

export function renderReadiness(verdict, details, result) {
  const ready = result.ready === true && result.checks.every((check) => check.ok);
  verdict.className = `verdict ${ready ? "ready" : "not-ready"}`;
  fill(verdict, ready ? "Ready" : "Not ready");
  const rows = result.checks.map((check) =>
    h(
      "tr",
      {},
      h("th", { scope: "row" }, CHECK_NAMES[check.name] || check.name),
      h("td", { class: check.ok ? "pass" : "fail" }, check.ok ? "Pass" : "Fail"),
      h("td", {}, check.detail),
      h("td", {}, check.next_step || "–"),
    ),
  );
  const where = result.node_id
    ? `Node ${result.node_id}${result.status ? ` (${result.status})` : ""}, checked at ${timeText(result.checked_at)}.`
    : `Enrollment ${result.enrollment_id}: no node has enrolled with it yet.`;
  fill(
    details,
    h("p", { class: "muted" }, where),
    h(
      "table",
      { class: "checks" },
      h("caption", {}, "Readiness checks"),
      h("thead", {}, h("tr", {}, ["Check", "Result", "Detail", "Next step"].map((name) => h("th", { scope: "col" }, name)))),
      h("tbody", {}, rows),
    ),
  );
  return ready;
}
