// The AG-UI transport: POST a RunAgentInput, read the answer's SSE frames as events.
// A refusal comes back as a plain HTTP error with a JSON body, before any stream.

export class HttpError extends Error {
  constructor(status, body) {
    super(body && body.error ? body.error : `HTTP ${status}`);
    this.status = status;
  }
}

// Yields each AG-UI event of one run (or connect) as a parsed object.
export async function* stream(url, body, key) {
  const headers = { "Content-Type": "application/json", Accept: "text/event-stream" };
  if (key) headers.Authorization = `Bearer ${key}`;
  const resp = await fetch(url, { method: "POST", headers, body: JSON.stringify(body) });
  if (!resp.ok) {
    let detail = null;
    try {
      detail = await resp.json();
    } catch {
      // not JSON: the status says enough
    }
    throw new HttpError(resp.status, detail);
  }
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const frame = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = frame
        .split("\n")
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).replace(/^ /, ""))
        .join("\n");
      if (data) yield JSON.parse(data);
    }
  }
}

// Folds one run's events into `messages` (the thread's history, as the client keeps
// it), the way @ag-ui/client does: text under TEXT_MESSAGE_START's id, tool calls on
// their parent message, results as tool messages, a snapshot replacing everything.
// `onChange(message)` is told about every message that changed.
export function apply(messages, event, onChange) {
  const find = (id) => messages.find((m) => m.id === id);
  const add = (message) => {
    messages.push(message);
    return message;
  };
  switch (event.type) {
    case "TEXT_MESSAGE_START":
      onChange(find(event.messageId) || add({ id: event.messageId, role: "assistant", content: "" }));
      break;
    case "TEXT_MESSAGE_CONTENT": {
      const message = find(event.messageId);
      message.content = (message.content || "") + event.delta;
      onChange(message);
      break;
    }
    case "REASONING_MESSAGE_START":
      onChange(add({ id: event.messageId, role: "reasoning", content: "" }));
      break;
    case "REASONING_MESSAGE_CONTENT": {
      const message = find(event.messageId);
      message.content += event.delta;
      onChange(message);
      break;
    }
    case "TOOL_CALL_START": {
      const parentId = event.parentMessageId || event.toolCallId;
      const parent = find(parentId) || add({ id: parentId, role: "assistant" });
      parent.toolCalls = parent.toolCalls || [];
      parent.toolCalls.push({
        id: event.toolCallId,
        type: "function",
        function: { name: event.toolCallName, arguments: "" },
      });
      onChange(parent);
      break;
    }
    case "TOOL_CALL_ARGS": {
      for (const message of messages) {
        const call = (message.toolCalls || []).find((c) => c.id === event.toolCallId);
        if (call) {
          call.function.arguments += event.delta;
          onChange(message);
        }
      }
      break;
    }
    case "TOOL_CALL_RESULT":
      onChange(
        add({ id: event.messageId, role: "tool", toolCallId: event.toolCallId, content: event.content }),
      );
      break;
    case "MESSAGES_SNAPSHOT":
      messages.splice(0, messages.length, ...event.messages);
      for (const message of messages) onChange(message);
      break;
    default:
      break;
  }
}
