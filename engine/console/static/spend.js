// What a session spent, turn by turn and in all, against its budget (issue #28): cost,
// model calls, tool calls and tokens, each beside the limit the agent's `budget` (per turn)
// and `session_budget` set, and the share of input read from the vendor's prompt cache.
// Built from the events alone, as the timeline is: the limits from `agent.updated`, a raise
// from an approved budget prompt (it adds the limit's own size, for that turn only, as the
// machine folds it: engine/machine/budgets.py), the crossed limit from `budget_exceeded`.

import { cacheShare, count, h, money } from "./util.js";

const LIMITS = [
  // [limit key, column, how a figure reads]
  ["max_cost_usd", "cost", money],
  ["max_model_calls", "model calls", count],
  ["max_tool_calls", "tool calls", count],
  ["max_tokens", "tokens", count],
];
const SESSION_LIMIT = "session.max_cost_usd";

export class Spend {
  constructor() {
    this.rows = h("tbody", { id: "spend-rows" });
    this.node = h(
      "section",
      { class: "spend", id: "spend", hidden: true },
      h("h2", {}, "spend"),
      h(
        "table",
        { id: "spend-table" },
        h("thead", {}, h("tr", {}, ["turn", ...LIMITS.map(([, c]) => c), "cache hits"].map((c) => h("th", {}, c)))),
        this.rows,
      ),
    );
    this.budget = {}; // the agent's per-turn limits, as last configured
    this.whole = {}; // its session limits
    this.turns = new Map(); // turn id -> its figures, in the order turns started
    this.asks = new Map(); // open budget prompts: interrupt id -> {turn, limit, raise}
  }

  turn(id) {
    let t = this.turns.get(id);
    if (!t) {
      t = {
        id,
        cost: 0,
        tokens: 0,
        input: 0,
        cacheRead: 0,
        calls: new Set(),
        tools: new Set(),
        raised: {},
        over: null, // the limit a budget_exceeded named
        state: "running",
        budget: null, // frozen at the turn's end
        whole: null,
      };
      this.turns.set(id, t);
    }
    return t;
  }

  onEvent(e) {
    const p = e.payload;
    const t = e.turn_id && this.turns.has(e.turn_id) ? this.turns.get(e.turn_id) : null;
    switch (p.type) {
      case "agent.updated":
        this.budget = p.agent?.budget ?? {};
        this.whole = p.agent?.session_budget ?? {};
        break;
      case "turn.started":
        this.turn(p.turn_id);
        break;
      case "llm.call.requested":
        t?.calls.add(p.id);
        break;
      case "tool.call.requested":
        t?.tools.add(p.id);
        break;
      case "llm.call.completed":
      case "subagent.completed":
      case "subagent.errored":
        if (t) this.add(t, p.cost, p.usage);
        break;
      case "session.interrupted": {
        const meta = p.payload?.metadata;
        if (t && p.origin === "budget" && meta?.limit) {
          this.asks.set(p.interrupt_id, { turn: t, limit: meta.limit, raise: Number(meta.raise_by || 0) });
        }
        break;
      }
      case "session.interrupt_resumed": {
        const ask = this.asks.get(p.interrupt_id);
        this.asks.delete(p.interrupt_id);
        const answer = p.payload && typeof p.payload === "object" ? p.payload.value : p.payload;
        if (ask && !p.expired && answer === "approve") {
          ask.turn.raised[ask.limit] = (ask.turn.raised[ask.limit] ?? 0) + ask.raise;
        }
        break;
      }
      case "turn.completed":
      case "turn.failed": {
        const ended = this.turns.get(p.turn_id);
        if (!ended) break;
        // The turn's own sums are the final word (its subagents' spend included).
        ended.cost = Number(p.cost || 0);
        ended.tokens = Number(p.usage?.total || 0);
        ended.input = Number(p.usage?.input || 0);
        ended.cacheRead = Number(p.usage?.cache_read || 0);
        ended.state = p.type === "turn.failed" ? "failed" : "ok";
        if (p.error?.code === "budget_exceeded") ended.over = p.error.detail?.limit ?? null;
        ended.budget = this.budget;
        ended.whole = this.whole;
        break;
      }
      default:
        return;
    }
    this.draw();
  }

  add(t, cost, usage) {
    t.cost += Number(cost || 0);
    t.tokens += Number(usage?.total || 0);
    t.input += Number(usage?.input || 0);
    t.cacheRead += Number(usage?.cache_read || 0);
  }

  // A figure, with " of <limit>" when the limit is set (raises included).
  cell(value, show, limit, raised, over) {
    const allowed = limit === undefined || limit === null ? null : Number(limit) + (raised ?? 0);
    const text = allowed === null ? show(value) : `${show(value)} of ${show(allowed)}`;
    const full = allowed !== null && value >= allowed;
    return h("td", { class: `num${over ? " over" : full ? " full" : ""}` }, text);
  }

  draw() {
    const rows = [];
    const all = { cost: 0, tokens: 0, input: 0, cacheRead: 0, calls: 0, tools: 0 };
    let last = null;
    for (const t of this.turns.values()) {
      const budget = t.budget ?? this.budget;
      const figures = {
        max_cost_usd: t.cost,
        max_model_calls: t.calls.size,
        max_tool_calls: t.tools.size,
        max_tokens: t.tokens,
      };
      rows.push(
        h(
          "tr",
          { class: `turn ${t.state}`, "data-turn": t.id },
          h("td", { class: "id" }, t.id),
          LIMITS.map(([key, , show]) => this.cell(figures[key], show, budget[key], t.raised[key], t.over === key)),
          h("td", { class: "num" }, cacheShare({ input: t.input, cache_read: t.cacheRead }) || "–"),
        ),
      );
      all.cost += t.cost;
      all.tokens += t.tokens;
      all.input += t.input;
      all.cacheRead += t.cacheRead;
      all.calls += t.calls.size;
      all.tools += t.tools.size;
      last = t;
    }
    const whole = last?.whole ?? this.whole;
    const over = last?.over === SESSION_LIMIT;
    rows.push(
      h(
        "tr",
        { class: "session", "data-turn": "" },
        h("td", { class: "id" }, "session"),
        this.cell(all.cost, money, whole.max_cost_usd, last?.raised[SESSION_LIMIT], over),
        h("td", { class: "num" }, count(all.calls)),
        h("td", { class: "num" }, count(all.tools)),
        h("td", { class: "num" }, count(all.tokens)),
        h("td", { class: "num" }, cacheShare({ input: all.input, cache_read: all.cacheRead }) || "–"),
      ),
    );
    this.rows.replaceChildren(...rows);
    this.node.hidden = this.turns.size === 0;
  }
}
