// The chat page's transport (engine/console/chat/agui.js) run from node against the
// endpoint: two turns on one thread, folding events as the page does. Prints the
// history it kept as JSON; tests/test_agui_node.py compares it with the session's.
const [modulePath, config] = process.argv.slice(2);
const { url, key, threadId } = JSON.parse(config);
const { apply, stream } = await import(modulePath);

const messages = [];
for (const [n, text] of [[1, "hello"], [2, "and again"]]) {
  messages.push({ id: `page-u${n}`, role: "user", content: text });
  const view = messages.filter((m) => m.role !== "reasoning");
  const body = { threadId, runId: `page-run-${n}`, messages: view, tools: [], context: [] };
  for await (const event of stream(url, body, key)) {
    if (event.type === "RUN_ERROR") throw new Error(event.message);
    apply(messages, event, () => {});
  }
}
process.stdout.write(JSON.stringify(messages));
