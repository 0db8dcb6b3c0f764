// The Hardware page: every node with its liveness, GPUs and latest telemetry, refreshed on its
// own; a row opens the node's detail; "Enroll node" opens the wizard.

import * as api from "./api.js";
import { fill, h } from "./dom.js";
import { openEnrollWizard } from "./enroll.js";
import { ageElement, bytes, channelText, timeText, yesNo } from "./format.js";
import { openNodeDetail } from "./node_detail.js";
import { startRefreshing } from "./refresh.js";

export const REFRESH_SECONDS = 5;
const COLUMNS = [
  "Name", "Node ID", "Status", "Last heartbeat", "GPUs", "GPU telemetry", "Production eligible",
  "Agent", "Protocol", "Duplicate identity", "Capabilities", "Current job", "Channel",
];

function gpuNames(node) {
  const gpus = (node.inventory && node.inventory.gpus) || [];
  if (gpus.length === 0) return "none";
  const counts = new Map();
  for (const gpu of gpus) counts.set(gpu.name, (counts.get(gpu.name) || 0) + 1);
  return `${gpus.length}: ${[...counts].map(([name, count]) => (count > 1 ? `${count} × ${name}` : name)).join(", ")}`;
}

function telemetryList(node) {
  const gpus = (node.telemetry && node.telemetry.gpus) || [];
  if (gpus.length === 0) return "none";
  return h(
    "ul",
    { class: "plain" },
    gpus.map((gpu) =>
      h(
        "li",
        {},
        `GPU ${gpu.index}: ${gpu.utilization_percent}% · ${bytes(gpu.memory_used_bytes)} / ${bytes(gpu.memory_total_bytes)} · ${gpu.temperature_celsius} °C`,
      ),
    ),
  );
}

function currentJob(jobs) {
  if (!jobs || jobs.length === 0) return "none";
  return h("ul", { class: "plain" }, jobs.map((job) => h("li", {}, `${job.capability} ${job.work_id} (attempt ${job.attempts})`)));
}

function statusCell(status) {
  return h("td", {}, h("span", { class: `status status-${status}` }, status));
}

function row(node, jobs, serverTime, open) {
  const name = h("button", { type: "button", class: "link", "data-node-id": node.node_id, onclick: () => open(node) }, node.display_name);
  const duplicates = node.duplicate_suspected.length ? `suspected: ${node.duplicate_suspected.join(", ")}` : "none";
  const tr = h(
    "tr",
    { class: "node-row" },
    h("th", { scope: "row" }, name),
    h("td", { class: "mono" }, node.node_id),
    statusCell(node.status),
    h("td", {}, ageElement(node.last_heartbeat_at, serverTime)),
    h("td", {}, gpuNames(node)),
    h("td", {}, telemetryList(node)),
    h("td", {}, yesNo(node.production_eligible)),
    h("td", {}, node.agent_version),
    h("td", {}, `${node.protocol_version} (${node.protocol_verdict})`),
    h("td", { class: node.duplicate_suspected.length ? "warn" : "" }, duplicates),
    h("td", {}, ((node.inventory && node.inventory.capabilities) || []).join(", ") || "none"),
    h("td", {}, currentJob(jobs)),
    h("td", {}, channelText(node)),
  );
  tr.addEventListener("click", (event) => {
    if (!event.target.closest("button")) open(node);
  });
  return tr;
}

/** Show the page in `main`; returns the function that stops its refreshing. */
export function showHardware(main) {
  const body = h("tbody", {});
  const updated = h("p", { class: "muted" }, "Loading nodes…");
  const problem = h("p", { class: "error", role: "alert" });
  const enroll = h("button", { type: "button", class: "primary", onclick: () => openEnrollWizard({ onClosed: refreshSoon }) }, "Enroll node");
  const table = h(
    "table",
    { class: "nodes" },
    h("caption", {}, "Nodes"),
    h("thead", {}, h("tr", {}, COLUMNS.map((column) => h("th", { scope: "col" }, column)))),
    body,
  );

  function open(node) {
    openNodeDetail(node.node_id, { onClosed: refreshSoon });
  }

  async function load(isStopped) {
    try {
      const [nodes, leased] = await Promise.all([
        api.getAll("admin/nodes?limit=100", "nodes"),
        api.get("admin/work?status=leased&limit=100"),
      ]);
      if (isStopped()) return;
      const jobs = new Map();
      for (const item of leased.data.work) {
        if (!jobs.has(item.node_id)) jobs.set(item.node_id, []);
        jobs.get(item.node_id).push(item);
      }
      const focused = document.activeElement && document.activeElement.dataset ? document.activeElement.dataset.nodeId : undefined;
      if (nodes.items.length === 0) {
        fill(body, h("tr", {}, h("td", { colspan: COLUMNS.length, class: "empty" }, "No nodes yet: use Enroll node to add one.")));
      } else {
        fill(body, nodes.items.map((node) => row(node, jobs.get(node.node_id), nodes.serverTime, open)));
      }
      if (focused) {
        const refocus = body.querySelector(`button[data-node-id="${focused}"]`);
        if (refocus) refocus.focus();
      }
      fill(updated, `${nodes.items.length} node(s), updated at ${timeText(Date.now())}; refreshes every ${REFRESH_SECONDS} s.`);
      problem.textContent = "";
    } catch (error) {
      if (isStopped() || error.code === "signed_out") return;
      problem.textContent = `Could not refresh the nodes: ${error.message}`;
    }
  }

  main.replaceChildren(
    h(
      "section",
      { class: "page" },
      h("div", { class: "page-head" }, h("h1", {}, "Hardware"), enroll),
      updated,
      problem,
      h("div", { class: "table-scroll" }, table),
    ),
  );
  document.title = "Hardware · ModelForge console";
  const refreshing = startRefreshing(REFRESH_SECONDS, load);
  function refreshSoon() {
    refreshing.soon();
  }
  return refreshing.stop;
}
