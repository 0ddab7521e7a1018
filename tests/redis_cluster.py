"""A real Redis Cluster on loopback for tests: 3 masters + 3 replicas of the project's own
redis-server, created with the `redis-cli --cluster create` next to it.

Node timeouts are short (1 s) so a failover takes a second or two, not fifteen; every
wait polls the cluster's own view (CLUSTER INFO / CLUSTER NODES), never a fixed sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from redis import Redis as SyncRedis
from redis.exceptions import RedisError

from engine.store.embedded import die_with_parent, find_redis_server

NODE_TIMEOUT_MS = 1000


def _free_port() -> int:
    """A loopback port whose cluster-bus port (+10000) is free too."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port + 10000 > 65535:
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port


def _poll(predicate: object, timeout: float, what: str) -> None:
    """Poll a sync predicate until true; fails naming what it waited for."""
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)  # polling interval of a deadline-bound poll, not synchronisation


@dataclass
class Node:
    port: int
    dir: Path
    proc: subprocess.Popen[bytes] | None = None

    def client(self) -> SyncRedis:
        return SyncRedis(port=self.port, socket_timeout=2, socket_connect_timeout=2)

    def answers(self) -> bool:
        try:
            with self.client() as c:
                return bool(c.ping())
        except (RedisError, OSError):
            return False

    def info(self, section: str) -> dict[str, str]:
        with self.client() as c:
            raw = c.execute_command("CLUSTER", "INFO") if section == "cluster" else None
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        return dict(line.split(":", 1) for line in text.split() if ":" in line)


@dataclass
class LocalCluster:
    """Six redis-server processes joined into one cluster (one replica per master)."""

    root: Path
    nodes: list[Node] = field(default_factory=list)

    @property
    def url(self) -> str:
        """A URL naming one node, as a user would configure it."""
        return f"redis://127.0.0.1:{self.nodes[0].port}"

    def start(self) -> LocalCluster:
        binary = find_redis_server()
        cli = Path(binary).with_name("redis-cli")
        if not cli.is_file():
            raise RuntimeError(f"no redis-cli next to {binary}: cannot create a cluster")
        for i in range(6):
            node = Node(_free_port(), self.root / f"node{i}")
            node.dir.mkdir(parents=True, exist_ok=True)
            self.nodes.append(node)
            self._spawn(node, binary)
        for node in self.nodes:
            _poll(node.answers, 10, f"redis-server on port {node.port}")
        subprocess.run(
            [str(cli), "--cluster", "create"]
            + [f"127.0.0.1:{n.port}" for n in self.nodes]
            + ["--cluster-replicas", "1", "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        self.wait_healthy()
        return self

    @staticmethod
    def _spawn(node: Node, binary: str) -> None:
        args = [
            binary,
            "--port", str(node.port),
            "--bind", "127.0.0.1",
            "--dir", str(node.dir),
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
            # A replica cut off from its master for long still takes over when it dies.
            "--cluster-replica-validity-factor", "0",
            "--appendonly", "yes",
            "--appendfsync", "always",  # what the engine asks by default ([store] fsync)
            "--save", "",
            "--daemonize", "no",
            "--logfile", str(node.dir / "redis.log"),
        ]  # fmt: skip
        node.proc = subprocess.Popen(
            args,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=die_with_parent(),  # a killed test run leaves no node behind
        )

    def stop(self) -> None:
        for node in self.nodes:
            if node.proc is not None and node.proc.poll() is None:
                node.proc.terminate()
        for node in self.nodes:
            if node.proc is not None:
                try:
                    node.proc.wait(10)
                except subprocess.TimeoutExpired:
                    node.proc.kill()
                    node.proc.wait()
                node.proc = None

    # -- the cluster's own view ---------------------------------------------------------

    def live(self) -> list[Node]:
        return [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]

    def topology(self) -> dict[int, tuple[str, int | None]]:
        """port -> (role, master's port for a replica), as a live node sees it."""
        for node in self.live():
            try:
                with node.client() as c:
                    raw = c.execute_command("CLUSTER", "NODES")
            except (RedisError, OSError):
                continue
            text = raw.decode() if isinstance(raw, bytes) else str(raw)
            ids: dict[str, int] = {}
            rows = [line.split() for line in text.splitlines() if line.strip()]
            for row in rows:
                ids[row[0]] = int(row[1].split("@")[0].rsplit(":", 1)[1])
            out: dict[int, tuple[str, int | None]] = {}
            for row in rows:
                flags = row[2].split(",")
                if "fail" in flags or "fail?" in flags:
                    continue
                port = ids[row[0]]
                if "master" in flags:
                    out[port] = ("master", None)
                elif "slave" in flags:
                    out[port] = ("replica", ids.get(row[3]))
            return out
        return {}

    def masters(self) -> list[Node]:
        roles = self.topology()
        return [n for n in self.live() if roles.get(n.port, ("", None))[0] == "master"]

    def replica_of(self, master: Node) -> Node:
        roles = self.topology()
        for node in self.live():
            if roles.get(node.port) == ("replica", master.port):
                return node
        raise AssertionError(f"master {master.port} has no live replica")

    def healthy(self) -> bool:
        """Every live node says the cluster is ok, and sees 3 masters each with a replica."""
        try:
            if any(n.info("cluster").get("cluster_state") != "ok" for n in self.live()):
                return False
        except (RedisError, OSError):
            return False
        roles = self.topology()
        masters = [p for p, (role, _) in roles.items() if role == "master"]
        replicas = [m for role, m in roles.values() if role == "replica"]
        if len(masters) != 3 or sorted(replicas) != sorted(masters):
            return False
        return all(
            self._in_sync(n) for n in self.live() if roles.get(n.port, ("",))[0] == "replica"
        )

    @staticmethod
    def _in_sync(replica: Node) -> bool:
        """The replica's link to its master is up and its initial sync is done."""
        try:
            with replica.client() as c:
                info = c.info("replication")
        except (RedisError, OSError):
            return False
        return info.get("master_link_status") == "up" and not info.get("master_sync_in_progress")

    def revive(self) -> None:
        """Start again any node that is not running (a test killed it, say)."""
        for node in self.nodes:
            if node.proc is None or node.proc.poll() is not None:
                self._spawn(node, find_redis_server())
                _poll(node.answers, 10, f"redis-server {node.port} again")

    def wait_healthy(self, timeout: float = 30) -> None:
        _poll(self.healthy, timeout, "the cluster to be ok with 3 masters and 3 replicas")

    def flush(self) -> None:
        """Empty every master (replicas follow) and wait until each replica is empty too."""
        for node in self.masters():
            with node.client() as c:
                c.flushall()
                c.execute_command("WAIT", 1, 2000)

    # -- failures -------------------------------------------------------------------------

    def failover(self, master: Node) -> Node:
        """A graceful CLUSTER FAILOVER of `master` to its replica; returns the new master."""
        replica = self.replica_of(master)

        def promoted() -> bool:
            return self.topology().get(replica.port, ("", None))[0] == "master"

        # A manual failover Redis gives up on (it waits for the replica to catch up, for
        # at most a few seconds) is asked for again, up to 30 s in all.
        deadline = time.monotonic() + 30
        while True:
            with replica.client() as c:
                c.execute_command("CLUSTER", "FAILOVER")
            try:
                _poll(promoted, 6, f"replica {replica.port} to take over from {master.port}")
                break
            except AssertionError:
                if time.monotonic() > deadline:
                    raise
        self.wait_healthy()
        return replica

    async def kill(self, master: Node) -> Node:
        """SIGKILL `master`, wait for its replica's promotion, start it again (it comes back
        as the replica); returns the new master. The waits run in a thread (the caller's
        loop keeps serving); the restart is made from the caller's thread, as a thread
        that ends takes the children it started with it (die_with_parent)."""
        replica = self.replica_of(master)
        assert master.proc is not None
        os.kill(master.proc.pid, signal.SIGKILL)
        await asyncio.to_thread(master.proc.wait)
        master.proc = None
        await asyncio.to_thread(
            _poll,
            lambda: (
                self.topology().get(replica.port, ("", None))[0] == "master"
                and replica.info("cluster").get("cluster_state") == "ok"
            ),
            30,
            f"replica {replica.port} to be promoted after master {master.port} was killed",
        )
        self._spawn(master, find_redis_server())
        await asyncio.to_thread(_poll, master.answers, 10, f"redis-server {master.port} again")
        await asyncio.to_thread(self.wait_healthy)
        return replica


@contextlib.contextmanager
def running_cluster(root: Path):  # type: ignore[no-untyped-def]
    cluster = LocalCluster(root)
    try:
        yield cluster.start()
    finally:
        cluster.stop()
