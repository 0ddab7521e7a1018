// The sessions list: latest activity first, a page at a time (the admin list's cursor:
// a page holds still while sessions are written), filtered by agent and status,
// refreshed every few seconds while it is open. Failed sessions are marked with the reason
// (the row's `status` is the server's word for it, as `subs sessions list` shows it).

import { call } from "./api.js";
import { ago, chatHref, clip, count, h, money, stamp } from "./util.js";

const PAGE = 50;
const REFRESH_MS = 5000;
const STATUSES = ["", "running", "interrupted", "idle", "failed"];

export function showList(main, params, go, fail) {
  const agent = params.get("agent") ?? "";
  const status = params.get("status") ?? "";
  const cursor = params.get("cursor") ?? "";

  const agentInput = h("input", { name: "agent", value: agent, placeholder: "any agent" });
  const statusSelect = h(
    "select",
    { name: "status" },
    STATUSES.map((s) => h("option", { value: s, selected: s === status }, s || "any status")),
  );
  const form = h(
    "form",
    { class: "filters", onsubmit: (e) => { e.preventDefault(); apply(""); } },
    h("label", {}, "agent ", agentInput),
    h("label", {}, "status ", statusSelect),
    h("button", { type: "submit" }, "filter"),
    agent ? h("a", { id: "chat-agent", href: chatHref(agent) }, `chat with ${agent}`) : "",
  );
  statusSelect.addEventListener("change", () => apply(""));
  const body = h("tbody");
  const pager = h("nav", { class: "pager" });
  const note = h("p", { class: "muted", id: "list-note" });
  // Redis past 90 % of maxmemory: new sessions are refused (503 store_full) until room is made.
  const full = h("p", { class: "banner", id: "store-full", role: "alert", hidden: true });
  main.replaceChildren(
    full,
    form,
    h(
      "table",
      { class: "sessions", id: "sessions" },
      h(
        "thead",
        {},
        h("tr", {}, ["session", "agent", "status", "last activity", "turns", "tokens", "cost"]
          .map((c) => h("th", {}, c))),
      ),
      body,
    ),
    note,
    pager,
  );

  function apply(at) {
    const q = new URLSearchParams();
    if (agentInput.value.trim()) q.set("agent", agentInput.value.trim());
    if (statusSelect.value) q.set("status", statusSelect.value);
    if (at) q.set("cursor", at);
    go(`/console${q.size ? `?${q}` : ""}`);
  }

  async function load() {
    const q = new URLSearchParams({ limit: String(PAGE) });
    if (agent) q.set("agent_id", agent);
    if (status) q.set("status", status);
    if (cursor) q.set("cursor", cursor);
    let page;
    try {
      page = await call("GET", `/api/admin/sessions?${q}`);
    } catch (err) {
      // A cursor lives 30 minutes: a page left open longer starts again from the newest.
      if (cursor && err.status === 400 && /^cursor:/.test(err.message)) {
        apply("");
        return false; // this view is gone: no more refreshes of it
      }
      throw err;
    }
    body.replaceChildren(...page.items.map(row));
    showStore(full, page.store);
    note.textContent = page.items.length
      ? `${page.items.length} sessions${cursor ? ", an older page" : ""}; refreshed ${new Date().toISOString().slice(11, 19)}Z`
      : agent || status ? "no session matches this filter on this page" : "no sessions yet";
    pager.replaceChildren(
      cursor ? h("a", { href: "#", id: "newest", onclick: (e) => { e.preventDefault(); apply(""); } }, "« newest") : "",
      page.next_cursor !== null
        ? h("a", { href: "#", id: "older", onclick: (e) => { e.preventDefault(); apply(page.next_cursor); } }, "older »")
        : "",
    );
  }

  let timer = null;
  const tick = async () => {
    try {
      if ((await load()) === false) return;
      timer = setTimeout(tick, REFRESH_MS);
    } catch (err) {
      fail(err);
    }
  };
  tick();
  return () => clearTimeout(timer);
}

function showStore(banner, store) {
  banner.hidden = !store?.full;
  if (!store?.full) return;
  const share = store.maxmemory ? Math.floor((store.used_memory * 100) / store.maxmemory) : 100;
  banner.textContent =
    `The store is full: Redis uses ${share}% of its maxmemory, so new sessions are refused ` +
    "(503 store_full) while running ones go on. Make room: lower [store] retention, delete " +
    "sessions, or raise [store] max_memory (the server's maxmemory for an outside Redis).";
}

function row(s) {
  const href = `/console/sessions/${encodeURIComponent(s.session_id)}`;
  return h(
    "tr",
    { class: `session ${s.status}`, "data-session": s.session_id },
    h(
      "td",
      {},
      h("a", { href, "data-nav": "" }, s.session_id),
      s.first_message ? h("div", { class: "first" }, clip(s.first_message, 90)) : "",
      s.status === "failed" && s.error ? h("div", { class: "reason" }, `✗ ${s.error}`) : "",
    ),
    h("td", {}, s.agent_id, " ", h("a", { class: "chat small", href: chatHref(s.agent_id), title: `chat with ${s.agent_id}` }, "chat")),
    h("td", {}, h("span", { class: `badge ${s.status}` }, s.status)),
    h("td", { title: stamp(s.last_activity_at) }, ago(s.last_activity_at), h("div", { class: "muted small" }, stamp(s.last_activity_at))),
    h("td", { class: "num" }, count(s.turns)),
    h("td", { class: "num" }, count(s.tokens)),
    h("td", { class: "num" }, money(s.cost), ...(s.budgets || []).map(bucket)),
  );
}

// A budget-policy bucket the session counts toward ([[budgets]]): used of its limit in its
// window, and until when it is spent.
function bucket(b) {
  const unit = b.dimension === "cost_usd" ? money(b.used) + " of " + money(b.limit) : `${count(Number(b.used))} of ${count(Number(b.limit))} tokens`;
  const spent = b.frees_at ? ` · spent until ${stamp(b.frees_at)}` : "";
  return h("div", { class: `budget small${b.frees_at ? " spent" : " muted"}`, title: b.group }, `${b.policy}: ${unit}${spent}`);
}
