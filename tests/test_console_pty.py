"""What `subs run` shows on a terminal: a pseudo-terminal, since the status line and
the prompts only appear when stdout and stderr are TTYs (pipes get JSON lines)."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import signal
import sys
import termios
from collections.abc import AsyncIterator
from pathlib import Path

from engine.cli.terminal import Printer
from tests.engine_helpers import ENV, ROOT
from tests.fakes.llm_vendor import Text, ToolCalls

STATUS = "\x1b[2K"  # how the status line starts each redraw


class Terminal:
    """`subs` with a pseudo-terminal for stdin, stdout and stderr; `screen` is all it wrote."""

    def __init__(self) -> None:
        self.master, self.slave = os.openpty()
        self.screen = ""
        self.proc: asyncio.subprocess.Process | None = None
        self._more = asyncio.Event()

    async def start(self, *args: str, ctty: bool = False) -> Terminal:
        """`ctty`: the pty is the child's controlling terminal, so a typed Ctrl-C (`\\x03`)
        is a SIGINT from the terminal, as at a person's keyboard."""
        env = {**os.environ, **ENV, "PYTHONPATH": str(ROOT)}
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "engine.cli",
            *args,
            env=env,
            stdin=self.slave,
            stdout=self.slave,
            stderr=self.slave,
            start_new_session=ctty,
            preexec_fn=_take_the_terminal if ctty else None,
        )
        os.close(self.slave)
        asyncio.get_running_loop().add_reader(self.master, self._read)
        return self

    def _read(self) -> None:
        try:
            data = os.read(self.master, 65536)
        except OSError:  # the child closed its side
            data = b""
        if not data:
            asyncio.get_running_loop().remove_reader(self.master)
        self.screen += data.decode(errors="replace")
        self._more.set()

    async def expect(self, text: str, timeout: float = 20.0) -> int:
        """Wait until `text` is on screen; returns where it ends."""
        async with asyncio.timeout(timeout):
            while text not in self.screen:
                self._more.clear()
                await self._more.wait()
        return self.screen.index(text) + len(text)

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    async def close(self) -> int:
        assert self.proc is not None
        if self.proc.returncode is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.proc.wait(), 20)
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)
            await self.proc.wait()
        asyncio.get_running_loop().remove_reader(self.master)
        os.close(self.master)
        return self.proc.returncode


def _take_the_terminal() -> None:
    """In the child, a session leader by now: its stdin (the pty) becomes its terminal."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


@contextlib.asynccontextmanager
async def terminal(*args: str, ctty: bool = False) -> AsyncIterator[Terminal]:
    term = await Terminal().start(*args, ctty=ctty)
    try:
        yield term
    finally:
        await term.close()


async def test_the_status_line_leaves_a_client_tool_prompt_alone(config: Path, vendor):
    vendor.push(ToolCalls([("confirm", {"question": "Restart the db?"})]), Text("Restarted."))
    async with terminal("run", "ops_openai", "fix it", "-c", str(config)) as term:
        prompted = await term.expect("confirm: Restart the db?\r\n> ")
        # The status line redraws every 0.1 s while a step runs: a second is ten chances
        # for it to write over the prompt. (A window to look in, not a wait for an event.)
        await asyncio.sleep(1.0)
        assert STATUS not in term.screen[prompted:], repr(term.screen[prompted:])
        term.type("yes\n")
        await term.expect("Restarted.")
    assert term.proc is not None and term.proc.returncode == 0, term.screen


def test_the_status_line_names_the_running_tool_not_its_call_id():
    master, slave = os.openpty()
    try:
        with open(slave, "w", closefd=True) as tty:
            printer = Printer(tty, False, tty)
            requested = {
                "type": "tool.call.requested",
                "id": "call_0123",
                "name": "lookup",
                "handler": "worker",
                "arguments": "{}",
            }
            printer.event({"payload": requested})
            printer.event({"payload": {"type": "tool.call.dispatched", "id": "call_0123"}})
            printer.tick()
        screen = _read_to_the_end(master)
    finally:
        os.close(master)
    status = screen.rsplit(STATUS, 1)[1]
    assert "tool lookup" in status and "call_0123" not in status, repr(screen)


def _read_to_the_end(master: int) -> str:
    """All a closed pty's other side wrote: the kernel hands it over in pieces (a flip
    buffer pushed by a worker), so one read may see only part; the end is EIO."""
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the slave side is closed and everything was read
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    writer.close()


class Cutter:
    """A loopback TCP proxy to the API that can drop every open connection at once."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.writers: list[asyncio.StreamWriter] = []
        self.tasks: set[asyncio.Task[None]] = set()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.writers += [writer, up_writer]
        for pipe in (_pipe(reader, up_writer), _pipe(up_reader, writer)):
            task = asyncio.create_task(pipe)
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    def cut(self) -> None:
        writers, self.writers = self.writers, []
        for writer in writers:
            writer.transport.abort()


async def test_a_reconnect_mid_stream_prints_no_text_twice(vendor, serve_processes):
    words = [f"w{n:02d}" for n in range(40)]
    vendor.push(Text(" ".join(words), chunk_delay=0.05))
    serve = await serve_processes()
    cutter = Cutter(int(serve.api.rsplit(":", 1)[1]))
    server = await asyncio.start_server(cutter._accept, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        async with terminal("run", "ops_openai", "count", "--url", url) as term:
            await term.expect("w05")
            cutter.cut()  # the event stream drops; the client resumes after its last event
            await term.expect("w39")
        assert term.proc is not None and term.proc.returncode == 0, term.screen
    finally:
        cutter.cut()
        server.close()
        await server.wait_closed()
    shown = term.screen.replace(STATUS, " ").split()
    for word in words:
        assert sum(word in chunk for chunk in shown) == 1, (word, term.screen)
