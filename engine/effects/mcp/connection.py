"""One MCP connection per `[mcp.<id>]` block per engine process, through the official SDK.

A connection opens lazily, on the first sync or call that needs it, and holds one MCP
session: a task of its own owns the SDK's transport and `ClientSession` (anyio scopes
must be entered and left by one task), and every request of the engine uses that
session. A server that dies or drops the connection is reconnected on the next request,
after a backoff that grows with each failure in a row; a stdio server is also restarted
in the background once it has been up. How a failure reads (a refused credential, a
stdio server's exit code and the last lines of its stderr) is trouble.py's; a run of
failed opens is said once in our log, not every attempt.

How it reaches its server (a stdio child, or streamable HTTP) is transport.py's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any

from engine.config import McpBlock
from engine.effects.mcp.transport import server_transport
from engine.effects.mcp.trouble import McpTrouble, Witness, say, transport_error

# The MCP SDK (and its httpx2) is a quarter of what `subs serve` imports, and most projects
# declare no connection: it is loaded by `load_sdk` when one is declared, and the imports
# below each use are then only lookups.
if TYPE_CHECKING:
    from mcp import ClientSession

log = logging.getLogger("subs.mcp")

OPEN_TIMEOUT_SECS = 55.0  # starting a child (npx may fetch) or reaching a server, and initialize
BACKOFF_BASE_SECS = 0.5
BACKOFF_MAX_SECS = 30.0
# A connected server is pinged this often: a local child that died is restarted within
# seconds, a remote server costs a request now and then.
PING_STDIO_SECS = 2.0
PING_HTTP_SECS = 15.0
PING_TIMEOUT_SECS = 10.0


def load_sdk() -> None:
    """Import what a connection uses (seconds of CPU on a busy machine): called in a
    thread at the engine's start when the project has a connection, so neither the event
    loop nor a call's deadline waits for the imports."""
    import httpx2  # noqa: F401
    import mcp.client.stdio
    import mcp.client.streamable_http
    import mcp.shared.exceptions  # noqa: F401
    import mcp_types  # noqa: F401


class McpConnection:
    """One MCP server as subs.toml declares it: opened on first use, reopened after a fault."""

    def __init__(self, block: McpBlock, env: Mapping[str, str], base_dir: str) -> None:
        self.block = block
        self.env = env
        self.base_dir = base_dir
        self.session: ClientSession | None = None
        self.tools: list[dict[str, Any]] | None = None  # the cached list; None: list again
        self.witness = Witness(block)  # what went wrong, and how it reads
        self.failures = 0  # opens that failed in a row
        self.retry_at = 0.0  # loop time before which an open is not tried again
        self._opening: asyncio.Future[ClientSession] | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()
        self._lost = asyncio.Event()
        self._stopped = False
        self._restarting: asyncio.Task[None] | None = None
        self._open_lock = asyncio.Lock()
        self.was_up = False  # connected once: a stdio server that dies is restarted

    @property
    def path(self) -> str:
        """Its name in tool ids and errors: `mcp.<id>`."""
        return self.block.path

    # -- opening -----------------------------------------------------------------------

    async def open(self, *, afresh: bool = False) -> ClientSession:
        """The live session, opening one if there is none (one open at a time). After a
        failed open the next waits out its backoff (the caller's deadline bounds that);
        `afresh` (a person fixed something) skips the wait."""
        if self.session is not None and not self._lost.is_set():
            return self.session
        if self._stopped:
            raise McpTrouble(f"{self.path} is stopped", retryable=True)
        async with self._open_lock:  # one open at a time: a second request waits for it
            if self._opening is None or self._opening.done():
                loop = asyncio.get_running_loop()
                if afresh:
                    self.retry_at = 0.0
                while (wait := self.retry_at - loop.time()) > 0:
                    await asyncio.sleep(wait)
                await self._drop()
                self._opening = loop.create_future()
                self._closing = asyncio.Event()
                self._lost = asyncio.Event()
                self._task = asyncio.create_task(self._hold(self._opening), name=f"mcp {self.path}")
        return await self._opened()

    async def _opened(self) -> ClientSession:
        assert self._opening is not None
        try:
            return await asyncio.shield(self._opening)
        except McpTrouble:
            raise
        except Exception as err:
            raise McpTrouble(
                f"{self.path} could not be opened: {say(err)}", retryable=True
            ) from None

    async def _hold(self, opened: asyncio.Future[ClientSession]) -> None:
        """Own the transport and the session until closed or lost."""
        from mcp import ClientSession

        try:
            async with AsyncExitStack() as stack:
                transport = server_transport(
                    self.block, self.env, self.base_dir, stack, self.witness
                )
                read, write = await stack.enter_async_context(transport)
                self.witness.saw_transport(transport)
                session = await stack.enter_async_context(
                    ClientSession(read, write, message_handler=self._on_message)
                )
                async with asyncio.timeout(OPEN_TIMEOUT_SECS):
                    await session.initialize()
                self.session = session
                self.failures = 0
                self.was_up = True
                if not opened.done():
                    opened.set_result(session)
                log.info("%s connected", self.path)
                await self._watch(session)
        except BaseException as err:  # reported through `opened`, then re-raised
            self._failed_open()
            if isinstance(err, asyncio.CancelledError):
                if not opened.done():
                    opened.set_exception(self.witness.trouble(err))
                raise
            try:
                trouble = await self.witness.last_words(err)
            except BaseException:  # cancelled while reading its stderr: still answer the wait
                if not opened.done():
                    opened.set_exception(self.witness.trouble(err))
                raise
            if not opened.done():
                opened.set_exception(trouble)
            # Said once a run of failures: every attempt after the first is the same story.
            (log.warning if self.failures == 1 else log.info)("%s", trouble.message)
        finally:
            self.session = None
            self.tools = None
        if not self._stopped and not self._closing.is_set() and self.block.command and self.was_up:
            self._restart_later()

    async def _watch(self, session: ClientSession) -> None:
        """Until closed or lost. A ping now and then finds a server that died or hung
        with no request out (a request that fails finds it sooner)."""
        while not (self._closing.is_set() or self._lost.is_set()):
            waits = {
                asyncio.create_task(self._closing.wait()),
                asyncio.create_task(self._lost.wait()),
            }
            every = PING_STDIO_SECS if self.block.command else PING_HTTP_SECS
            done, pending = await asyncio.wait(
                waits, timeout=every, return_when=asyncio.FIRST_COMPLETED
            )
            for task in pending:
                task.cancel()
            if done:
                return
            try:
                async with asyncio.timeout(PING_TIMEOUT_SECS):
                    await session.send_ping()
            except Exception as err:
                log.warning("%s: no answer to a ping (%s); reconnecting", self.path, say(err))
                return

    def _failed_open(self) -> None:
        self.failures += 1
        delay = min(BACKOFF_BASE_SECS * 2 ** (self.failures - 1), BACKOFF_MAX_SECS)
        self.retry_at = asyncio.get_running_loop().time() + delay

    def _restart_later(self) -> None:
        """A stdio server that was up and died is started again, after the backoff (a
        server that keeps dying is tried at most every BACKOFF_MAX_SECS)."""

        async def restart() -> None:
            if self._stopped:
                return
            try:
                await self.open()  # waits out the backoff
            except McpTrouble as err:  # `_hold` said why, once
                log.info("%s: restart failed: %s", self.path, err.message)

        self._restarting = asyncio.get_running_loop().create_task(restart())

    async def _on_message(self, message: Any) -> None:
        from mcp_types import ToolListChangedNotification

        if isinstance(message, ToolListChangedNotification):
            log.info("%s: the server's tool list changed", self.path)
            self.tools = None
        elif isinstance(message, Exception):
            log.warning("%s: transport error: %s", self.path, say(message))

    # -- requests ----------------------------------------------------------------------

    async def request(
        self, what: Callable[[ClientSession], Awaitable[Any]], *, afresh: bool = False
    ) -> Any:
        """Run one request on the session; a transport failure drops the session (the
        next request reconnects) and is a retryable trouble."""
        import httpx2
        from mcp.shared.exceptions import MCPError

        session = await self.open(afresh=afresh)
        try:
            return await what(session)
        except MCPError as err:
            trouble = self.witness.trouble(err)
            if trouble.unauthorized or transport_error(err):
                self._lost.set()
            raise trouble from None
        except (OSError, httpx2.HTTPError, EOFError) as err:
            self._lost.set()
            raise self.witness.trouble(err) from None
        except Exception as err:  # an answer the SDK could not read: garbage, a bad result
            raise McpTrouble(
                f"{self.path} answered something unreadable: {say(err)}", retryable=True
            ) from None

    async def list_tools(self, *, force: bool) -> list[dict[str, Any]]:
        """The server's tools (every page), from the cache unless `force` or it changed."""
        if self.tools is not None and not force and self.session is not None:
            return self.tools

        from mcp_types import PaginatedRequestParams

        async def listing(session: ClientSession) -> list[dict[str, Any]]:
            tools: list[dict[str, Any]] = []
            cursor: str | None = None
            while True:
                params = None if cursor is None else PaginatedRequestParams(cursor=cursor)
                page = await session.list_tools(params=params)
                tools.extend(
                    tool_of(t.model_dump(by_alias=True, exclude_none=True)) for t in page.tools
                )
                cursor = page.next_cursor
                if not cursor:
                    return tools

        self.tools = await self.request(listing, afresh=force)
        return self.tools

    async def close(self) -> None:
        """Close for good: no reopening after this."""
        self._stopped = True
        if self._restarting is not None:
            self._restarting.cancel()
        await self._drop()

    async def _drop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        self._closing.set()
        try:
            async with asyncio.timeout(10):
                await asyncio.shield(task)
        except (TimeoutError, Exception):  # ending it is all that is left
            task.cancel()


def tool_of(listed: dict[str, Any]) -> dict[str, Any]:
    """A listed tool as the log records it: name, description, input schema, annotations."""
    tool: dict[str, Any] = {"name": listed["name"]}
    if listed.get("description"):
        tool["description"] = listed["description"]
    if listed.get("inputSchema"):
        tool["input"] = listed["inputSchema"]
    notes = {
        k: v
        for k, v in (listed.get("annotations") or {}).items()
        if k in ("readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint")
    }
    if notes:
        tool["annotations"] = notes
    return tool
