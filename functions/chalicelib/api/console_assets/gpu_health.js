// A node's GPU health: each GPU's state, why, and NVIDIA's recommended action; a latched fault
// gets a "Clear GPU fault" button (the agent re-checks the GPU before it takes work again).

import * as api from "./api.js";
import { h } from "./dom.js";
import { timeText } from "./format.js";

function held(gpu) {
  const marks = ["latched", "drained", "missing"].filter((name) => gpu[name]);
  if (gpu.recheck_pending) marks.push("re-check pending");
  return marks.join(", ") || "–";
}

function reasons(gpu) {
  if (!gpu.reasons.length) return "–";
  return gpu.reasons
    .map((reason) => `${reason.code}${reason.xid !== undefined ? ` (Xid ${reason.xid})` : ""}: ${reason.action} since ${timeText(reason.since)}`)
    .join("; ");
}

// ``onChanged(node)`` gets the node as the clear answered it.
export function gpuHealth(node, { onChanged, onError }) {
  const gpus = node.gpu_health || [];
  if (gpus.length === 0) return h("p", {}, "No GPU health: a CPU node, or an agent that does not report it.");

  async function clear(gpu, button) {
    button.disabled = true;
    try {
      const path = `admin/nodes/${encodeURIComponent(node.node_id)}/gpus/${encodeURIComponent(gpu.uuid)}/clear`;
      const { data } = await api.post(path, {});
      onChanged(data, `The fault of ${gpu.uuid} was cleared; the agent re-checks it at its next heartbeat.`);
    } catch (error) {
      button.disabled = false;
      onError(error);
    }
  }

  return h(
    "table",
    { class: "gpus" },
    h("caption", {}, "GPU health"),
    h("thead", {}, h("tr", {}, ["UUID", "State", "Takes work", "Held", "Reasons", ""].map((name) => h("th", { scope: "col" }, name)))),
    h(
      "tbody",
      {},
      gpus.map((gpu) =>
        h("tr", {}, [
          h("td", {}, gpu.uuid),
          h("td", {}, gpu.state),
          h("td", {}, gpu.schedulable ? "yes" : "no"),
          h("td", {}, held(gpu)),
          h("td", {}, reasons(gpu)),
          h(
            "td",
            {},
            gpu.latched
              ? h("button", { type: "button", "aria-label": `Clear GPU fault ${gpu.uuid}`, onclick: (event) => clear(gpu, event.currentTarget) }, "Clear GPU fault")
              : "",
          ),
        ]),
      ),
    ),
  );
}
