// One work item in a dialog: its facts, every attempt's error, "Cancel work" while it can be
// cancelled, and for a succeeded OCR item the image with each line's box drawn over it and its
// text beside it. The bytes come from the admin API (…/input, …/result): presigned URLs are
// another origin, which the page's Content-Security-Policy does not let it fetch. The image is
// decoded with createImageBitmap and drawn on a canvas, so no image URL is needed at all.

import * as api from "./api.js";
import { confirmAction, openModal } from "./dialogs.js";
import { fill, h } from "./dom.js";
import { attemptsText, bytes, timeElement, yesNo } from "./format.js";

const CANCELLABLE = new Set(["queued", "leased"]);
export const BOX_COLOUR = "#d1242f";

function facts(item) {
  const rows = [
    ["Status", h("span", { class: `status status-${item.status}` }, item.status)],
    ["Capability", item.capability],
    ["Attempts", attemptsText(item)],
    ["Node", item.node_id || "–"],
    ["Created", timeElement(item.created_at)],
    ["Updated", timeElement(item.updated_at)],
    ["Lease expires", item.lease_expires_at ? timeElement(item.lease_expires_at) : "–"],
    ["Finished", item.finished_at ? timeElement(item.finished_at) : "–"],
    ["Input", `${bytes(item.input.size)}, sha256 ${item.input.sha256}`],
    ["Result", item.result ? `${bytes(item.result.size)}, sha256 ${item.result.sha256}` : "none yet"],
  ];
  return h("dl", { class: "facts" }, rows.map(([name, value]) => [h("dt", {}, name), h("dd", {}, value)]));
}

function errorsTable(item) {
  const errors = item.errors || [];
  if (errors.length === 0) return h("p", { class: "muted" }, "No attempt has failed.");
  return h(
    "div",
    { class: "table-scroll" },
    h(
      "table",
      { class: "errors" },
      h("caption", {}, "Errors, one per failed attempt"),
      h("thead", {}, h("tr", {}, ["Attempt", "Node", "Reason", "Retried", "At"].map((name) => h("th", { scope: "col" }, name)))),
      h(
        "tbody",
        {},
        errors.map((error) =>
          h(
            "tr",
            {},
            h("td", {}, `${error.attempt}${error.node_fault ? " (node fault)" : ""}`),
            h("td", { class: "mono" }, error.node_id || "–"),
            h("td", {}, error.reason),
            h("td", {}, yesNo(error.retryable)),
            h("td", {}, timeElement(error.at)),
          ),
        ),
      ),
    ),
  );
}

function fromBase64(text) {
  const binary = atob(text);
  const out = new Uint8Array(binary.length);
  for (let index = 0; index < binary.length; index += 1) out[index] = binary.charCodeAt(index);
  return out;
}

/** Draw `bitmap` on `canvas` and each line's 4-point box over it, numbered as the text list is. */
export function drawLines(canvas, bitmap, lines) {
  canvas.width = bitmap.width;
  canvas.height = bitmap.height;
  const context = canvas.getContext("2d");
  context.drawImage(bitmap, 0, 0);
  const width = Math.max(2, Math.round(bitmap.width / 400));
  context.lineWidth = width;
  context.strokeStyle = BOX_COLOUR;
  context.fillStyle = BOX_COLOUR;
  context.font = `${Math.max(12, width * 6)}px system-ui, sans-serif`;
  lines.forEach((line, index) => {
    const box = line.box || [];
    if (box.length === 0) return;
    context.beginPath();
    context.moveTo(box[0][0], box[0][1]);
    for (const [x, y] of box.slice(1)) context.lineTo(x, y);
    context.closePath();
    context.stroke();
    context.fillText(String(index + 1), box[0][0], Math.max(box[0][1] - width * 2, width * 6));
  });
}

async function ocrView(item) {
  const [input, result] = await Promise.all([
    api.get(`admin/work/${encodeURIComponent(item.work_id)}/input`),
    api.get(`admin/work/${encodeURIComponent(item.work_id)}/result`),
  ]);
  const lines = Array.isArray(result.data.lines) ? result.data.lines : [];
  const bitmap = await createImageBitmap(new Blob([fromBase64(input.data.image_base64)]));
  const canvas = h("canvas", { class: "ocr-image", role: "img", "aria-label": `The image, with ${lines.length} text line box(es) drawn over it` });
  drawLines(canvas, bitmap, lines);
  bitmap.close();
  const list = lines.length
    ? h(
        "ol",
        { class: "ocr-lines", "aria-label": "Text lines" },
        lines.map((line) => h("li", {}, h("span", { class: "ocr-text" }, line.text), " ", h("span", { class: "muted" }, `(score ${Number(line.score).toFixed(2)})`))),
      )
    : h("p", { class: "muted" }, "No text was found.");
  return h("div", { class: "ocr" }, h("div", { class: "ocr-figure" }, canvas), h("div", {}, h("h4", {}, "Text"), list));
}

async function resultView(item) {
  if (item.status !== "succeeded") return null;
  if (item.capability === "ocr") return ocrView(item);
  const result = await api.get(`admin/work/${encodeURIComponent(item.work_id)}/result`);
  return h("pre", { class: "block" }, JSON.stringify(result.data, null, 2));
}

/** Open the item's dialog; `onChanged` runs after a cancel (the list refreshes). */
export function openWorkDetail(workId, { onChanged } = {}) {
  const modal = openModal({ title: `Work ${workId}`, className: "wide work-detail" });
  const content = h("div", {}, h("p", { class: "muted" }, "Loading…"));
  const problem = h("p", { class: "error", role: "alert" });
  const close = h("button", { type: "button", onclick: () => modal.close() }, "Close");
  const actions = h("div", { class: "actions end" }, close);
  modal.body.append(problem, content, actions);
  close.focus();

  async function cancel() {
    const confirmed = await confirmAction({
      title: "Cancel work?",
      message: `Cancel ${workId}? A queued item is taken off the queue; a leased one is stopped on its node. This cannot be undone.`,
      confirmLabel: "Cancel work",
    });
    if (!confirmed) return;
    try {
      await api.post(`admin/work/${encodeURIComponent(workId)}/cancel`, {});
      if (onChanged) onChanged();
      await load();
    } catch (error) {
      if (error.code !== "signed_out") problem.textContent = `Could not cancel the work: ${error.message}`;
    }
  }

  async function load() {
    try {
      const item = (await api.get(`admin/work/${encodeURIComponent(workId)}`)).data;
      const sections = [facts(item), h("h3", {}, "Attempts and errors"), errorsTable(item)];
      fill(content, sections);
      fill(actions, CANCELLABLE.has(item.status) ? h("button", { type: "button", class: "danger", onclick: cancel }, "Cancel work") : null, close);
      const shown = await resultView(item).catch((error) => h("p", { class: "error" }, `Could not show the result: ${error.message}`));
      if (shown) content.append(h("h3", {}, "Result"), shown);
    } catch (error) {
      if (error.code !== "signed_out") problem.textContent = `Could not load the work: ${error.message}`;
    }
  }

  load();
  return modal;
}
