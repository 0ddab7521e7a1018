"""A test MCP server, written with the SDK's own server class (`MCPServer`).

    python tests/mcp_server.py                          # stdio (subs starts it from `command`)
    python tests/mcp_server.py --http PORT --token T    # streamable HTTP on loopback, bearer T

Tools: `now` (a fixed clock), `echo`, `boom` (fails: `isError`), `secret_rotate`
(`destructiveHint`: the engine asks before sending it; each call is logged as `slow`'s),
`slow` (answers after a file appears: a call the
test can kill the server in the middle of), `grow` (adds `later` and sends
`notifications/tools/list_changed`), `grow_quietly` (adds `hush`, telling no one),
`picture` (an image block), `forecast` (structured
content). `CLOCK_TZ` from its environment shows up in `now`; every `slow` call appends a
line to the file named by `MCP_CALLS_LOG`, so a test can count how often it was sent; each
start appends the server's pid to `MCP_PIDS_LOG`. `--say TEXT` and `--say-env NAME` write
TEXT and the variable's value to stderr at start (a server that prints what it was given).
With `MCP_START_GATE` it waits, before it answers anything, for that file to appear (a
server slow to start, for as long as the test wants).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import sys
import time
from pathlib import Path

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations
from typing_extensions import TypedDict  # pydantic reads typing's only from 3.12

server = MCPServer("clock")
READ_ONLY = ToolAnnotations(readOnlyHint=True, idempotentHint=True)
# Changes something, nothing that matters: the engine's `approve = "destructive"` (the
# default) lets it through; an unannotated tool counts as destructive (MCP's defaults).
HARMLESS = ToolAnnotations(destructiveHint=False)


@server.tool(annotations=READ_ONLY, structured_output=False)
def now() -> str:
    """The current time at the clock."""
    return f"It is 12:00 in {os.environ.get('CLOCK_TZ', 'nowhere')}."


@server.tool(annotations=READ_ONLY, structured_output=False)
def echo(text: str) -> str:
    """Say `text` back."""
    return f"echo: {text}"


@server.tool(annotations=READ_ONLY, structured_output=False)
def boom() -> str:
    """Always fails."""
    raise ToolError("the clock is broken")


@server.tool(annotations=ToolAnnotations(destructiveHint=True), structured_output=False)
def secret_rotate() -> str:
    """Rotate the clock's secret (a destructive tool: it waits for approval)."""
    log = os.environ.get("MCP_CALLS_LOG")
    if log:
        with open(log, "a") as f:
            f.write(f"secret_rotate {os.getpid()}\n")
    return "rotated"


@server.tool(annotations=READ_ONLY, structured_output=False)
async def slow(flag: str) -> str:
    """Answers once the file `flag` exists."""
    log = os.environ.get("MCP_CALLS_LOG")
    if log:
        with open(log, "a") as f:
            f.write(f"slow {os.getpid()}\n")
    while not Path(
        flag
    ).exists():  # the test's signal, a file: polled (the call's deadline bounds it)
        await asyncio.sleep(0.02)
    return "slow is done"


@server.tool(annotations=HARMLESS, structured_output=False)
async def grow(ctx: Context) -> str:
    """Add the tool `later` and tell the client the list changed."""

    def later() -> str:
        """A tool that arrived later."""
        return "later!"

    server.add_tool(later, annotations=READ_ONLY, structured_output=False)
    await ctx.session.send_tool_list_changed()
    return "grown"


@server.tool(annotations=READ_ONLY, structured_output=False)
def traced(ctx: Context) -> str:
    """The W3C trace context the call came with (`params._meta.traceparent`), or `none`."""
    meta = ctx.request_context.meta or {}
    return str(meta.get("traceparent") or "none")


@server.tool(annotations=HARMLESS, structured_output=False)
def grow_quietly() -> str:
    """Add the tool `hush` without telling anyone."""

    def hush() -> str:
        """A tool added without a notification."""
        return "shh"

    server.add_tool(hush, annotations=READ_ONLY, structured_output=False)
    return "grown quietly"


@server.tool(annotations=READ_ONLY, structured_output=False)
def picture() -> list:
    """A one-pixel image, and a caption."""
    from mcp_types import ImageContent, TextContent

    png = base64.b64encode(b"\x89PNG\r\n\x1a\n-one-pixel").decode()
    return [
        TextContent(type="text", text="a pixel"),
        ImageContent(type="image", data=png, mimeType="image/png"),
    ]


class Forecast(TypedDict):
    city: str
    sky: str
    high_c: int


@server.tool(annotations=READ_ONLY)
def forecast(city: str) -> Forecast:
    """Tomorrow's weather, as data."""
    return {"city": city, "sky": "clear", "high_c": 21}


def _http_app(token: str):  # type: ignore[no-untyped-def]
    """The streamable HTTP app behind a bearer-token check (401 with WWW-Authenticate)."""
    from starlette.responses import PlainTextResponse

    app = server.streamable_http_app()

    async def guarded(scope, receive, send):  # type: ignore[no-untyped-def]
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or ())
            if headers.get(b"authorization") != f"Bearer {token}".encode():
                response = PlainTextResponse(
                    "unauthorized", status_code=401, headers={"WWW-Authenticate": "Bearer"}
                )
                await response(scope, receive, send)
                return
        await app(scope, receive, send)

    return guarded


def main() -> None:
    pids = os.environ.get("MCP_PIDS_LOG")
    if pids:
        with open(pids, "a") as f:
            f.write(f"{os.getpid()}\n")
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, default=None)
    parser.add_argument("--token", default="")
    parser.add_argument("--say", default=None)
    parser.add_argument("--say-env", default=None)
    args = parser.parse_args()
    gate = os.environ.get("MCP_START_GATE")
    while gate and not Path(gate).exists():  # a server slow to start, until the test says
        time.sleep(0.02)
    if args.say is not None:
        print(f"started with {args.say}", file=sys.stderr, flush=True)
    if args.say_env is not None:
        print(f"my token is {os.environ.get(args.say_env, '')}", file=sys.stderr, flush=True)
    if args.http is None:
        server.run()
        return
    import uvicorn

    config = uvicorn.Config(
        _http_app(args.token), host="127.0.0.1", port=args.http, log_level="warning", lifespan="on"
    )
    print(f"listening on {args.http}", file=sys.stderr, flush=True)
    uvicorn.Server(config).run()


if __name__ == "__main__":
    main()
