"""The engine's MCP side: its connections, and the runners of connector syncs and calls.

A sync answers the connection's tool list (from the connection's cache unless the
server said it changed or the sync was asked to fetch afresh); a call checks its
input against the tool's schema, sends `tools/call` under the attempt's deadline and
answers the result as the log keeps tool results (machine/tools.py): content blocks a
worker can read (text, blob, link; images and audio as `data:` URIs),
`structuredContent` and `isError`. A down, slow or garbled server is a retryable
failed attempt; a refused credential is not retryable and names the connection. A
connection that is off here (`Project.connections_off`) answers its sync as `off`, with
the reason and no tools: not a failure.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

from engine.config import Project, project_secrets
from engine.effects.mcp.connection import McpConnection, load_sdk
from engine.effects.mcp.trouble import McpTrouble
from engine.effects.runner import Done, EffectRunner, Runner, Tasks
from engine.errors import ErrorInfo
from engine.machine import CallAnswered, Input, SessionState
from engine.machine.connections import prefix_of
from engine.machine.connectors import AUTH, RunConnectorSync, RunMcpCall
from engine.machine.retry import Fault
from engine.machine.tools import validate_input
from engine.redact import Redactor, env_secrets
from engine.telemetry.logs import CURRENT

if TYPE_CHECKING:  # the SDK is loaded by `start` when a connection is declared
    from mcp_types import CallToolResult, RequestParamsMeta


class Connectors:
    """Every `[mcp.*]` connection of the project, opened on first use."""

    def __init__(self, project: Project, env: Mapping[str, str]) -> None:
        base = os.path.dirname(project.path)
        self.by_path = {b.path: McpConnection(b, env, base) for b in project.mcp.values()}
        # Connections that cannot start here (`subs serve` and `subs check` say why).
        self.off = project.connections_off(env)
        # An error's text is recorded: a server's stderr may hold what it was given.
        self.redactor = Redactor([*env_secrets(env), *project_secrets(project, env)])

    def get(self, path: str) -> McpConnection:
        """The connection at `path`; an unknown one is a non-retryable McpTrouble."""
        conn = self.by_path.get(path)
        if conn is None:
            known = ", ".join(self.by_path) or "none"
            raise McpTrouble(
                f"no [{path}] connection in subs.toml (declared: {known})", retryable=False
            )
        if path in self.off:
            raise McpTrouble(f"{path} is off: {self.off[path]}", retryable=False)
        return conn

    async def aclose(self) -> None:
        """Close every connection."""
        await asyncio.gather(*(c.close() for c in self.by_path.values()))


class McpRunners:
    """The runners of connector syncs and calls, over one `Connectors`: the composition
    root (engine/runtime/engine.py) makes one, adds `runners()` to the engine's, and
    closes it when the engine stops."""

    def __init__(self, project: Project, env: Mapping[str, str]) -> None:
        self.connectors = Connectors(project, env)

    async def start(self) -> None:
        """Load the MCP SDK, off the event loop, when the project declares a connection."""
        if self.connectors.by_path:
            await asyncio.to_thread(load_sdk)

    def runners(self) -> dict[type, Runner]:
        """The effect types this runs, for the engine's runner table."""
        return {RunConnectorSync: self.run_sync, RunMcpCall: self.run_call}

    async def aclose(self) -> None:
        """Close the connections these runners use."""
        await self.connectors.aclose()

    def _failure(
        self, effect: RunConnectorSync | RunMcpCall, trouble: McpTrouble, path: str
    ) -> Input:
        detail: dict[str, Any] = {"connector": path}
        if trouble.unauthorized:
            detail["reason"] = AUTH
        message = self.connectors.redactor.scrub(trouble.message)
        error: ErrorInfo = {"message": message, "code": "handler_error", "detail": detail}
        return CallAnswered(
            effect.call_id, effect.attempt, error=error, retryable=trouble.retryable
        )

    def _start(
        self,
        runner: EffectRunner,
        state: SessionState,
        effect: RunConnectorSync | RunMcpCall,
        path: str,
        doing: str,
        work: Callable[[], Awaitable[Input]],
        done: Done,
        tasks: Tasks,
    ) -> None:
        """Run `work` under the attempt's deadline; a trouble or the deadline is the answer."""
        timeout = None if effect.deadline is None else (effect.deadline - runner.now_ms()) / 1000

        async def bounded() -> Input:
            try:
                async with asyncio.timeout(None if timeout is None else max(timeout, 0)):
                    return await work()
            except McpTrouble as trouble:
                return self._failure(effect, trouble, path)
            except TimeoutError:
                late = Fault.DEADLINE
                error = late.error(f"{path} did not {doing} before the deadline")
                return CallAnswered(
                    effect.call_id, effect.attempt, error=error, retryable=late.retryable
                )

        def failed(error: ErrorInfo, retryable: bool) -> Input:
            return CallAnswered(effect.call_id, effect.attempt, error=error, retryable=retryable)

        runner.run(state.session_id, f"{path}: {doing}", lambda: bounded, failed, done, tasks)

    def run_sync(
        self,
        runner: EffectRunner,
        state: SessionState,
        effect: RunConnectorSync,
        done: Done,
        tasks: Tasks,
    ) -> None:
        """List a connection's tools; the result is one machine input."""
        call = state.calls[effect.call_id]
        path, force = call.name or "", bool(call.params.get("force"))

        async def sync() -> Input:
            off = self.connectors.off.get(path)
            if off is not None:  # an answer, not a failed attempt: the turn runs without it
                result = {"tools": [], "off": off}
                return CallAnswered(effect.call_id, effect.attempt, result=result)
            conn = self.connectors.get(path)
            listed: dict[str, Any] = {"tools": await conn.list_tools(force=force)}
            if conn.block.prefix_tools:
                listed["prefix"] = prefix_of(path)
            listed["approve_timeout_ms"] = conn.block.approve_timeout_ms
            return CallAnswered(effect.call_id, effect.attempt, result=listed)

        self._start(runner, state, effect, path, "list its tools", sync, done, tasks)

    def run_call(
        self,
        runner: EffectRunner,
        state: SessionState,
        effect: RunMcpCall,
        done: Done,
        tasks: Tasks,
    ) -> None:
        """Call one MCP tool; the result or the failure is one machine input."""
        call = state.calls[effect.call_id]
        path, tool = call.params["connector"], call.params["tool"]
        known = state.connectors.get(path)
        listed = (known.get("tools") if known else None) or ()
        synced = next((t for t in listed if t["name"] == tool), None)
        checked = validate_input(synced, call.arguments or "")  # before any await: as committed

        async def send() -> Input:
            if checked["status"] != "valid":  # the model is told; the server is never asked
                error: ErrorInfo = {
                    "message": f"the input of {call.name} does not fit its schema: "
                    f"{checked['error']}",
                    "code": "handler_error",
                    "detail": {"connector": path},
                }
                return CallAnswered(effect.call_id, effect.attempt, error=error, retryable=False)
            arguments = checked["value"]
            # Tracing on: the call attempt's span, where the MCP conventions carry it
            # (`params._meta.traceparent`), so the server's spans nest under it.
            span = CURRENT.get()
            meta = None
            if span is not None:  # a key the MCP conventions add to the SDK's TypedDict
                meta = cast("RequestParamsMeta", {"traceparent": span.traceparent()})
            result = await self.connectors.get(path).request(
                lambda session: session.call_tool(tool, arguments, meta=meta)
            )
            return CallAnswered(effect.call_id, effect.attempt, result=stored_result(result))

        self._start(runner, state, effect, path, f"answer {tool}", send, done, tasks)


def stored_result(result: CallToolResult) -> dict[str, Any]:
    """An MCP result as a stored tool result (schema StoredResult): the SDK's `_meta` and
    `resultType` dropped, every block one a worker reads."""
    content = [_block(b.model_dump(by_alias=True, exclude_none=True)) for b in result.content]
    out: dict[str, Any] = {"content": [b for b in content if b is not None]}
    if result.structured_content is not None:
        out["structuredContent"] = result.structured_content
    if result.is_error:
        out["isError"] = True
    return out


def _block(block: dict[str, Any]) -> dict[str, Any] | None:
    kind = block.get("type")
    if kind == "text":
        return {"type": "text", "text": block.get("text", "")}
    if kind in ("image", "audio"):
        return {
            "type": "blob",
            "uri": f"data:{block.get('mimeType')};base64,{block.get('data', '')}",
        }
    if kind == "resource":
        res = block.get("resource") or {}
        if "text" in res:
            return {"type": "text", "text": res["text"]}
        mime = res.get("mimeType") or "application/octet-stream"
        return {"type": "blob", "uri": f"data:{mime};base64,{res.get('blob', '')}"}
    if kind == "resource_link":
        link: dict[str, Any] = {"type": "link", "uri": block.get("uri", "")}
        for key in ("name", "mimeType"):
            if block.get(key):
                link[key] = block[key]
        return link
    return None
