"""A minimal subs worker in Python (aiohttp): it checks each request's signature, runs the
agent's one worker tool (`runbook`) and accepts the engine's plan for everything else.
From the repository's root, with the project installed in .venv (README, Run it):

    ONCALL_WORKER_SECRET=... .venv/bin/python docs/examples/worker.py    # PORT=8787 by default

Its subs.toml is worker.toml beside it. Ctrl-C or SIGTERM stops it. See docs/workers.md for
what each trigger expects back.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
import re
import signal
import time
from typing import Any

from aiohttp import web

SECRET = os.environ["ONCALL_WORKER_SECRET"].encode()  # what signing_secret_env names
WINDOW = 300  # seconds a signed request stays good: one replayed later is refused
RUNBOOKS = {
    "checkout": "kubectl rollout restart deploy/checkout; page payments if it still fails.",
}


def signed(body: bytes, header: str | None, now: float | None = None) -> bool:
    """`X-Subs-Signature` is `t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>." + body>`.
    A `t` more than WINDOW seconds from `now` (default: this clock) is a replay."""
    match = re.fullmatch(r"t=(\d+),v1=([0-9a-f]+)", header or "")
    if match is None or abs((time.time() if now is None else now) - int(match[1])) > WINDOW:
        return False
    expected = hmac.new(SECRET, match[1].encode() + b"." + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, match[2])


def run_tool(name: str, args: dict[str, Any]) -> dict[str, Any]:
    """A tool's outcome as a decision: `tool.result`, or `tool.error`."""
    if name == "runbook":
        runbook = RUNBOOKS.get(args["service"], "No runbook for that service.")
        return {"actions": [{"type": "tool.result", "result": {"runbook": runbook}}]}
    return {"actions": [{"type": "tool.error", "error": f"this worker has no tool {name!r}"}]}


async def decide(request: web.Request) -> web.Response:
    body = await request.read()  # the raw bytes: the signature covers exactly these
    if not signed(body, request.headers.get("X-Subs-Signature")):
        return web.json_response({"error": "bad or missing signature"}, status=401)
    decision = json.loads(body)
    trigger = decision["trigger"]
    if trigger["type"] == "tool.execute" and trigger["input"]["status"] == "valid":
        return web.json_response(run_tool(trigger["name"], trigger["input"]["value"]))
    # Everything else, including a tool call whose arguments failed the tool's schema (the
    # engine proposes the tool.error): accept what the engine proposes.
    return web.json_response(decision["proposed"])


async def main() -> None:
    stop = asyncio.Event()  # set by Ctrl-C or SIGTERM: the server closes, the process exits 0
    for signum in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(signum, stop.set)
    app = web.Application()
    app.router.add_post("/", decide)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", int(os.environ.get("PORT", "8787")))
    await site.start()
    host, port = runner.addresses[0][:2]
    print(f"worker listening on http://{host}:{port}/", flush=True)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


if __name__ == "__main__":
    asyncio.run(main())
