// The Work page: work items, filtered by status and capability, refreshed on their own like the
// Hardware page; an image submitted for `ocr`; a work id opens the item's detail (work_detail.js).

import * as api from "./api.js";
import { fill, h, uid } from "./dom.js";
import { attemptsText, timeElement, timeText } from "./format.js";
import { startRefreshing } from "./refresh.js";
import { openWorkDetail } from "./work_detail.js";

export const REFRESH_SECONDS = 5;
const STATES = ["queued", "leased", "succeeded", "dead", "cancelled"];
const CAPABILITIES = ["ocr", "diagnostic.echo", "diagnostic.sleep"];
const COLUMNS = ["Work ID", "Capability", "Status", "Attempts", "Node", "Created", "Finished"];
// the API takes a submission of at most 5 MiB: the image's base64 plus the JSON around it
const MAX_BODY_BYTES = 5 * 1024 * 1024;

/** Bytes as base64, in chunks (a whole image in one call would overflow the argument list). */
export function toBase64(bytes) {
  let binary = "";
  for (let start = 0; start < bytes.length; start += 0x8000) {
    binary += String.fromCharCode(...bytes.subarray(start, start + 0x8000));
  }
  return btoa(binary);
}

function labelled(label, control) {
  return h("div", { class: "field" }, h("label", { for: control.id }, label), control);
}

function selectOf(label, values) {
  const select = h("select", { id: uid("filter") }, h("option", { value: "" }, "All"), values.map((value) => h("option", { value }, value)));
  return { select, field: labelled(label, select) };
}

function row(item, open) {
  const id = h("button", { type: "button", class: "link mono", "data-work-id": item.work_id, onclick: () => open(item.work_id) }, item.work_id);
  return h(
    "tr",
    {},
    h("th", { scope: "row" }, id),
    h("td", {}, item.capability),
    h("td", {}, h("span", { class: `status status-${item.status}` }, item.status)),
    h("td", {}, attemptsText(item)),
    h("td", { class: "mono" }, item.node_id || "–"),
    h("td", {}, timeElement(item.created_at)),
    h("td", {}, item.finished_at ? timeElement(item.finished_at) : "–"),
  );
}

function submitForm(onSubmitted) {
  const image = h("input", { type: "file", id: uid("image"), accept: "image/png,image/jpeg" });
  const submit = h("button", { type: "submit", class: "primary" }, "Submit");
  const said = h("p", { class: "muted", role: "status" });
  const problem = h("p", { class: "error", role: "alert" });
  async function send(event) {
    event.preventDefault();
    problem.textContent = "";
    said.textContent = "";
    const file = image.files[0];
    if (!file) {
      problem.textContent = "Choose a PNG or JPEG image first.";
      return;
    }
    const encoded = toBase64(new Uint8Array(await file.arrayBuffer()));
    if (encoded.length + 200 > MAX_BODY_BYTES) {
      problem.textContent = `The image is too large: the API takes at most ${MAX_BODY_BYTES} bytes of base64 (about 3.7 MiB of image).`;
      return;
    }
    submit.disabled = true;
    try {
      const answer = await api.post("admin/work", { capability: "ocr", input: { image_base64: encoded } });
      said.textContent = `Submitted ${answer.data.work_id} (${answer.data.status}).`;
      image.value = "";
      onSubmitted(answer.data);
    } catch (error) {
      if (error.code !== "signed_out") problem.textContent = `Could not submit the image: ${error.message}`;
    } finally {
      submit.disabled = false;
    }
  }
  const form = h(
    "form",
    { class: "card submit-work", onsubmit: send },
    h("h2", {}, "Read the text of an image (ocr)"),
    labelled("Image", image),
    h("div", { class: "actions" }, submit),
    said,
    problem,
  );
  return form;
}

/** Show the page in `main`; returns the function that stops its refreshing. */
export function showWork(main) {
  const status = selectOf("Status", STATES);
  const capability = selectOf("Capability", CAPABILITIES);
  const body = h("tbody", {});
  const updated = h("p", { class: "muted" }, "Loading work…");
  const problem = h("p", { class: "error", role: "alert" });
  const table = h(
    "table",
    { class: "work" },
    h("caption", {}, "Work items, newest first"),
    h("thead", {}, h("tr", {}, COLUMNS.map((column) => h("th", { scope: "col" }, column)))),
    body,
  );

  function open(workId) {
    openWorkDetail(workId, { onChanged: refreshSoon });
  }

  function path() {
    const query = new URLSearchParams({ limit: "100" });
    if (status.select.value) query.set("status", status.select.value);
    if (capability.select.value) query.set("capability", capability.select.value);
    return `admin/work?${query}`;
  }

  async function load(isStopped) {
    try {
      const work = await api.getAll(path(), "work");
      if (isStopped()) return;
      const items = work.items.sort((a, b) => (a.created_at < b.created_at ? 1 : a.created_at > b.created_at ? -1 : 0));
      const focused = document.activeElement && document.activeElement.dataset ? document.activeElement.dataset.workId : undefined;
      if (items.length === 0) {
        fill(body, h("tr", {}, h("td", { colspan: COLUMNS.length, class: "empty" }, "No work matches: submit an image above.")));
      } else {
        fill(body, items.map((item) => row(item, open)));
      }
      if (focused) {
        const refocus = body.querySelector(`button[data-work-id="${focused}"]`);
        if (refocus) refocus.focus();
      }
      fill(updated, `${items.length} item(s), updated at ${timeText(Date.now())}; refreshes every ${REFRESH_SECONDS} s.`);
      problem.textContent = "";
    } catch (error) {
      if (isStopped() || error.code === "signed_out") return;
      problem.textContent = `Could not refresh the work: ${error.message}`;
    }
  }

  main.replaceChildren(
    h(
      "section",
      { class: "page" },
      h("div", { class: "page-head" }, h("h1", {}, "Work")),
      submitForm(refreshSoon),
      h("div", { class: "filters" }, status.field, capability.field),
      updated,
      problem,
      h("div", { class: "table-scroll" }, table),
    ),
  );
  document.title = "Work · ModelForge console";
  const refreshing = startRefreshing(REFRESH_SECONDS, load);
  function refreshSoon() {
    refreshing.soon();
  }
  status.select.addEventListener("change", refreshSoon);
  capability.select.addEventListener("change", refreshSoon);
  return refreshing.stop;
}
