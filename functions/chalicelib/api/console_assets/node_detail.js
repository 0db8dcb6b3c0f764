// A node's detail: identity, inventory, GPU health, readiness, revoking its credential and deleting the node
// (each confirmed first).

import * as api from "./api.js";
import { confirmAction, openModal } from "./dialogs.js";
import { fill, h } from "./dom.js";
import { gpuHealth } from "./gpu_health.js";
import { bytes, channelText, slotsText, timeElement, timeText, yesNo } from "./format.js";
import { renderReadiness, verdictLine } from "./readiness.js";

function facts(pairs) {
  return h("dl", { class: "facts" }, pairs.map(([name, value]) => [h("dt", {}, name), h("dd", {}, value ?? "–")]));
}

function summary(node) {
  const credential = node.credential.revoked_at
    ? `${node.credential.state} (revoked at ${timeText(node.credential.revoked_at)})`
    : `${node.credential.state} (issued at ${timeText(node.credential.issued_at)})`;
  return facts([
    ["Node ID", node.node_id],
    ["Hostname", node.hostname],
    ["Status", node.status],
    ["Last heartbeat", timeElement(node.last_heartbeat_at)],
    ["Accelerator mode", node.accelerator_mode],
    ["Production eligible", yesNo(node.production_eligible)],
    ["Agent version", node.agent_version],
    ["Protocol", `${node.protocol_version} (${node.protocol_verdict})`],
    ["Credential", credential],
    ["Health", node.health ? `${node.health.status}${node.health.detail ? `: ${node.health.detail}` : ""}` : "not reported"],
    ["Duplicate identity", duplicateText(node)],
    ["Push channel", channelText(node)],
    ["Job slots", slotsText(node)],
    ["Drained", node.drained ? "yes: it takes no new work" : "no"],
    ["Simulated", node.simulated ? "yes: its GPUs come from an NVML simulation, not hardware" : "no"],
    ["Enrollment", node.enrollment_id],
    ["Enrolled at", timeElement(node.created_at)],
  ]);
}

function duplicateText(node) {
  const parts = [];
  if (node.duplicate_suspected.length) parts.push(`suspected: ${node.duplicate_suspected.join(", ")}`);
  if (node.duplicate_agent_instances_at) {
    parts.push(`two agents heartbeat with this identity (last ${timeText(node.duplicate_agent_instances_at)}): stop the extra agent`);
  }
  return parts.length ? parts.join("; ") : "none";
}

function inventory(node) {
  const inv = node.inventory;
  if (!inv) return h("p", {}, "No inventory has been received.");
  const gpus = inv.gpus || [];
  return [
    facts([
      ["CPU", inv.cpu ? `${inv.cpu.model}, ${inv.cpu.logical_cores} logical cores` : "–"],
      ["Memory", bytes(inv.memory_total_bytes)],
      ["Capabilities", (inv.capabilities || []).join(", ") || "none"],
      ["Reported at", timeElement(inv.updated_at)],
    ]),
    gpus.length === 0
      ? h("p", {}, "No GPUs.")
      : h(
          "table",
          { class: "gpus" },
          h("caption", {}, "GPUs"),
          h("thead", {}, h("tr", {}, ["Index", "Name", "UUID", "Memory", "Driver", "CUDA"].map((name) => h("th", { scope: "col" }, name)))),
          h(
            "tbody",
            {},
            gpus.map((gpu) =>
              h("tr", {}, [gpu.index, gpu.name, gpu.uuid, bytes(gpu.memory_total_bytes), gpu.driver_version, gpu.cuda_version].map((value) => h("td", {}, value))),
            ),
          ),
        ),
  ];
}

export function openNodeDetail(nodeId, { onClosed }) {
  const modal = openModal({ title: `Node ${nodeId}`, className: "wide", onClose: onClosed });
  const message = h("p", { role: "status", class: "muted" }, "Loading…");
  const problem = h("p", { class: "error", role: "alert" });
  const content = h("div", {});
  const verdict = verdictLine();
  const details = h("div", {});
  const close = h("button", { type: "button", onclick: () => modal.close() }, "Close");
  modal.body.append(message, problem, content, h("div", { class: "actions end" }, close));
  close.focus();

  async function checkReadiness(button) {
    button.disabled = true;
    try {
      const { data } = await api.get(`admin/nodes/${encodeURIComponent(nodeId)}/readiness`);
      renderReadiness(verdict, details, data);
      problem.textContent = "";
    } catch (error) {
      problem.textContent = error.message;
    } finally {
      button.disabled = false;
    }
  }

  async function revoke(node, button) {
    const confirmed = await confirmAction({
      title: "Revoke credential?",
      message: `${node.display_name} (${node.node_id}) can no longer report or take work with its credential; it must be enrolled again with a new token.`,
      confirmLabel: "Revoke credential",
    });
    if (!confirmed) {
      button.focus();
      return;
    }
    try {
      const { data } = await api.post(`admin/nodes/${encodeURIComponent(nodeId)}/revoke-credential`, {});
      show(data);
      message.textContent = "The credential was revoked.";
    } catch (error) {
      problem.textContent = error.message;
    }
    close.focus();
  }

  async function remove(node, button) {
    const confirmed = await confirmAction({
      title: "Delete node?",
      message: `${node.display_name} (${node.node_id}) and everything of it (inventory, GPU claims and state, duplicate flags, enrollment record) are removed; its leased work goes back to the queue. To bring the host back, enroll it again.`,
      confirmLabel: "Delete node",
    });
    if (!confirmed) {
      button.focus();
      return;
    }
    try {
      await api.del(`admin/nodes/${encodeURIComponent(nodeId)}`);
      modal.close();
    } catch (error) {
      problem.textContent = error.message;
      close.focus();
    }
  }

  function show(node) {
    modal.heading.textContent = `Node ${node.display_name}`;
    const readiness = h("button", { type: "button", onclick: (event) => checkReadiness(event.currentTarget) }, "Check readiness");
    const revokeButton = h(
      "button",
      { type: "button", class: "danger", disabled: node.credential.state !== "active", onclick: (event) => revoke(node, event.currentTarget) },
      "Revoke credential",
    );
    // the API removes a node whose credential is revoked or that is offline, and refuses any other
    const removable = node.credential.state === "revoked" || node.status === "offline";
    const deleteButton = h(
      "button",
      { type: "button", class: "danger", disabled: !removable, onclick: (event) => remove(node, event.currentTarget) },
      "Delete node",
    );
    fill(
      content,
      summary(node),
      h("h3", {}, "Inventory"),
      inventory(node),
      h("h3", {}, "GPU health"),
      gpuHealth(node, {
        onChanged: (changed, text) => {
          show(changed);
          message.textContent = text;
        },
        onError: (error) => {
          problem.textContent = error.message;
        },
      }),
      h("h3", {}, "Readiness"),
      h("div", { class: "actions" }, readiness),
      verdict,
      details,
      h("h3", {}, "Credential"),
      h("p", {}, "Revoking the credential stops this node at once; to bring it back, enroll it again."),
      h("div", { class: "actions" }, revokeButton),
      h("h3", {}, "Delete"),
      h(
        "p",
        {},
        removable
          ? "Deleting removes the node and everything of it; its leased work goes back to the queue."
          : "A node can be deleted once its credential is revoked or it is offline.",
      ),
      h("div", { class: "actions" }, deleteButton),
    );
  }

  api
    .get(`admin/nodes/${encodeURIComponent(nodeId)}`)
    .then(({ data }) => {
      message.textContent = "";
      show(data);
    })
    .catch((error) => {
      message.textContent = "";
      problem.textContent = error.message;
    });
  return modal;
}
