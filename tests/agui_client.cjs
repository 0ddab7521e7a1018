// Drives the AG-UI endpoint with @ag-ui/client's HttpAgent, as a web app would:
// a text run, a frontend tool round trip (the run ends at the call; the page answers
// it; the next run resumes), then one more turn. Prints what the client saw and the
// history it assembled as JSON on stdout; tests/test_agui_node.py checks both.
"use strict";

const { HttpAgent } = require("@ag-ui/client");

const PICK = {
  name: "pick_color",
  description: "Let the user pick a colour",
  parameters: { type: "object", properties: { hint: { type: "string" } } },
};

async function main() {
  const { url, key, threadId } = JSON.parse(process.argv[2]);
  const agent = new HttpAgent({
    url,
    threadId,
    headers: { Authorization: `Bearer ${key}` },
  });
  const runs = [];
  async function run(runId, params = {}) {
    const seen = [];
    const subscriber = {
      onEvent: ({ event }) => {
        seen.push(event.type);
      },
      onRunErrorEvent: ({ event }) => {
        throw new Error(`RUN_ERROR: ${event.message}`);
      },
    };
    await agent.runAgent({ runId, ...params }, subscriber);
    runs.push({ runId, events: seen });
  }

  agent.addMessage({ id: "u1", role: "user", content: "hello" });
  await run("run-1");

  agent.addMessage({ id: "u2", role: "user", content: "pick a colour" });
  await run("run-2", { tools: [PICK] });
  const call = agent.messages
    .filter((m) => m.role === "assistant" && m.toolCalls)
    .flatMap((m) => m.toolCalls)
    .find((c) => c.function.name === "pick_color");
  if (!call) throw new Error("no pick_color call in the assembled messages");
  agent.addMessage({ id: "tool-1", role: "tool", toolCallId: call.id, content: "red" });
  await run("run-3", { tools: [PICK] });

  agent.addMessage({ id: "u3", role: "user", content: "thanks" });
  await run("run-4");

  process.stdout.write(JSON.stringify({ runs, messages: agent.messages }));
}

main().catch((err) => {
  process.stderr.write(`agui_client failed: ${err && err.stack ? err.stack : err}\n`);
  process.exit(1);
});
