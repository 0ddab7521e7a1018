"""A subs worker in Python: typed requests and answers, signatures, handlers by trigger.

    from subs.worker import Worker, aiohttp_app
    worker = Worker(secret=os.environ["ONCALL_WORKER_SECRET"])

    @worker.tool("runbook")
    async def runbook(args, request):
        return {"runbook": RUNBOOKS[args["service"]]}

    web.run_app(aiohttp_app(worker), port=8787)

Every trigger without a handler gets the engine's plan (`proposed`). See
docs/workers.md for the protocol, and spec/protocol.schema.json for its types.
"""

from subs.worker.aio import aiohttp_app
from subs.worker.asgi import asgi_app
from subs.worker.client import SubsApiError, SubsClient
from subs.worker.core import LATER, TRIGGER_TYPES, Later, Reply, ToolError, Worker
from subs.worker.models import *  # noqa: F403
from subs.worker.models import __all__ as _models
from subs.worker.signature import SignatureError, sign, verify
from subs.worker.stream import Stream, stream_text

__all__ = [
    "LATER",
    "TRIGGER_TYPES",
    "Later",
    "Reply",
    "SignatureError",
    "Stream",
    "SubsApiError",
    "SubsClient",
    "ToolError",
    "Worker",
    "aiohttp_app",
    "asgi_app",
    "sign",
    "stream_text",
    "verify",
    *_models,
]
