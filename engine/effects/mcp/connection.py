"""One MCP connection per `[mcp.<id>]` block per engine process, through the official SDK.

A connection opens lazily, on the first sync or call that needs it, and holds one MCP
session: a task of its own owns the SDK's transport and `ClientSession` (anyio scopes
must be entered and left by one task), and every request of the engine uses that
session. A server that dies or drops the connection is reconnected on the next request,
after a backoff that grows with each failure in a row; a stdio server is also restarted
in the background once it has been up. Its stderr goes to our log under the
connection's name, and when it exits before it answers, its exit code and the last lines
of its stderr are the failed attempt's error (said once in our log, not every attempt).

Two traps of the SDK (README "MCP"): a stdio child gets almost none of our environment
(only `env` and `env_from` reach it), and an HTTP 401/403 comes back from the SDK as a
generic JSON-RPC error, so the status is caught by an httpx2 response hook first.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any, TextIO, cast

from engine.config import McpBlock
from engine.errors import SubsError

# The MCP SDK (and its httpx2) is a quarter of what `subs serve` imports, and most projects
# declare no connection: it is loaded by `load_sdk` when one is declared, and the imports
# below each use are then only lookups.
if TYPE_CHECKING:
    import httpx2
    from mcp import ClientSession
    from mcp.shared.exceptions import MCPError

log = logging.getLogger("subs.mcp")

OPEN_TIMEOUT_SECS = 55.0  # starting a child (npx may fetch) or reaching a server, and initialize
BACKOFF_BASE_SECS = 0.5
BACKOFF_MAX_SECS = 30.0
# A connected server is pinged this often: a local child that died is restarted within
# seconds, a remote server costs a request now and then.
PING_STDIO_SECS = 2.0
PING_HTTP_SECS = 15.0
PING_TIMEOUT_SECS = 10.0
# What a stdio server that exits leaves in its failed attempt's error: its last lines of
# stderr, each cut to a line's worth, and how long its stderr may stay open after it ended.
STDERR_TAIL_LINES = 5
STDERR_LINE_CHARS = 200
STDERR_DRAIN_SECS = 2.0


class McpTrouble(SubsError):
    """A sync or call that failed: `retryable`, and `unauthorized` for a refused credential."""

    code = "handler_error"

    def __init__(self, message: str, *, retryable: bool, unauthorized: bool = False) -> None:
        super().__init__(message, retryable=retryable)
        self.unauthorized = unauthorized


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
        self.refused: int | None = None  # the last HTTP status that refused the credential
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
        self._errlog: _ErrLog | None = None  # the running stdio server's stderr
        self._child: Any = None  # its process, as the SDK's transport holds it

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
                f"{self.path} could not be opened: {_say(err)}", retryable=True
            ) from None

    async def _hold(self, opened: asyncio.Future[ClientSession]) -> None:
        """Own the transport and the session until closed or lost."""
        from mcp import ClientSession

        try:
            async with AsyncExitStack() as stack:
                transport = self._transport(stack)
                read, write = await stack.enter_async_context(transport)
                self._child = _child_of(transport) if self.block.command else None
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
                    opened.set_exception(self._trouble(err))
                raise
            try:
                trouble = await self._with_last_words(err)
            except BaseException:  # cancelled while reading its stderr: still answer the wait
                if not opened.done():
                    opened.set_exception(self._trouble(err))
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
                log.warning("%s: no answer to a ping (%s); reconnecting", self.path, _say(err))
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

    def _transport(self, stack: AsyncExitStack) -> Any:
        import httpx2
        from mcp.client.stdio import StdioServerParameters, stdio_client
        from mcp.client.streamable_http import streamable_http_client

        block = self.block
        if block.command:
            env = dict(block.env)
            for name in block.env_from:
                if self.env.get(name):
                    env[name] = self.env[name]
            argv, cwd = block.argv(self.env), block.workdir(self.env, self.base_dir)
            params = StdioServerParameters(command=argv[0], args=argv[1:], env=env, cwd=cwd)
            self._errlog, self._child = _ErrLog(self.path, stack), None
            return stdio_client(params, errlog=cast(TextIO, self._errlog))
        headers: dict[str, str] = {}
        if block.token_env:
            token = self.env.get(block.token_env) or ""
            if block.header:
                headers[block.header] = token
            else:
                headers["Authorization"] = f"Bearer {token}"
        client = httpx2.AsyncClient(
            headers=headers,
            timeout=httpx2.Timeout(30.0, read=300.0),
            event_hooks={"response": [self._saw_response]},
        )
        stack.push_async_callback(client.aclose)
        assert block.url is not None
        return streamable_http_client(block.url, http_client=client)

    async def _saw_response(self, response: httpx2.Response) -> None:
        if response.status_code in (401, 403):
            self.refused = response.status_code

    async def _on_message(self, message: Any) -> None:
        from mcp_types import ToolListChangedNotification

        if isinstance(message, ToolListChangedNotification):
            log.info("%s: the server's tool list changed", self.path)
            self.tools = None
        elif isinstance(message, Exception):
            log.warning("%s: transport error: %s", self.path, _say(message))

    async def _with_last_words(self, err: BaseException) -> McpTrouble:
        """The trouble that ended an open; for a stdio server that exited, its exit code
        and the end of its stderr (read to its end first: the child may still be writing)."""
        from mcp.shared.exceptions import MCPError

        trouble = self._trouble(err)
        errlog, child = self._errlog, self._child
        if errlog is None or not self.block.command:
            return trouble
        await errlog.drained(STDERR_DRAIN_SECS)
        leaf = _leaf(err)
        code = getattr(child, "returncode", None)
        if isinstance(leaf, MCPError) and _transport_error(leaf) and code is not None:
            # It closed the connection and is gone: its own exit, not our stopping it.
            said = f"exited with code {code}" if code >= 0 else f"was ended by signal {-code}"
            head = f"{self.path}: its server {said}"
        elif errlog.tail:
            head = trouble.message
        else:
            return trouble
        tail = " | ".join(errlog.tail)
        words = f"; its stderr ended: {tail}" if tail else "; it wrote nothing to stderr"
        return McpTrouble(
            head + words, retryable=trouble.retryable, unauthorized=trouble.unauthorized
        )

    def _trouble(self, err: BaseException) -> McpTrouble:
        if isinstance(err, McpTrouble):
            return err
        if self.refused is not None:
            status, self.refused = self.refused, None
            return McpTrouble(
                f"{self.path} refused the credential (HTTP {status})"
                + (f"; check {self.block.token_env}" if self.block.token_env else ""),
                retryable=False,
                unauthorized=True,
            )
        code = getattr(getattr(err, "error", None), "code", None)
        if code in (-32600, -32601, -32602):  # invalid request, no such method, bad params
            return McpTrouble(f"{self.path} refused the request: {_say(err)}", retryable=False)
        if isinstance(err, FileNotFoundError | PermissionError):
            return McpTrouble(
                f"{self.path}: cannot start {self.block.command[0] if self.block.command else ''}"
                f": {_say(err)}",
                retryable=True,
            )
        return McpTrouble(f"{self.path}: {_say(err)}", retryable=True)

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
            trouble = self._trouble(err)
            if trouble.unauthorized or _transport_error(err):
                self._lost.set()
            raise trouble from None
        except (OSError, httpx2.HTTPError, EOFError) as err:
            self._lost.set()
            raise self._trouble(err) from None
        except Exception as err:  # an answer the SDK could not read: garbage, a bad result
            raise McpTrouble(
                f"{self.path} answered something unreadable: {_say(err)}", retryable=True
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


def _transport_error(err: MCPError) -> bool:
    code = getattr(getattr(err, "error", None), "code", None)
    return code in (-32000, -32603) or "closed" in str(err).lower()


def _leaf(err: BaseException) -> BaseException:
    """The one error inside nested task-group errors (the SDK's transports wrap theirs)."""
    while isinstance(err, BaseExceptionGroup) and len(err.exceptions) == 1:
        err = err.exceptions[0]
    return err


def _child_of(transport: Any) -> Any:
    """The process the SDK's stdio transport started, for its exit code. The SDK keeps it
    to itself, a local of its context manager's generator: read there while the transport
    is open; None if a later SDK hides it otherwise (the error then has no exit code)."""
    frame = getattr(getattr(transport, "gen", None), "ag_frame", None)
    return None if frame is None else frame.f_locals.get("process")


def _say(err: BaseException) -> str:
    if isinstance(err, BaseExceptionGroup):
        return "; ".join(_say(e) for e in err.exceptions)
    text = str(err) or type(err).__name__
    return text if len(text) < 300 else text[:300] + "..."


class _ErrLog:
    """A stdio server's stderr, a line at a time into our log under the connection's name
    (the SDK hands the child a file: this is a pipe's write end, read by a task); its last
    lines are kept to say why it ended."""

    def __init__(self, path: str, stack: AsyncExitStack) -> None:
        self.path = path
        self.tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        read_fd, self._write_fd = os.pipe()
        self._file = os.fdopen(self._write_fd, "w")
        self._reader = asyncio.get_running_loop().create_task(self._read(read_fd))
        stack.callback(self._file.close)

    def fileno(self) -> int:
        return self._write_fd

    def write(self, text: str) -> int:
        return self._file.write(text)

    def flush(self) -> None:
        self._file.flush()

    async def _read(self, fd: int) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb")
        )
        try:
            while line := await reader.readline():
                text = line.decode("utf-8", "replace").rstrip()
                log.info("[%s] %s", self.path, text)
                if text.strip():
                    self.tail.append(_cut(text.strip(), STDERR_LINE_CHARS))
        finally:
            transport.close()

    async def drained(self, timeout: float) -> None:
        """Until every line is read (the child and ours closed their ends), or `timeout`:
        a grandchild may hold the pipe open."""
        await asyncio.wait({self._reader}, timeout=timeout)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
