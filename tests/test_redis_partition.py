"""A network partition: Redis stops answering on the engine's connections, never closing them.

Between `subs serve` and its redis-server sits a TCP proxy on loopback. Frozen, it
swallows every byte on the connections it has (as a partition does: no reset, no
answer); thawed, it serves new connections while the old ones stay dead. The engine
must notice its dead connections (its pool has a socket timeout), take new ones, and
finish the turn submitted meanwhile — not hang on them forever.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from engine.client import Client
from engine.store.embedded import EmbeddedRedis
from engine.store.store import Store, connect
from tests.engine_helpers import EngineProcess, poll_until, turn_ended, wait_for_event
from tests.fakes.llm_vendor import Text


class Blackhole:
    """A TCP proxy to a unix-socket Redis whose connections can be made to go silent."""

    def __init__(self, socket_path: Path) -> None:
        self.socket_path = socket_path
        self.frozen = False
        self.dead: set[asyncio.StreamWriter] = set()  # connections that will never answer
        self.tasks: set[asyncio.Task[None]] = set()
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    def freeze(self) -> None:
        """Every connection open now goes silent, for good."""
        self.frozen = True

    def thaw(self) -> None:
        """New connections are served again; the frozen ones stay dead."""
        self.frozen = False

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_unix_connection(str(self.socket_path))
        for src, dst, me in ((reader, up_writer, writer), (up_reader, writer, writer)):
            task = asyncio.create_task(self._pipe(src, dst, me))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _pipe(
        self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, client: asyncio.StreamWriter
    ) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await src.read(65536):
                if self.frozen:
                    self.dead.add(client)
                if client in self.dead:
                    continue  # swallowed: no answer, no close
                dst.write(data)
                await dst.drain()

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


def _say(text: str) -> dict:
    message = {"role": "user", "content": text}
    return {"type": "client.message", "agent_id": "ops_openai", "message": message}


async def test_a_partition_from_redis_is_waited_out_not_hung_on(tmp_path, vendor, config):
    vendor.default = Text("answered")
    server = EmbeddedRedis(tmp_path / "redis")
    direct_url = server.start()
    proxy = Blackhole(server.socket_path)
    await proxy.start()
    serve = await EngineProcess(config, f"redis://127.0.0.1:{proxy.port}/0").start()
    redis = connect(direct_url)  # the test's own view, around the proxy
    try:
        client = Client(await Store.open(redis))
        first = await client.submit(_say("before"))
        sid = first["session_id"]
        await wait_for_event(client, sid, turn_ended(first["turn_id"]), timeout=30)

        proxy.freeze()
        during = asyncio.create_task(client.submit(_say("during"), session_id=sid))

        async def went_silent() -> bool:
            return len(proxy.dead) >= 2  # the engine's work read among them

        await poll_until(went_silent, 10, "the engine's connections to go silent")
        proxy.thaw()
        second = await during
        try:
            end = await wait_for_event(client, sid, turn_ended(second["turn_id"]), timeout=60)
        except TimeoutError:
            serve.kill()
            assert serve.proc is not None
            await serve.proc.wait()
            await serve.drained()
            raise AssertionError(serve.log_tail()) from None
        assert end["payload"]["type"] == "turn.completed", end
        assert serve.proc is not None and serve.proc.returncode is None
    finally:
        await redis.aclose()
        await serve.stop()
        await proxy.stop()
        server.stop()
