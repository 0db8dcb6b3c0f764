// How values read on the page.

import { h } from "./dom.js";

export function age(seconds) {
  if (seconds === null || seconds === undefined || Number.isNaN(seconds)) return "never";
  const s = Math.max(0, Math.round(seconds));
  if (s < 90) return `${s} s ago`;
  if (s < 90 * 60) return `${Math.round(s / 60)} min ago`;
  if (s < 36 * 3600) return `${Math.round(s / 3600)} h ago`;
  return `${Math.round(s / 86400)} d ago`;
}

/** Seconds from `iso` to `nowMs` (the server's clock when known). */
export function secondsSince(iso, nowMs) {
  if (!iso) return null;
  return (nowMs - Date.parse(iso)) / 1000;
}

export function bytes(count) {
  if (count === null || count === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = count;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${value.toFixed(unit === 0 ? 0 : 1)} ${units[unit]}`;
}

export function countdown(milliseconds) {
  const total = Math.max(0, Math.ceil(milliseconds / 1000));
  const hours = Math.floor(total / 3600);
  const minutes = Math.floor((total % 3600) / 60);
  const seconds = String(total % 60).padStart(2, "0");
  return hours ? `${hours}:${String(minutes).padStart(2, "0")}:${seconds}` : `${minutes}:${seconds}`;
}

/**
 * The one way the console writes a moment: "2026-12-02 15:51:22 UTC", from an ISO string (as the
 * API gives times) or milliseconds; "–" for none. UTC, as the API and the CLI write times.
 */
export function timeText(value) {
  if (value === null || value === undefined || value === "") return "–";
  const ms = typeof value === "number" ? value : Date.parse(value);
  if (Number.isNaN(ms)) return String(value);
  return `${new Date(ms).toISOString().slice(0, 19).replace("T", " ")} UTC`;
}

/** A moment as a <time> element reading `timeText`; "never" for none. */
export function timeElement(iso) {
  return iso ? h("time", { datetime: iso }, timeText(iso)) : "never";
}

/** How long ago a moment was ("12 s ago"), with the moment itself (`timeText`) as its title. */
export function ageElement(iso, nowMs) {
  if (!iso) return "never";
  return h("time", { datetime: iso, title: timeText(iso) }, age(secondsSince(iso, nowMs)));
}

/** Kept for the pages that show a clock time: the same format as every other time. */
export function clockTime(ms) {
  return timeText(ms);
}

/** A work item's attempts: "1 of 3 attempts", "0 of 1 attempt". */
export function attemptsText(item) {
  return `${item.attempts} of ${item.max_attempts} ${item.max_attempts === 1 ? "attempt" : "attempts"}`;
}

export function yesNo(value) {
  return value ? "yes" : "no";
}

/** A node's job slots as its last heartbeat reported them: "4 (1 busy, 3 schedulable)". */
export function slotsText(node) {
  const slots = node.slots;
  if (!slots) return "not reported";
  return `${slots.total} (${slots.busy} busy, ${slots.schedulable} schedulable)`;
}

/** A node's push channel: "connected", or "fallback" and why (the heartbeat's hint delivers its work). */
export function channelText(node) {
  if (!node.channel) return "–";
  return node.channel === "connected" ? "connected" : `fallback: ${node.channel_reason || "no channel connection"}`;
}
