// The chat page: one agent, one thread (its id in the URL's #fragment, the session's id
// on the server), over the AG-UI endpoint. The key, when the API needs one, lives in
// this tab's sessionStorage under the console's name for it: one key for both pages.
import { HttpError, apply, stream } from "./agui.js";

const agent = decodeURIComponent(location.pathname.split("/").pop());
const base = `/api/channels/ag-ui/agents/${encodeURIComponent(agent)}`;
const KEY = "subs.console.key"; // as engine/console/static/api.js keeps it

const $ = (id) => document.getElementById(id);
const log = $("log");
const status = $("status");
const messages = [];
const shown = new Map(); // message id -> its element
// Messages a run refused for want of a key: shown, and sent once a key is given.
const pending = new Set();
// What the last run left waiting for the user: its client tool calls or interrupts.
// An answer to them is sent instead of a message that starts a turn.
let waiting = { calls: [], interrupts: [] };
let busy = false; // a run is streaming: nothing else is sent meanwhile
const resumed = location.hash.length > 1; // a thread to show again, not a new one
let loaded = !resumed; // the thread's history is on the page
let threadId = resumed ? decodeURIComponent(location.hash.slice(1)) : newThread();

function newThread() {
  const id = crypto.randomUUID();
  history.replaceState(null, "", `#${id}`);
  return id;
}

// A text-only element: nothing shown here is ever parsed as HTML.
function el(tag, className, ...children) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  node.append(...children);
  return node;
}

function describe(message) {
  if (message.role === "tool") return `→ ${message.content}`;
  const calls = (message.toolCalls || []).map((c) => `⚙ ${c.function.name}(${c.function.arguments})`);
  return [message.content || "", ...calls].filter(Boolean).join("\n");
}

function show(message) {
  let element = shown.get(message.id);
  if (!element) {
    element = el("div", "");
    shown.set(message.id, element);
    log.append(element);
  }
  element.className = `msg ${message.role}${pending.has(message.id) ? " pending" : ""}`;
  element.textContent = describe(message);
  element.scrollIntoView({ block: "end" });
}

function unshow(message) {
  messages.splice(messages.indexOf(message), 1);
  shown.get(message.id)?.remove();
  shown.delete(message.id);
}

function clear() {
  messages.length = 0;
  shown.clear();
  pending.clear();
  log.replaceChildren();
}

// The thread's session, once a run has started it: its id to copy, its console page.
function showSession(id) {
  $("session-id").textContent = id;
  $("session-line").hidden = false;
  $("to-session").href = `/console/sessions/${encodeURIComponent(id)}`;
  $("to-session").hidden = false;
}

function hideSession() {
  $("session-line").hidden = true;
  $("to-session").hidden = true;
}

// Streams one run (or a connect) into the page: "ok", "key" (refused for want of a
// key: the key form is shown) or "refused" (any other refusal before it ran).
async function follow(path, body) {
  const key = sessionStorage.getItem(KEY) || "";
  try {
    for await (const event of stream(`${base}/${path}`, body, key)) {
      apply(messages, event, show);
      if (event.type === "RUN_STARTED") showSession(event.threadId);
      if (event.type === "RUN_ERROR") status.textContent = `Error: ${event.message}`;
      if (event.type === "RUN_FINISHED") wait(event.outcome);
    }
  } catch (err) {
    if (err instanceof HttpError && err.status === 404 && path === "connect") {
      status.textContent = ""; // nothing said on this thread yet
      loaded = true;
      return "ok";
    }
    if (err instanceof HttpError && err.status === 401) {
      $("key-form").hidden = false;
      const then = path === "run" ? "your message is sent once it is in" : "then the thread shows";
      status.textContent = key
        ? `That key was refused: ${err.message}. Enter another; ${then}.`
        : `This API needs a key. Enter one; ${then}.`;
      $("key").focus();
      return "key";
    }
    status.textContent = `Error: ${err.message}`;
    return "refused";
  }
  if (path === "connect") loaded = true;
  return "ok";
}

// What a client tool call asks, as a person reads it: its arguments' question or
// message, else the arguments themselves.
function questionOf(call) {
  const raw = call.function.arguments || "";
  let args;
  try {
    args = JSON.parse(raw || "{}");
  } catch {
    return raw;
  }
  for (const field of ["question", "message", "prompt"]) {
    const value = args && typeof args === "object" ? args[field] : undefined;
    if (typeof value === "string" && value.trim()) return value;
  }
  return JSON.stringify(args, null, 2);
}

function button(label, className, onClick) {
  const node = el("button", className, label);
  node.type = "button";
  node.addEventListener("click", onClick);
  return node;
}

// The open client tool calls, each its question with yes/no (or type any answer).
function ask(calls) {
  const asks = calls.map((call) =>
    el(
      "div",
      "ask",
      el("p", "who", `${agent} asks, through its tool ${call.function.name}:`),
      el("p", "question", questionOf(call)),
      el(
        "div",
        "answers",
        button("Yes", "yes", () => send("yes", call.id)),
        button("No", "no", () => send("no", call.id)),
        el("span", "hint", "or type another answer below"),
      ),
    ),
  );
  $("questions").replaceChildren(...asks);
  $("questions").hidden = !asks.length;
  $("text").placeholder = asks.length ? "Your answer" : "Message";
}

function setWaiting(next) {
  waiting = next;
  const calls = messages
    .flatMap((m) => m.toolCalls || [])
    .filter((c) => waiting.calls.includes(c.id));
  ask(calls); // the questions say what the calls wait for
  const asks = waiting.interrupts.map((i) => i.message || i.reason);
  if (asks.length) status.textContent = `Waiting for your answer to ${asks.join(", ")}.`;
}

function wait(outcome) {
  status.textContent = "";
  setWaiting({
    calls: (outcome && outcome.pendingToolCallIds) || [],
    interrupts: (outcome && outcome.interrupts) || [],
  });
}

// The user's text: the result of the client call it answers (`callId`, else the first
// one waiting), else the answer to the interrupts, else a new message starting a turn.
function answersTo(text, body, callId) {
  const id = () => crypto.randomUUID();
  const call = callId || waiting.calls[0];
  if (call) return [{ id: id(), role: "tool", toolCallId: call, content: text }];
  if (waiting.interrupts.length) {
    body.resume = waiting.interrupts.map((i) => ({ interruptId: i.id, status: "resolved", payload: text }));
    return [];
  }
  return [{ id: id(), role: "user", content: text }];
}

// One run with the thread's messages (any left pending by a refusal among them).
async function run(body, answers) {
  const before = waiting;
  for (const message of answers) {
    messages.push(message);
    show(message);
  }
  setWaiting({ calls: [], interrupts: [] });
  status.textContent = "…";
  busy = true;
  $("send").disabled = true;
  body.messages = messages.filter((m) => m.role !== "reasoning");
  const outcome = await follow("run", body);
  if (outcome === "ok") {
    const sent = [...pending];
    pending.clear();
    for (const id of sent) shown.get(id)?.classList.remove("pending");
  } else if (outcome === "key") {
    // Kept, marked as not sent: the key form sends it, once. A call it answers is
    // not asked again meanwhile.
    for (const message of answers) pending.add(message.id);
    for (const message of answers) show(message);
    const answered = answers.map((m) => m.toolCallId);
    setWaiting({ ...before, calls: before.calls.filter((c) => !answered.includes(c)) });
  } else {
    // Refused before it ran (a bad request...): nothing was said; the text comes back
    // to the box, to send again.
    for (const message of answers) unshow(message);
    setWaiting(before);
    if (answers.length) $("text").value = answers.map((m) => m.content).join("\n");
  }
  busy = false;
  $("send").disabled = false;
}

async function send(text, callId) {
  if (busy) return;
  const body = { threadId, runId: crypto.randomUUID(), tools: [], context: [] };
  await run(body, answersTo(text, body, callId));
}

// A key given: the thread's history if it is yet to load, then what was refused.
async function useKey() {
  if (!loaded) {
    const held = messages.filter((m) => pending.has(m.id));
    for (const message of held) unshow(message);
    busy = true;
    const got = await follow("connect", { threadId });
    busy = false;
    for (const message of held) {
      messages.push(message);
      show(message);
    }
    if (got !== "ok") return; // the key form (or the error) says why
  }
  if (pending.size) await run({ threadId, runId: crypto.randomUUID(), tools: [], context: [] }, []);
}

$("title").textContent = agent;
document.title = `${agent} · subs chat`;
$("composer").addEventListener("submit", (event) => {
  event.preventDefault();
  const text = $("text").value.trim();
  if (!text || busy) return;
  $("text").value = "";
  send(text);
});
$("text").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey) {
    event.preventDefault();
    $("composer").requestSubmit();
  }
});
$("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  if (busy) return;
  sessionStorage.setItem(KEY, $("key").value.trim());
  $("key").value = "";
  $("key-form").hidden = true;
  status.textContent = "";
  useKey();
});
$("new-thread").addEventListener("click", () => {
  if (busy) return;
  threadId = newThread();
  loaded = true;
  clear();
  hideSession();
  setWaiting({ calls: [], interrupts: [] });
  status.textContent = "";
});
if (resumed) follow("connect", { threadId });
