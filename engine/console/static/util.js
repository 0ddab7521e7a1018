// Small helpers: building DOM nodes (never from HTML strings: everything shown is text)
// and formatting times, durations, money and message contents.

export function h(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(props)) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (name === "class") node.className = value;
    else node.setAttribute(name, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

// The chat page for an agent (engine/api/chat_page.py), on a session's thread if given:
// the thread id is the session id. It is another page: links to it carry no data-nav.
export function chatHref(agent, sid) {
  const page = `/console/chat/${encodeURIComponent(agent)}`;
  return sid ? `${page}#${encodeURIComponent(sid)}` : page;
}

// "15:04:05" in UTC: on-call people compare times across zones.
export function clock(iso) {
  return iso ? iso.slice(11, 19) : "";
}

export function stamp(iso) {
  return iso ? `${iso.slice(0, 10)} ${iso.slice(11, 19)}Z` : "";
}

export function ago(iso, now = Date.now()) {
  if (!iso) return "";
  const s = Math.max(0, Math.round((now - Date.parse(iso)) / 1000));
  if (s < 60) return `${s}s ago`;
  if (s < 3600) return `${Math.floor(s / 60)}m ago`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ago`;
  return `${Math.floor(s / 86400)}d ago`;
}

export function duration(ms) {
  if (ms === null || ms === undefined || Number.isNaN(ms)) return "";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(2)} s`;
  return `${Math.floor(ms / 60000)}m ${Math.round((ms % 60000) / 1000)}s`;
}

export function between(fromIso, toIso) {
  return fromIso && toIso ? Date.parse(toIso) - Date.parse(fromIso) : null;
}

export function money(cost) {
  const n = Number(cost || 0);
  if (n === 0) return "$0";
  return n < 0.01 ? `$${n.toFixed(6)}` : `$${n.toFixed(4)}`;
}

export function count(n) {
  return Number(n || 0).toLocaleString("en-US");
}

// The share of a usage's input read from the vendor's prompt cache, "37%", or "" when it
// has no input.
export function cacheShare(usage) {
  const input = Number(usage?.input || 0);
  if (input === 0) return "";
  return `${Math.round((100 * Number(usage.cache_read || 0)) / input)}%`;
}

export function clip(text, limit) {
  const s = String(text ?? "");
  return s.length <= limit ? s : `${s.slice(0, limit - 1)}…`;
}

// A message's content as text: a string, or the text of its parts.
export function contentText(content) {
  if (typeof content === "string") return content;
  if (Array.isArray(content)) {
    return content.map((p) => (typeof p === "string" ? p : p?.text ?? "")).join("");
  }
  return content === undefined || content === null ? "" : JSON.stringify(content);
}

// A tool's result (MCP content blocks) as text.
export function resultText(result) {
  if (!result || typeof result !== "object") return String(result ?? "");
  const blocks = Array.isArray(result.content) ? result.content : [];
  const text = blocks.map((b) => (b?.type === "text" ? b.text : JSON.stringify(b))).join("\n");
  if (text) return text;
  return JSON.stringify(result.structuredContent ?? result);
}

export function pretty(raw) {
  try {
    return JSON.stringify(typeof raw === "string" ? JSON.parse(raw) : raw, null, 2);
  } catch {
    return String(raw);
  }
}

export function errorText(error) {
  if (!error) return "";
  if (typeof error === "string") return error;
  const code = error.code ? ` (${error.code})` : "";
  return `${error.message ?? JSON.stringify(error)}${code}`;
}
