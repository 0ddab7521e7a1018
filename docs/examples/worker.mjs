// A minimal subs worker in JavaScript (node:http, no dependencies): worker.ts without its
// types, so plain Node runs it; tests/test_docs_workers.py runs it against a real engine.
//
//   ONCALL_WORKER_SECRET=... node docs/examples/worker.mjs    # PORT=8787 by default
//
// Its subs.toml is worker.toml beside it; the triggers: docs/workers.md.
import { createServer } from "node:http";
import { createHmac, timingSafeEqual } from "node:crypto";

const SECRET = process.env.ONCALL_WORKER_SECRET ?? "";
const WINDOW = 300; // seconds a signed request stays good: one replayed later is refused
const RUNBOOKS = {
  checkout: "kubectl rollout restart deploy/checkout; page payments if it still fails.",
};

// `X-Subs-Signature` is `t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>." + body>`. A `t`
// more than WINDOW seconds from `now` (default: this clock) is a replay.
function signed(body, header, now = Date.now() / 1000) {
  const match = /^t=(\d+),v1=([0-9a-f]+)$/.exec(header ?? "");
  if (match === null || Math.abs(now - Number(match[1])) > WINDOW) return false;
  const mac = createHmac("sha256", SECRET).update(`${match[1]}.`).update(body).digest("hex");
  const expected = Buffer.from(mac);
  const given = Buffer.from(match[2]);
  return given.length === expected.length && timingSafeEqual(given, expected);
}

// A tool's outcome as a decision: `tool.result`, or `tool.error`.
function runTool(name, args) {
  if (name === "runbook") {
    const runbook = RUNBOOKS[String(args.service)] ?? "No runbook for that service.";
    return { actions: [{ type: "tool.result", result: { runbook } }] };
  }
  return { actions: [{ type: "tool.error", error: `this worker has no tool '${name}'` }] };
}

function answer(res, status, value) {
  res.writeHead(status, { "Content-Type": "application/json" });
  res.end(JSON.stringify(value));
}

async function decide(req, res) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  const body = Buffer.concat(chunks); // the raw bytes: the signature covers exactly these
  const header = req.headers["x-subs-signature"];
  if (!signed(body, typeof header === "string" ? header : undefined)) {
    return answer(res, 401, { error: "bad or missing signature" });
  }
  const decision = JSON.parse(body.toString("utf8"));
  const trigger = decision.trigger;
  if (trigger.type === "tool.execute" && trigger.input?.status === "valid") {
    return answer(res, 200, runTool(trigger.name ?? "", trigger.input.value ?? {}));
  }
  // Everything else, including a tool call whose arguments failed the tool's schema (the
  // engine proposes the tool.error): accept what the engine proposes.
  return answer(res, 200, decision.proposed);
}

const server = createServer((req, res) => {
  decide(req, res).catch(() => answer(res, 500, { error: "the worker failed" }));
});
server.listen(Number(process.env.PORT ?? 8787), "127.0.0.1", () => {
  const address = server.address();
  const port = typeof address === "object" && address !== null ? address.port : 0;
  console.log(`worker listening on http://127.0.0.1:${port}/`);
});
process.on("SIGTERM", () => server.close(() => process.exit(0)));
