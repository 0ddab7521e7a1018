"""subs on a real Redis Cluster (3 masters + 3 replicas of the project's redis-server).

Every Lua script the project has runs here with its keys on every master (a script or
multi-key command whose keys span slots fails with CROSSSLOT), the partitions spread
over the masters, and a master failing over mid-turn is a fault the engine waits out.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import zlib
from collections import Counter
from importlib.resources import files

import pytest
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

from bot.turns.checkpoint import Checkpoint
from bot.turns.store import BUCKETS, Checkpoints, Slots, seen_key
from engine.client import Client
from engine.config import parse_project
from engine.machine.policies import BucketRef, BudgetPolicy
from engine.runtime.engine import Engine
from engine.store.buckets import use_key
from engine.store.index import Cursor, IndexWrite, scopes_of
from engine.store.retention import REMOVED
from engine.store.store import Commit, Store, cluster_enabled, connect, spread_tags
from tests.engine_helpers import (
    ENV,
    assert_consistent,
    make_project,
    project_toml,
    subs,
    turn_ended,
    wait_for_event,
)
from tests.fakes.llm_vendor import Text
from tests.redis_cluster import LocalCluster

on_cluster = pytest.mark.parametrize("redis_url", ["cluster"], indirect=True)

SCRIPT_DIRS = ("engine.store", "bot.turns")


def _scripts() -> dict[str, str]:
    """Every Lua script of the project: its file -> its SHA1 (the name Redis caches it by)."""
    out = {}
    for package in SCRIPT_DIRS:
        for path in (files(package) / "lua").iterdir():
            if path.name.endswith(".lua"):
                out[f"{package}/{path.name}"] = hashlib.sha1(path.read_bytes()).hexdigest()
    return out


def _masters_holding(cluster: LocalCluster, pattern: str) -> set[int]:
    found = set()
    for node in cluster.masters():
        with node.client() as c:
            if next(iter(c.scan_iter(match=pattern, count=1000)), None) is not None:
                found.add(node.port)
    return found


def _checkpoint(channel: str, n: int) -> Checkpoint:
    return Checkpoint(
        agent="ops",
        team="T1",
        channel=channel,
        thread_ts=f"{n}.000001",
        turn_id=f"slack-{n}",
        user="U1",
        payload=None,
    )


@on_cluster
def test_a_cluster_node_url_is_detected(redis_url: str, redis_server: str) -> None:
    assert cluster_enabled(redis_url)
    assert not cluster_enabled(redis_server)  # the embedded one (a unix socket)
    assert not cluster_enabled("redis://127.0.0.1:1")  # nothing there: taken as single
    assert isinstance(connect(redis_url), RedisCluster)


def test_partition_tags_fall_in_equal_shares_of_the_slots() -> None:
    for n in (3, 16, 48):
        tags = spread_tags(n)
        shares = [key_slot(t.encode()) * n // 16384 for t in tags]
        assert shares == list(range(n))


@on_cluster
async def test_every_script_runs_on_the_cluster_with_keys_on_every_master(
    redis_url: str, redis_cluster: LocalCluster
) -> None:
    redis = connect(redis_url)
    try:
        store = await Store.open(redis, 16)
        assert store.tags != [str(p) for p in range(16)]
        # Engine scripts, on every partition: meta (open), acquire, renew, commit,
        # release, delete.
        leases = {p: await store.acquire(p, "me", 10_000) for p in range(store.partitions)}
        assert all(leases.values())
        assert await store.renew({p: v for p, v in leases.items() if v}, 10_000) == []
        by_partition: dict[int, str] = {}
        n = 0
        while len(by_partition) < store.partitions:
            sid = f"ses_{n:04d}"
            by_partition.setdefault(store.partition_of(sid), sid)
            n += 1
        for p, sid in by_partition.items():
            lease = leases[p]
            assert lease is not None
            event = b'{"seq":1}'
            ix = IndexWrite(1, 2, 3, scopes_of("oncall", True))  # the listing indexes too
            c = Commit(
                sid, 0, 1, (event,), b'{"identity":{}}', created_ms=1, inflight=True, index=ix
            )
            await store.commit(p, lease, c, [{"call_id": "c", "text": "x"}])
            assert await store.committed_seq(sid) == 1
        # The admin list's page script on every partition (a first page, then a cursor's).
        first = await store.index_page("last_event_desc", ("t",), 10, None)
        assert len(first.items) == 10 and first.more
        cursor = Cursor("last_event_desc", "", 0, first.marks, 2.0, first.items[-1][0])
        rest = await store.index_page("last_event_desc", ("t",), 100, cursor)
        assert len(first.items) + len(rest.items) == store.partitions
        gone = next(iter(by_partition.values()))
        assert await store.delete_session(gone, 1)
        # Retention's scripts: a quiet session (nothing in flight) archived away whole, then
        # written back from its archive.
        quiet = "ses_quiet"
        qp = store.partition_of(quiet)
        lease = leases[qp]
        assert lease is not None
        c = Commit(quiet, 0, 1, (b'{"seq":1}',), b'{"identity":{}}', created_ms=1)
        await store.commit(qp, lease, c, [])
        assert await store.remove_session(quiet, 1) == REMOVED
        assert await store.committed_seq(quiet) == 0  # nothing of it left
        assert await store.restore_session(quiet, [b'{"seq":1}'], b'{"identity":{}}', 1)
        assert await store.committed_seq(quiet) == 1
        assert await store.index_session(
            quiet, 1, created_ms=1, last_ms=1, wake_ms=None, scopes=("t",)
        )
        for p, lease in leases.items():
            assert lease is not None
            await store.release(p, lease)
        # The bot's scripts, on channels of every bucket: start, claim, write, renew, release.
        checkpoints = Checkpoints(redis, "me", 10_000)
        channels: dict[int, str] = {}
        n = 0
        while len(channels) < BUCKETS:
            channel = f"C{n:05d}"
            channels.setdefault(zlib.crc32(channel.encode()) % BUCKETS, channel)
            n += 1
        for i, channel in enumerate(channels.values()):
            cp = _checkpoint(channel, i)
            assert await checkpoints.start([seen_key("event", f"Ev{i}")], 60, cp)
            assert not await checkpoints.start([seen_key("event", f"Ev{i}")], 60, cp)  # dedupe
            await checkpoints.save(cp)
            assert await checkpoints.renew(cp)
            await checkpoints.release(cp)
            assert await checkpoints.claim(cp) is not None
            await checkpoints.drop(cp)
        assert await checkpoints.open() == []
        # The bot's turn slots: taken, kept, left.
        slots = Slots(redis, 10_000)
        assert (await slots.take("oncall", "me T1", 1))[0]
        assert not (await slots.take("oncall", "me T2", 1))[0]  # the one slot is taken
        await slots.keep("oncall", ["me T1", "me T2"])
        await slots.leave("oncall", "me T1")
        assert (await slots.take("oncall", "me T2", 1))[0]
        await slots.leave("oncall", "me T2")
        # Reads that fan out over partitions and over nodes.
        assert len(await store.list_sessions(limit=100)) == store.partitions  # -gone +quiet
        assert len(await store.last_events(list(by_partition.values()))) == store.partitions
        assert await store.heartbeat("me", 2**40, 0) == 1
        # Budget buckets (charge.lua), on buckets of every master: each counted once, read
        # back and listed (the read and the index span slots).
        policy = BudgetPolicy("p", ("user",), "total_tokens", "100", "1h", 3_600_000, "reject")
        refs: dict[int, BucketRef] = {}
        n = 0
        while len(refs) < 3:
            ref = BucketRef(policy, f"user=u{n}")
            refs.setdefault(redis.get_node_from_key(use_key(ref.id)).port, ref)
            n += 1
        now = 1_800_000_000_000
        for ref in refs.values():
            bucket = {"id": ref.id, "policy": "p", "group": ref.group}
            bucket |= {"dimension": "total_tokens", "limit": "100", "amount": 7}
            bucket |= {"window_ms": 3_600_000, "slot_ms": policy.slot_ms}
            charge = {"id": f"s/{ref.id}/1", "at": now, "buckets": [bucket]}
            assert await store.charge(charge, now) == 1
            assert await store.charge(charge, now) == 0
        uses = await store.read_buckets(list(refs.values()), now)
        assert [u.used for u in uses] == ["7", "7", "7"]
        assert len(await store.list_buckets(now)) == 3
    finally:
        await redis.aclose()

    masters = {node.port for node in redis_cluster.masters()}
    assert len(masters) == 3
    for name in ("log:*", "snap:*", "deltas:*", "sessions", "inflight"):
        assert _masters_holding(redis_cluster, f"subs:{{*}}:{name}") == masters, name
    assert _masters_holding(redis_cluster, "subs:slack:{*}:seen:*") == masters
    cached: Counter[str] = Counter()
    for node in redis_cluster.masters():
        with node.client() as c:
            shas = _scripts()
            for name, exists in zip(shas, c.script_exists(*shas.values()), strict=True):
                cached[name] += bool(exists)
    assert set(cached) == set(_scripts())
    missing = [name for name, count in cached.items() if count == 0]
    assert not missing, f"scripts never run on the cluster: {missing}"


@on_cluster
async def test_partitions_land_on_every_master(
    redis_url: str, vendor, tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    """`[store] partitions = 48` on 3 masters: 16 each. A later engine configured
    otherwise keeps the stored count, and says so."""
    text = project_toml(vendor.url) + "\n[store]\npartitions = 48\n"
    redis = connect(redis_url)
    engine = Engine(parse_project(text, str(tmp_path / "subs.toml"), env={}), redis, env=ENV)
    await engine.start()
    try:
        assert isinstance(redis, RedisCluster)
        owners = Counter(
            redis.get_node_from_key(engine.store.work_key(p)).name
            for p in range(engine.store.partitions)
        )
        assert sorted(owners.values()) == [16, 16, 16]
        later = Engine(make_project(tmp_path, vendor.url), redis, env=ENV)
        await later.start()
        await later.stop()
        assert later.store.partitions == 48
        assert "this Redis keeps 48 partitions" in caplog.text
    finally:
        await engine.stop()
        await redis.aclose()


@on_cluster
async def test_a_master_failing_over_mid_turn_loses_and_repeats_nothing(
    redis_url: str, redis_cluster: LocalCluster, vendor, tmp_path
) -> None:
    """Graceful failover of every master, then a SIGKILL of one, while turns run: each
    turn ends, each log is gapless with snapshot == fold."""
    redis = connect(redis_url)
    project = make_project(
        tmp_path, vendor.url, retry="retry = { llm = { backoff_base_secs = 0 } }"
    )
    engine = Engine(project, redis, env=ENV, lease_ms=3000)
    await engine.start()
    try:
        client = Client(engine.store)
        # Every call gets the same answer: a lease that lapses while a master pauses for
        # its failover makes the engine send a call again (attempt n+1).
        vendor.default = Text("answer", chunks=3)
        sids = []
        for round_ in range(4):
            replies = [
                await client.submit(
                    {
                        "type": "client.message",
                        "agent_id": "ops_openai",
                        "message": {"role": "user", "content": f"q{round_}"},
                    },
                    identity={"issuer": "cli"},
                    **({"session_id": sids[i]} if sids else {}),
                )
                for i in range(3)
            ]
            if not sids:
                sids = [r["session_id"] for r in replies]
            masters = redis_cluster.masters()
            if round_ < 3:
                await asyncio.to_thread(redis_cluster.failover, masters[round_ % len(masters)])
            else:
                await redis_cluster.kill(masters[0])
            for sid, reply in zip(sids, replies, strict=True):
                end = await wait_for_event(client, sid, turn_ended(reply["turn_id"]), timeout=60)
                assert end["payload"]["type"] == "turn.completed", end
        for sid in sids:
            events = await assert_consistent(engine.store, sid)
            kinds = [e["payload"]["type"] for e in events]
            assert kinds.count("turn.started") == kinds.count("turn.completed") == 4
    finally:
        await engine.stop()
        await redis.aclose()


@on_cluster
async def test_check_reports_the_clusters_shape(redis_url: str, config) -> None:
    code, out, err = await subs("check", "-c", str(config), "--redis", redis_url)
    assert code == 0, err
    [line] = [json.loads(x) for x in out.splitlines()]
    assert line == {
        "redis_cluster": {"state": "ok", "masters": 3, "replicas": 3, "slots": 16384, "failing": 0}
    }
    # No URL, or one that is not a cluster: nothing is said of Redis.
    code, out, err = await subs("check", "-c", str(config))
    assert (code, out) == (0, ""), err


async def test_a_store_from_before_spread_tags_keeps_its_keys(redis) -> None:
    """A Redis whose first engine predates spread tags (a count, no scheme) keeps `{p}`;
    a new one gets the spread tags, on one server as on a cluster."""
    await redis.hset("subs:meta", "partitions", 8)
    old = await Store.open(redis, 16)
    assert old.partitions == 8 and old.log_key("s") == f"subs:{{{old.partition_of('s')}}}:log:s"
    await redis.delete("subs:meta")
    new = await Store.open(redis, 16)
    assert new.tags == spread_tags(16) and (await redis.hget("subs:meta", "tags")) == b"spread"
