// The admin API of this origin. The admin token lives in this module's variable for the page's
// life and nowhere else: never in a URL, a storage, a cookie or a log. A reload asks again.

let adminToken = null;
const listeners = new Set();
// The API beside the console: /console/api.js -> /api/v1/ (under any stage prefix).
const API_BASE = new URL("../api/v1/", import.meta.url);
/**
 * Where this console's API lives, as a node's MODELFORGE_AGENT_CONTROL_PLANE_URL would name it:
 * the origin, plus the path prefix when the console is served under one (an API Gateway stage),
 * which the settings check then refuses (an agent's URL is an origin only).
 */
export const API_ORIGIN = new URL("../", import.meta.url).href.replace(/\/$/, "");

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

/** Keep `token` if the API accepts it; else throw the API's refusal (its message is shown). */
export async function signIn(token) {
  await request(token, "GET", "admin/nodes?limit=1");
  adminToken = token;
}

export function signOut() {
  adminToken = null;
}

export function isSignedIn() {
  return adminToken !== null;
}

/** `listener(error)` is called when the API refuses the admin token while signed in. */
export function onTokenRefused(listener) {
  listeners.add(listener);
  return () => listeners.delete(listener);
}

/** GET or POST `path` (relative to /api/v1/) with the admin token: `{ data, serverTime }`. */
export async function call(method, path, body) {
  if (adminToken === null) throw new ApiError(0, "signed_out", "Sign in first.");
  return request(adminToken, method, path, body);
}

async function request(token, method, path, body) {
  const headers = { Accept: "application/json", "X-ModelForge-Admin-Token": token };
  const init = { method, headers, cache: "no-store", credentials: "omit", redirect: "error", referrerPolicy: "no-referrer" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(new URL(path, API_BASE), init);
  } catch (error) {
    throw new ApiError(0, "unreachable", `The control plane did not answer (${error.message}).`);
  }
  const data = await response.json().catch(() => null);
  if (!response.ok) {
    const refused = data && data.error ? data.error : {};
    const error = new ApiError(response.status, refused.code || `http_${response.status}`, refused.message || `HTTP ${response.status}`);
    error.problems = refused.problems || [];
    if (token === adminToken && String(error.code).startsWith("admin_token_")) {
      for (const listener of listeners) listener(error);
    }
    throw error;
  }
  const date = Date.parse(response.headers.get("Date") || "");
  return { data, serverTime: Number.isNaN(date) ? Date.now() : date };
}

export const get = (path) => call("GET", path);
export const post = (path, body) => call("POST", path, body);
export const del = (path) => call("DELETE", path);

/** Every item of a paged list (`key` names the list in each page), at most `maxPages` pages. */
export async function getAll(path, key, maxPages = 20) {
  const items = [];
  let nextToken = null;
  let serverTime = Date.now();
  for (let page = 0; page < maxPages; page += 1) {
    const separator = path.includes("?") ? "&" : "?";
    const query = nextToken ? `${separator}next_token=${encodeURIComponent(nextToken)}` : "";
    const answer = await get(path + query);
    serverTime = answer.serverTime;
    items.push(...answer.data[key]);
    nextToken = answer.data.next_token;
    if (!nextToken) break;
  }
  return { items, serverTime };
}
