// How values read on the page.

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

export function clockTime(ms) {
  return new Date(ms).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" });
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
