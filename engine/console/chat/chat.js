// The chat page: one agent, one thread (its id in the URL's #fragment), over the
// AG-UI endpoint. The key, when the API needs one, lives in this tab's sessionStorage.
import { HttpError, apply, stream } from "./agui.js";

const agent = decodeURIComponent(location.pathname.split("/").pop());
const base = `/api/channels/ag-ui/agents/${encodeURIComponent(agent)}`;
const KEY = "subs.apiKey";

const $ = (id) => document.getElementById(id);
const log = $("log");
const status = $("status");
const messages = [];
const shown = new Map(); // message id -> its element
// What the last run left waiting for the user: its client tool calls or interrupts.
// The next thing typed answers them instead of starting a turn.
let waiting = { calls: [], interrupts: [] };
const resumed = location.hash.length > 1; // a thread to show again, not a new one
let threadId = resumed ? location.hash.slice(1) : newThread();

function newThread() {
  const id = crypto.randomUUID();
  history.replaceState(null, "", `#${id}`);
  return id;
}

function describe(message) {
  if (message.role === "tool") return `→ ${message.content}`;
  const calls = (message.toolCalls || []).map((c) => `⚙ ${c.function.name}(${c.function.arguments})`);
  return [message.content || "", ...calls].filter(Boolean).join("\n");
}

function show(message) {
  let element = shown.get(message.id);
  if (!element) {
    element = document.createElement("div");
    element.className = `msg ${message.role}`;
    shown.set(message.id, element);
    log.append(element);
  }
  element.textContent = describe(message);
  element.scrollIntoView({ block: "end" });
}

function clear() {
  messages.length = 0;
  shown.clear();
  log.replaceChildren();
}

// Streams one run (or a connect) into the page; false when it was refused.
async function follow(path, body) {
  const key = sessionStorage.getItem(KEY) || "";
  try {
    for await (const event of stream(`${base}/${path}`, body, key)) {
      apply(messages, event, show);
      if (event.type === "RUN_ERROR") status.textContent = `Error: ${event.message}`;
      if (event.type === "RUN_FINISHED") wait(event.outcome);
    }
  } catch (err) {
    if (err instanceof HttpError && err.status === 404 && path === "connect") {
      status.textContent = ""; // nothing said on this thread yet
    } else if (err instanceof HttpError && err.status === 401) {
      $("key-form").hidden = false;
      status.textContent = "This API needs a key.";
    } else {
      status.textContent = `Error: ${err.message}`;
    }
    return false;
  }
  return true;
}

function wait(outcome) {
  const calls = (outcome && outcome.pendingToolCallIds) || [];
  const interrupts = (outcome && outcome.interrupts) || [];
  waiting = { calls, interrupts };
  const names = messages
    .flatMap((m) => m.toolCalls || [])
    .filter((c) => calls.includes(c.id))
    .map((c) => c.function.name);
  const asks = [...names.map((n) => `the tool ${n}`), ...interrupts.map((i) => i.message || i.reason)];
  status.textContent = asks.length ? `Waiting for your answer to ${asks.join(", ")}.` : "";
}

// The user's text: a tool result for each call the agent waits on, else the answer
// to its interrupts, else a new message that starts a turn.
function answersTo(text, body) {
  const id = () => crypto.randomUUID();
  if (waiting.calls.length) {
    return waiting.calls.map((call) => ({ id: id(), role: "tool", toolCallId: call, content: text }));
  }
  if (waiting.interrupts.length) {
    body.resume = waiting.interrupts.map((i) => ({ interruptId: i.id, status: "resolved", payload: text }));
    return [];
  }
  return [{ id: id(), role: "user", content: text }];
}

async function send(text) {
  const body = { threadId, runId: crypto.randomUUID(), tools: [], context: [] };
  const answers = answersTo(text, body);
  for (const message of answers) {
    messages.push(message);
    show(message);
  }
  waiting = { calls: [], interrupts: [] };
  status.textContent = "…";
  $("send").disabled = true;
  body.messages = messages.filter((m) => m.role !== "reasoning");
  if (!(await follow("run", body))) {
    // Refused before it ran (no key, a bad one...): nothing was said; the text comes back
    // to the box, to send again.
    for (const message of answers) {
      messages.splice(messages.indexOf(message), 1);
      shown.get(message.id)?.remove();
      shown.delete(message.id);
    }
    $("text").value = text;
  }
  $("send").disabled = false;
}

$("title").textContent = agent;
$("composer").addEventListener("submit", (event) => {
  event.preventDefault();
  const text = $("text").value.trim();
  if (!text) return;
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
  sessionStorage.setItem(KEY, $("key").value);
  $("key-form").hidden = true;
  status.textContent = "";
  if (resumed) follow("connect", { threadId });
});
$("new-thread").addEventListener("click", () => {
  threadId = newThread();
  clear();
});
if (resumed) follow("connect", { threadId });
