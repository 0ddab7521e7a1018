"""Lines from the keyboard that never hold up Ctrl-C or an exit.

A line read in a worker thread (`asyncio.to_thread(sys.stdin.readline)`) cannot be
abandoned: the loop's executor joins the thread at exit, so Ctrl-C at a prompt waited
for Enter. Here a line is read on the event loop itself, when the descriptor says it is
ready, so a cancelled read leaves nothing behind. `subs chat`'s own message line keeps
readline's editing and history: `input()` runs in a daemon thread, which an exit never
waits for, and the terminal's settings are put back on the way out (`restore`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
from typing import Any

try:  # not on every platform; without it the terminal is simply left as it is
    import termios
except ImportError:  # pragma: no cover
    termios = None  # type: ignore[assignment]


class Keyboard:
    """Whole lines from one descriptor, read when it is ready; `asking` while a prompt waits."""

    def __init__(self, fd: int | None = None) -> None:
        self.fd = 0 if fd is None else fd  # stdin, even when sys.stdin was replaced
        self.buffer = b""
        self.ended = False
        self.asking = False
        self.stopped_asking = False  # the last prompt was cancelled (Ctrl-C) unanswered
        self.saved: Any = None
        if termios is not None and os.isatty(self.fd):
            with contextlib.suppress(termios.error):
                self.saved = termios.tcgetattr(self.fd)

    @property
    def is_terminal(self) -> bool:
        return os.isatty(self.fd)

    async def line(self) -> str | None:
        """The next line without its newline; None once the input has ended (Ctrl-D)."""
        while b"\n" not in self.buffer and not self.ended:
            await self._readable()
            chunk = os.read(self.fd, 65536)
            if chunk:
                self.buffer += chunk
            else:
                self.ended = True
        if b"\n" in self.buffer:
            head, _, self.buffer = self.buffer.partition(b"\n")
        elif self.buffer:
            head, self.buffer = self.buffer, b""
        else:
            return None
        return head.decode(errors="replace").removesuffix("\r")

    async def ask(self, prompt: str) -> str | None:
        """`prompt` on stderr, then a line; `asking` says a person is being asked."""
        sys.stderr.write(prompt)
        sys.stderr.flush()
        self.asking, self.stopped_asking = True, False
        try:
            return await self.line()
        except asyncio.CancelledError:
            self.stopped_asking = True
            raise
        finally:
            self.asking = False

    async def _readable(self) -> None:
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()

        def wake() -> None:
            if not ready.done():
                ready.set_result(None)

        try:
            loop.add_reader(self.fd, wake)
        except (PermissionError, ValueError, OSError):
            return  # a regular file (epoll takes none): a read never blocks on one
        try:
            await ready
        finally:
            loop.remove_reader(self.fd)

    async def edited_line(self, prompt: str) -> str | None:
        """A line with readline's editing, on a terminal; None at Ctrl-D. Elsewhere `line`."""
        if not self.is_terminal:
            sys.stderr.write(prompt)
            sys.stderr.flush()
            return await self.line()
        loop = asyncio.get_running_loop()
        done: asyncio.Future[str | None] = loop.create_future()

        def settle(value: str | None) -> None:
            if not done.done():
                done.set_result(value)

        def read() -> None:
            try:
                value: str | None = input(prompt)
            except (EOFError, OSError, ValueError):
                value = None
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits
                loop.call_soon_threadsafe(settle, value)

        threading.Thread(target=read, name="subs-keyboard", daemon=True).start()
        return await done

    def restore(self) -> None:
        """The terminal as it was at the start: readline may be part-way through a line."""
        if self.saved is not None and termios is not None:
            with contextlib.suppress(termios.error):
                termios.tcsetattr(self.fd, termios.TCSADRAIN, self.saved)


_KEYBOARD: Keyboard | None = None


def keyboard() -> Keyboard:
    """The process's one keyboard: its buffer holds what was typed ahead of a prompt."""
    global _KEYBOARD
    if _KEYBOARD is None:
        _KEYBOARD = Keyboard()
    return _KEYBOARD
