"""How an MCP connection's failures read: each becomes one `McpTrouble`, retryable or
not, worded for the failed attempt's error (which the API, the console and Slack show).

A refused credential is known by its HTTP status (the SDK turns a 401/403 into a
generic JSON-RPC error, so a response hook notes the status first) and is not retried.
A stdio server's stderr goes to our log under the connection's name with its last lines
kept: when the server exits before it answers, its exit code and those lines are the
error. The connection (connection.py) holds one `Witness` and asks it what went wrong.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import deque
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any, TextIO, cast

from engine.config import McpBlock
from engine.errors import SubsError

if TYPE_CHECKING:  # the SDK is loaded only when a connection is declared (connection.py)
    import httpx2
    from mcp.shared.exceptions import MCPError

log = logging.getLogger("subs.mcp")

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


class Witness:
    """What one connection saw of its server going wrong, and the `McpTrouble` a failure
    reads as with it: the HTTP status that refused the credential, and a stdio server's
    stderr and process (for its exit code and its last words)."""

    def __init__(self, block: McpBlock) -> None:
        self.block = block
        self.refused: int | None = None  # the last HTTP status that refused the credential
        self._errlog: _ErrLog | None = None  # the running stdio server's stderr
        self._child: Any = None  # its process, as the SDK's transport holds it

    @property
    def path(self) -> str:
        """The connection's name in errors: `mcp.<id>`."""
        return self.block.path

    def stderr(self, stack: AsyncExitStack) -> TextIO:
        """The stderr the SDK hands a stdio server it starts (closed with `stack`)."""
        self._errlog, self._child = _ErrLog(self.path, stack), None
        return cast(TextIO, self._errlog)

    def saw_transport(self, transport: Any) -> None:
        """The transport is open: a stdio server's process is kept for its exit code."""
        self._child = _child_of(transport) if self.block.command else None

    async def saw_response(self, response: httpx2.Response) -> None:
        """The HTTP transport's response hook: notes a status that refused the credential."""
        if response.status_code in (401, 403):
            self.refused = response.status_code

    async def last_words(self, err: BaseException) -> McpTrouble:
        """The trouble that ended an open; for a stdio server that exited, its exit code
        and the end of its stderr (read to its end first: the child may still be writing)."""
        from mcp.shared.exceptions import MCPError

        trouble = self.trouble(err)
        errlog, child = self._errlog, self._child
        if errlog is None or not self.block.command:
            return trouble
        await errlog.drained(STDERR_DRAIN_SECS)
        leaf = _leaf(err)
        code = getattr(child, "returncode", None)
        if isinstance(leaf, MCPError) and transport_error(leaf) and code is not None:
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

    def trouble(self, err: BaseException) -> McpTrouble:
        """How `err` reads; a refused credential noted since is said once, then forgotten."""
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
            return McpTrouble(f"{self.path} refused the request: {say(err)}", retryable=False)
        if isinstance(err, FileNotFoundError | PermissionError):
            return McpTrouble(
                f"{self.path}: cannot start {self.block.command[0] if self.block.command else ''}"
                f": {say(err)}",
                retryable=True,
            )
        return McpTrouble(f"{self.path}: {say(err)}", retryable=True)


def transport_error(err: MCPError) -> bool:
    """Whether the SDK's error is the connection's own failure (its code, or "closed"),
    not the server's answer to the request: the session is dropped for it."""
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


def say(err: BaseException) -> str:
    """An error as an McpTrouble or our log says it: a group's errors joined, each cut."""
    if isinstance(err, BaseExceptionGroup):
        return "; ".join(say(e) for e in err.exceptions)
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
