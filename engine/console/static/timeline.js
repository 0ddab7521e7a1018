// One session as a live timeline: every step a row (model call with its latency, tokens,
// cost and reply; tool call with its input and result; decision; interrupt; error with
// its reason), the conversation's active path beside it, kept current over the event
// stream. Rows are built from the events alone, so a replayed log draws the same page.

import { ApiError, call, follow } from "./api.js";
import { Spend } from "./spend.js";
import {
  between,
  cacheShare,
  chatHref,
  clip,
  clock,
  contentText,
  count,
  duration,
  errorText,
  h,
  money,
  pretty,
  resultText,
  stamp,
} from "./util.js";

const USUAL_FINISH = new Set(["stop", "end_turn", "tool_calls", "tool_use"]); // others are shown
const TEXT_LIMIT = 4000; // longer inputs and results are cut, with their full length said

export function showSession(main, sid, { fail, setLink }) {
  const title = h("h1", {}, sid);
  const facts = h("div", { class: "facts" });
  const notice = h("p", { class: "notice", id: "notice", hidden: true });
  const cancel = h("button", { id: "cancel", type: "button", hidden: true, onclick: onCancel }, "cancel turn");
  const chat = h("a", { id: "open-chat", hidden: true }, "open in chat"); // the thread, on the chat page
  const rows = h("tbody", { id: "timeline-rows" });
  const path = h("ol", { class: "path", id: "path" });
  const spend = new Spend(); // per turn and in all, against the agent's budget
  main.replaceChildren(
    h("section", { class: "head" }, title, facts, h("div", { class: "actions" }, cancel, " ", chat), notice),
    spend.node,
    h(
      "div",
      { class: "split" },
      h(
        "section",
        { class: "timeline" },
        h("h2", {}, "timeline"),
        h(
          "table",
          { id: "timeline" },
          h("thead", {}, h("tr", {}, ["time", "+", "step", "what", "took", "tokens", "cost"].map((c) => h("th", {}, c)))),
          rows,
        ),
      ),
      h("aside", { class: "conversation" }, h("h2", {}, "active path"), path),
    ),
  );

  const calls = new Map(); // call id -> row state
  const offs = new Map(); // MCP connection -> why it is off, as last recorded
  const totals = { cost: 0, tokens: 0, turns: 0, input: 0, cacheRead: 0 };
  let view = null;
  let turnStart = null;
  let lastSeq = 0;
  let refreshTimer = null;

  async function refresh() {
    try {
      view = await call("GET", `/api/client/sessions/${encodeURIComponent(sid)}`);
    } catch (err) {
      fail(err);
      return;
    }
    drawHead();
    path.replaceChildren(...view.messages.map(pathItem));
  }

  function soon() {
    clearTimeout(refreshTimer);
    refreshTimer = setTimeout(refresh, 200);
  }

  function drawHead() {
    if (!view) return;
    const status = view.status;
    facts.replaceChildren(
      fact("agent", view.agent_id),
      fact("status", h("span", { class: `badge ${status}`, id: "status" }, status)),
      fact("turns", count(totals.turns)),
      fact("tokens", count(totals.tokens)),
      fact("cost", money(totals.cost)),
      fact("cache hits", h("span", { id: "cache-share" }, cacheShare({ input: totals.input, cache_read: totals.cacheRead }) || "–")),
      fact("events", h("span", { id: "facts-seq" }, String(lastSeq))),
    );
    cancel.hidden = status !== "running" && status !== "interrupted";
    chat.href = chatHref(view.agent_id, sid);
    chat.hidden = false;
  }

  async function onCancel() {
    cancel.disabled = true;
    try {
      await call("POST", `/api/client/sessions/${encodeURIComponent(sid)}/cancel`, {
        reason: "cancelled from the console",
      });
      say("cancel sent", "ok");
    } catch (err) {
      say(`cancel refused: ${err.message}`, "bad");
    } finally {
      cancel.disabled = false;
    }
  }

  function say(text, kind) {
    notice.hidden = false;
    notice.className = `notice ${kind}`;
    notice.textContent = text;
  }

  // -- rows -----------------------------------------------------------------------------

  function add(e, step, what, extra = {}) {
    const tr = h("tr", { class: `step ${step.replace(/[^a-z]/g, "-")} ${extra.state ?? ""}`, "data-seq": e.seq });
    const row = { tr, e, step, what, ...extra };
    if (row.id) calls.set(row.id, row); // a call's later events update its row
    draw(row);
    rows.append(tr);
    return row;
  }

  function draw(row) {
    const since = turnStart && row.e.occurred_at ? between(turnStart, row.e.occurred_at) : null;
    row.tr.className = `step ${row.step.replace(/[^a-z]/g, "-")} ${row.state ?? ""}`;
    row.tr.replaceChildren(
      h("td", { class: "time", title: stamp(row.e.occurred_at) }, clock(row.e.occurred_at)),
      h("td", { class: "since" }, since === null ? "" : `+${duration(since)}`),
      h("td", { class: "kind" }, row.step),
      h("td", { class: "what" }, row.what(row)),
      h("td", { class: "num took" }, row.took ?? ""),
      h("td", { class: "num tokens" }, row.tokens ?? ""),
      h("td", { class: "num cost" }, row.cost ?? ""),
    );
  }

  const text = (s) => () => s;

  function block(label, body, cls = "") {
    const full = String(body ?? "");
    const shown = clip(full, TEXT_LIMIT);
    return h(
      "div",
      { class: `block ${cls}` },
      h("span", { class: "label" }, label),
      h("pre", {}, shown),
      full.length > TEXT_LIMIT
        ? h("span", { class: "muted small" }, `(${count(full.length)} characters, cut)`)
        : "",
    );
  }

  // A call's failed attempts and its scheduled retry, one line each.
  function attempts(row) {
    return [
      ...row.failures.map((a) =>
        line("error", `attempt ${a.attempt}: ${errorText(a.error)}${a.final ? "" : " (will retry)"}`),
      ),
      row.retry ? line("muted", row.retry) : "",
    ];
  }

  function modelCall(e, p) {
    const what = (row) => [
      line("title", `${row.model ?? "model"} · ${row.status}${row.handler === "worker" ? " · worker" : ""}`),
      ...attempts(row),
      row.reply ? block("reply", row.reply, "reply") : row.live ? block("typing", row.live, "live") : "",
      row.toolCalls?.length ? line("muted", `asks for: ${row.toolCalls.join(", ")}`) : "",
      row.finish && !USUAL_FINISH.has(row.finish) ? line("error", `finish: ${row.finish}`) : "",
    ];
    const state = { status: "requested", handler: p.handler, failures: [], state: "pending" };
    add(e, "model call", what, { ...state, id: p.id });
  }

  function toolCall(e, p) {
    const what = (row) => [
      line("title", `${p.name} · ${row.status}`),
      block("input", pretty(p.arguments), "input"),
      row.result === undefined ? "" : block(row.isError ? "result (error)" : "result", row.result, "result"),
      ...attempts(row),
    ];
    add(e, `tool ${p.handler}`, what, { status: "requested", failures: [], state: "pending", id: p.id });
  }

  // An MCP connection's tool list, fetched at a turn's start (or asked for afresh).
  function connectorSync(e, p) {
    const what = (row) => [
      line("title", `${p.name}${p.params?.force ? " (afresh)" : ""} · ${row.status}`),
      row.listed ? line("muted", row.listed) : "",
      ...attempts(row),
    ];
    add(e, "mcp tools", what, { status: "listing", failures: [], state: "pending", id: p.id });
  }

  function dispatched(e, p) {
    const row = calls.get(p.id);
    if (!row) return;
    row.dispatchedAt = e.occurred_at;
    row.status = p.attempt > 1 ? `running (attempt ${p.attempt})` : "running";
    row.retry = null;
    row.live = "";
    draw(row);
  }

  function ended(e, row, state, status) {
    row.state = state;
    row.status = status;
    row.took = duration(between(row.dispatchedAt ?? row.e.occurred_at, e.occurred_at));
    draw(row);
  }

  function llmCompleted(e, p) {
    const row = calls.get(p.id);
    if (!row) return;
    row.model = p.model ?? row.model;
    row.finish = p.finish_reason;
    const u = p.usage ?? {};
    const cached = u.cache_read ? ` (${cacheShare(u)} cached)` : "";
    row.tokens = `${count(u.input)} in${cached} · ${count(u.output)} out`;
    row.cost = money(p.cost);
    ended(e, row, "ok", "done");
  }

  function callErrored(e, p) {
    const row = calls.get(p.id);
    if (!row) return;
    row.failures.push(p);
    if (p.final) ended(e, row, "failed", "failed");
    else draw(row);
  }

  function onEvent(e) {
    const p = e.payload;
    lastSeq = e.seq;
    spend.onEvent(e);
    switch (p.type) {
      case "session.created":
        add(e, "session", () => [
          `created · agent ${p.agent_id} · decided by ${p.decider}`,
          p.ancestry?.length ? ` · child of ${p.ancestry.at(-1)}` : "",
        ]);
        break;
      case "turn.queued":
        add(e, "turn queued", text(p.turn_id));
        break;
      case "turn.started":
        turnStart = e.occurred_at;
        totals.turns += 1;
        add(e, "turn", text(`started ${p.turn_id}`), { state: "turn" });
        break;
      case "turn.completed":
      case "turn.failed": {
        totals.cost += Number(p.cost || 0);
        totals.tokens += Number(p.usage?.total || 0);
        totals.input += Number(p.usage?.input || 0);
        totals.cacheRead += Number(p.usage?.cache_read || 0);
        const failed = p.type === "turn.failed";
        add(e, failed ? "turn failed" : "turn done", () => [
          h("div", { class: failed ? "error reason" : "title" }, failed ? errorText(p.error) : `completed ${p.turn_id}`),
          p.data !== undefined ? block("data", pretty(p.data)) : "",
        ], {
          state: failed ? "failed" : "ok",
          took: duration(between(turnStart, e.occurred_at)),
          tokens: `${count(p.usage?.total)} total` + (cacheShare(p.usage) && ` · ${cacheShare(p.usage)} cache hits`),
          cost: money(p.cost),
        });
        turnStart = null;
        break;
      }
      case "message.new": {
        const m = p.message;
        const row = m.role === "assistant" ? calls.get(m.id) : null;
        if (row) {
          row.reply = contentText(m.content);
          row.toolCalls = (m.tool_calls ?? []).map((t) => t.function?.name ?? t.name);
          draw(row);
        } else if (m.role === "user" || m.role === "assistant" || m.role === "system") {
          add(e, m.role, () => block("message", contentText(m.content), m.role));
        }
        break;
      }
      case "llm.call.requested":
        modelCall(e, p);
        break;
      case "tool.call.requested":
        toolCall(e, p);
        break;
      case "llm.call.dispatched":
      case "tool.call.dispatched":
      case "connector.sync.dispatched":
        dispatched(e, p);
        break;
      case "connector.sync.requested":
        connectorSync(e, p);
        break;
      case "connector.synced": {
        // An off connection (it cannot start on this engine) is a note, not a failure:
        // recorded once, then the unchanged form says "as before".
        if (p.tools) {
          if (p.off) offs.set(p.path, p.off);
          else offs.delete(p.path);
        }
        const row = calls.get(p.id);
        const off = offs.get(p.path);
        if (row && off !== undefined) {
          row.listed = `${p.tools ? "off" : "still off"}: ${off}; the agent runs without its tools`;
          ended(e, row, "note", "off");
        } else if (row) {
          const names = (p.tools ?? []).map((t) => t.name);
          row.listed = p.tools ? `${names.length} tools: ${names.join(", ")}` : "unchanged";
          ended(e, row, "ok", "listed");
        }
        break;
      }
      case "connector.sync.errored":
        callErrored(e, p);
        break;
      case "tool.call.waiting": {
        const row = calls.get(p.id);
        if (row) { row.status = "waiting (async)"; draw(row); }
        break;
      }
      case "llm.call.completed":
        llmCompleted(e, p);
        break;
      case "tool.call.completed": {
        const row = calls.get(p.id);
        if (row) {
          row.result = resultText(p.result);
          row.isError = Boolean(p.result?.isError);
          ended(e, row, row.isError ? "failed" : "ok", "done");
        }
        break;
      }
      case "llm.call.errored":
      case "tool.call.errored":
        callErrored(e, p);
        break;
      case "call.retry_scheduled": {
        const row = calls.get(p.id);
        if (row) { row.retry = `retry: attempt ${p.attempt} at ${clock(p.due_at)}`; draw(row); }
        else if (p.kind === "decision") add(e, "decision", text(`retry: attempt ${p.attempt} at ${clock(p.due_at)}`));
        break;
      }
      case "decision.dispatched": {
        if (p.attempt === 1) {
          const actions = (p.proposed?.actions ?? []).map((a) => a.type).join(", ") || "nothing";
          const what = (row) => [
            line("title", `${p.trigger?.type ?? "?"} → proposed ${actions} · ${row.status}`),
            ...attempts(row),
          ];
          const state = { status: "asking the worker", failures: [], state: "pending" };
          add(e, "decision", what, { ...state, dispatchedAt: e.occurred_at, id: p.decision_id });
        }
        break;
      }
      case "decision.waiting": { // the worker answers later (POST /api/machine/workers/submit)
        const row = calls.get(p.decision_id);
        if (row) { row.status = "waiting (async)"; draw(row); }
        break;
      }
      case "decision.completed": {
        const row = calls.get(p.decision_id);
        if (row) ended(e, row, "ok", "answered");
        break;
      }
      case "decision.errored":
        callErrored(e, { ...p, id: p.decision_id });
        break;
      case "session.interrupted":
        add(e, "interrupt", () => [
          h("div", { class: "title" }, `${p.reason} (${p.origin})`),
          p.payload?.message ? block("asks", p.payload.message) : "",
        ], { state: "pending" });
        break;
      case "session.interrupt_resumed":
        add(e, "resumed", () => block("answer", pretty(p.payload ?? null)), { state: "ok" });
        break;
      case "subagent.requested":
      case "subagent.started":
      case "subagent.completed":
      case "subagent.errored": {
        const verb = p.type.split(".")[1];
        const failed = p.type === "subagent.errored";
        add(e, "subagent", () => [
          h("a", { href: `/console/sessions/${encodeURIComponent(p.id)}`, "data-nav": "" }, p.id),
          ` ${p.agent_id ?? ""} ${verb}`,
          failed ? h("div", { class: "error" }, errorText(p.error)) : "",
        ], { state: failed ? "failed" : "", cost: p.cost !== undefined ? money(p.cost) : "" });
        break;
      }
      case "input.rejected":
        add(e, "rejected", () => line("error", `${p.input_kind}: ${errorText(p.error)}`), { state: "failed" });
        break;
      case "head.moved":
        add(e, "head moved", text(p.head_id ?? "(root)"));
        break;
      case "message.sent":
        add(e, "sent", () => [`to ${p.to}: `, clip(contentText(p.message?.content), 200)]);
        break;
      case "agent.updated":
      case "worker.state.updated":
      case "channels.updated":
      case "decision.queued":
      case "decision.held": // the turn's first decision waits for its MCP tool lists
      case "decision.released":
        break; // configuration and bookkeeping: the state, not a step
      default:
        add(e, p.type, text(""));
    }
    drawHead();
    const moves = p.type === "message.new" || p.type === "head.moved";
    if (moves || p.type.startsWith("turn.") || p.type.startsWith("session.")) soon(); // the path
  }

  function onDelta(d) {
    const row = calls.get(d.call_id);
    if (!row || row.reply !== undefined || !d.text) return;
    row.live = (row.live ?? "") + d.text;
    draw(row);
  }

  function pathItem(m) {
    const calls = (m.tool_calls ?? []).map((t) => t.function?.name ?? t.name).join(", ");
    return h(
      "li",
      { class: `msg ${m.role}` },
      h("span", { class: "role" }, m.role === "tool" ? `tool ${m.name ?? ""}` : m.role),
      h("div", { class: "body" }, clip(contentText(m.content), 1200)),
      calls ? h("div", { class: "muted small" }, `calls ${calls}`) : "",
    );
  }

  refresh();
  const stop = follow(sid, 0, {
    onEvent,
    onDelta,
    onLink: (state, err) => {
      setLink(state);
      if (state === "refused") fail(err ?? new ApiError(0, "", "the stream was refused"));
      if (state === "live") refresh();
    },
  });
  return () => {
    stop();
    clearTimeout(refreshTimer);
  };
}

function line(cls, text) {
  return h("div", { class: cls }, text);
}

function fact(label, value) {
  return h("span", { class: "fact" }, h("span", { class: "label" }, label), " ", value);
}
