"""`rediss://` works the same: a turn through the real engine on a TLS redis-server, and
on a TLS Redis Cluster (3 masters) found from one node's URL, the certificate checked
against its CA. The wheel's redis-server has no TLS; Debian's (package redis-tools, which
.ci/run installs when missing) has, under the name redis-check-rdb: run as redis-server,
it is the server."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import textwrap
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from redis import Redis

from engine.client import Client
from engine.config import parse_project
from engine.runtime.engine import Engine
from engine.store.store import RedisCluster, connect
from tests.engine_helpers import ENV, assert_consistent, poll_until, turn_ended, wait_for_event
from tests.fakes.llm_vendor import FakeVendor, Text

DEBIAN_REDIS = Path("/usr/bin/redis-check-rdb")
REDIS_CLI = shutil.which("redis-cli")
if not DEBIAN_REDIS.exists() or REDIS_CLI is None:
    pytest.skip(
        "the TLS tests need a redis-server built with TLS: Debian's redis-tools "
        "(apt-get install redis-tools; .ci/run installs it)",
        allow_module_level=True,
    )


def _free_ports(n: int) -> list[int]:
    import socket

    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


class TlsRedis:
    """TLS redis-server processes (one, or a cluster's masters) in a folder of the test's,
    with a certificate made for 127.0.0.1 and its CA."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.procs: list[subprocess.Popen[bytes]] = []
        self.binary = folder / "redis-server"
        self.binary.symlink_to(DEBIAN_REDIS)
        self.cert, self.key = folder / "cert.pem", folder / "key.pem"
        subprocess.run(
            [
                *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
                *("-keyout", str(self.key), "-out", str(self.cert), "-subj", "/CN=localhost"),
                *("-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
            ],
            check=True,
            capture_output=True,
        )

    def url(self, port: int) -> str:
        return f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={self.cert}"

    def start(self, port: int, *, cluster_port: int | None = None) -> None:
        node = self.folder / f"node-{port}"
        node.mkdir()
        args = [str(self.binary), "--port", "0", "--tls-port", str(port)]
        args += ["--tls-cert-file", str(self.cert), "--tls-key-file", str(self.key)]
        args += ["--tls-ca-cert-file", str(self.cert), "--tls-auth-clients", "no"]
        args += ["--appendonly", "yes", "--appendfsync", "always", "--save", ""]
        args += ["--dir", str(node), "--bind", "127.0.0.1"]
        if cluster_port is not None:  # its own bus port (port + 10000 may not exist)
            args += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
            args += ["--cluster-port", str(cluster_port), "--cluster-node-timeout", "2000"]
            args += ["--tls-cluster", "yes", "--tls-replication", "yes"]
        log = open(node / "log", "wb")  # noqa: SIM115  (closed with the process)
        self.procs.append(subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT))

    def client(self, port: int) -> Redis:
        return Redis(host="127.0.0.1", port=port, ssl=True, ssl_ca_certs=str(self.cert))

    def answering(self, port: int) -> bool:
        try:
            with self.client(port) as r:
                return bool(r.ping())
        except Exception:  # not up yet
            return False

    def stop(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()


@pytest.fixture
def tls(tmp_path: Path) -> Iterator[TlsRedis]:
    servers = TlsRedis(tmp_path)
    try:
        yield servers
    finally:
        servers.stop()


async def _up(tls: TlsRedis, port: int) -> None:
    async def up() -> bool:
        return await asyncio.to_thread(tls.answering, port)

    await poll_until(up, 20, f"the TLS redis-server on {port}")


@pytest.fixture
async def single(tls: TlsRedis) -> AsyncIterator[str]:
    [port] = _free_ports(1)
    tls.start(port)
    await _up(tls, port)
    yield tls.url(port)


@pytest.fixture
async def cluster(tls: TlsRedis) -> AsyncIterator[str]:
    free = _free_ports(6)
    ports = free[:3]
    for port, bus in zip(ports, free[3:], strict=True):
        tls.start(port, cluster_port=bus)
    for port in ports:
        await _up(tls, port)
    made = await asyncio.to_thread(
        subprocess.run,
        [REDIS_CLI, "--tls", "--cacert", str(tls.cert), "--cluster", "create"]
        + [f"127.0.0.1:{p}" for p in ports]
        + ["--cluster-yes"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert made.returncode == 0, made.stdout + made.stderr

    async def ok() -> bool:
        def states() -> set[str]:
            found = set()
            for port in ports:
                with tls.client(port) as r:
                    info = r.execute_command("CLUSTER", "INFO")
                    found.add("ok" if b"cluster_state:ok" in info else "not yet")
            return found

        return await asyncio.to_thread(states) == {"ok"}

    await poll_until(ok, 30, "the TLS cluster to serve every slot")
    yield tls.url(ports[0])


def _project(vendor: FakeVendor, tmp_path: Path):  # type: ignore[no-untyped-def]
    text = textwrap.dedent(
        f"""\
        [llm.openai]
        type = "openai"
        base_url = "{vendor.url}/v1"

        [agent.oncall]
        llm = "openai"
        model = "gpt-4.1-mini"
        system = "You are terse."
        """
    )
    return parse_project(text, str(tmp_path / "subs.toml"), env={})


async def _a_turn(url: str, vendor: FakeVendor, tmp_path: Path) -> type:
    redis = connect(url)
    engine = Engine(_project(vendor, tmp_path), redis, env=ENV, lease_ms=3000)
    await engine.start()
    try:
        client = Client(engine.store)
        sessions = []
        for n in range(6):  # sessions on several partitions: on a cluster, several masters
            vendor.push(Text(f"Answer {n}."))
            reply = await client.submit(
                {
                    "type": "client.message",
                    "agent_id": "oncall",
                    "message": {"role": "user", "content": f"question {n}"},
                }
            )
            end = await wait_for_event(client, reply["session_id"], turn_ended(reply["turn_id"]))
            assert end["payload"]["type"] == "turn.completed"
            sessions.append(reply["session_id"])
        for sid in sessions:
            await assert_consistent(engine.store, sid)
    finally:
        await engine.stop()
        await redis.aclose()
    return type(redis)


async def test_a_turn_on_a_tls_redis_server(single: str, vendor: FakeVendor, tmp_path: Path):
    assert await _a_turn(single, vendor, tmp_path) is not RedisCluster


async def test_a_turn_on_a_tls_redis_cluster_found_from_one_node(
    cluster: str, vendor: FakeVendor, tmp_path: Path
):
    assert await _a_turn(cluster, vendor, tmp_path) is RedisCluster
