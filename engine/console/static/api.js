// The API as the console calls it: the key (kept in sessionStorage, so it is gone when
// the browser session ends), JSON requests, and a session's event stream with resume.

const KEY = "subs.console.key";

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export const key = {
  get: () => sessionStorage.getItem(KEY),
  set: (value) => sessionStorage.setItem(KEY, value),
  forget: () => sessionStorage.removeItem(KEY),
};

function headers(extra = {}) {
  const k = key.get();
  return k ? { Authorization: `Bearer ${k}`, ...extra } : extra;
}

// One API call; an error answer becomes an ApiError with the server's message.
export async function call(method, path, body) {
  const init = { method, headers: headers() };
  if (body !== undefined || method === "POST" || method === "DELETE") {
    // Every write says JSON, a body-less one too: an API with no keys refuses it otherwise.
    init.headers["Content-Type"] = "application/json";
  }
  if (body !== undefined) init.body = JSON.stringify(body);
  const response = await fetch(path, init);
  const text = await response.text();
  const data = text ? JSON.parse(text) : null;
  if (!response.ok) {
    throw new ApiError(response.status, data?.code ?? "", data?.error ?? response.statusText);
  }
  return data;
}

// Follow a session's events from `after` on, forever: `onEvent(event)` for each stored
// event, `onDelta(delta)` for tokens, `onLink(state)` with "live" / "reconnecting" /
// "refused". A dropped connection resumes with Last-Event-ID, the last seq handled, so
// nothing is missed or repeated. Returns a function that stops following.
export function follow(sid, after, { onEvent, onDelta, onLink }) {
  let last = after;
  let stopped = false;
  let controller = null;
  let wait = 500;

  async function once() {
    controller = new AbortController();
    const url = `/api/client/sessions/${encodeURIComponent(sid)}/events/stream`;
    const response = await fetch(url, {
      headers: headers({ "Last-Event-ID": String(last), Accept: "text/event-stream" }),
      signal: controller.signal,
    });
    if (!response.ok) {
      const data = await response.json().catch(() => ({}));
      throw new ApiError(response.status, data.code ?? "", data.error ?? response.statusText);
    }
    onLink("live");
    wait = 500;
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value;
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const frame = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        handle(frame);
      }
    }
  }

  function handle(frame) {
    let kind = "message";
    const data = [];
    for (const line of frame.split("\n")) {
      if (line.startsWith(":")) continue;
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
      if (field === "event") kind = value;
      else if (field === "data") data.push(value);
    }
    if (!data.length) return;
    const item = JSON.parse(data.join("\n"));
    try {
      if (kind === "llm.token.delta") onDelta(item);
      else if (kind === "stream.overflow") last = item.resume_after_seq;
      else if (typeof item.seq === "number" && item.seq > last) {
        last = item.seq;
        onEvent(item);
      }
    } catch (err) {
      console.error(`the console could not show ${kind}`, err); // one bad row, not a dead page
    }
  }

  (async () => {
    while (!stopped) {
      try {
        await once();
      } catch (err) {
        if (stopped) return;
        if (err instanceof ApiError && err.status < 500 && err.status !== 429) {
          onLink("refused", err);
          return;
        }
      }
      if (stopped) return;
      onLink("reconnecting");
      await new Promise((resolve) => setTimeout(resolve, wait));
      wait = Math.min(wait * 2, 10000);
    }
  })();

  return () => {
    stopped = true;
    controller?.abort();
  };
}
