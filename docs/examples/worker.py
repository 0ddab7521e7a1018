"""A minimal subs worker in Python, on the SDK (`subs.worker`): it checks each request's
signature, runs the agent's one worker tool (`runbook`) and accepts the engine's plan for
everything else. From the repository's root, with the project installed in .venv
(README, Run it):

    ONCALL_WORKER_SECRET=... .venv/bin/python docs/examples/worker.py    # PORT=8787 by default

Its subs.toml is worker.toml beside it. Ctrl-C or SIGTERM stops it. See docs/workers.md for
what each trigger expects back.
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

from aiohttp import web

from subs.worker import DecisionRequest, Worker, aiohttp_app

RUNBOOKS = {
    "checkout": "kubectl rollout restart deploy/checkout; page payments if it still fails.",
}

# The secret is what the agent's `signing_secret_env` names: every request is checked.
worker = Worker(secret=os.environ["ONCALL_WORKER_SECRET"])


@worker.tool("runbook")
async def runbook(args: dict[str, Any], request: DecisionRequest) -> dict[str, Any]:
    """The `runbook` tool: its arguments already passed the tool's `input` schema."""
    return {"runbook": RUNBOOKS.get(args["service"], "No runbook for that service.")}


async def main() -> None:
    stop = asyncio.Event()  # set by Ctrl-C or SIGTERM: the server closes, the process exits 0
    for signum in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(signum, stop.set)
    runner = web.AppRunner(aiohttp_app(worker))
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
