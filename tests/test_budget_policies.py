"""`[[budgets]]` policies through the engine (issue #28 item 2): a real Redis, the fake
vendor over loopback, an injected clock for the windows. The Slack per-user test is
test_budget_policies_slack.py; the SIGKILL one is in test_budget_policies_process.py."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from engine.cli.sessions import _dead_letter_line
from engine.client import Client
from engine.config import ConfigError, parse_project
from engine.machine.policies import BucketRef, buckets_for, context_of
from engine.runtime.engine import Engine
from engine.store.buckets import seen_key, use_key
from tests.engine_helpers import (
    ENV,
    assert_consistent,
    on_both_redis,
    payloads,
    poll_until,
    project_toml,
    turn_ended,
    wait_for_event,
)
from tests.fakes.llm_vendor import FakeVendor, Text, ToolCalls
from tests.test_budget_policies_slack import PER_USER

HOUR_MS = 3_600_000
# An answer of 400 words: the fake vendor counts a word an output token, so one call
# spends a 300-token bucket whatever the prompt (its input is characters / 4 + 1).
LONG = "word " * 400
T0 = 1_800_000_000.0  # the injected clock's start (seconds): a fixed point, not now


class Clock:
    """The engine's clock, moved by the test (windows roll over without sleeping)."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def policies_toml(vendor: FakeVendor, budgets: str) -> str:
    return project_toml(vendor.url) + "\n" + textwrap.dedent(budgets)


async def start(
    redis: Any, vendor: FakeVendor, tmp_path: Path, budgets: str, clock: Clock
) -> Engine:
    path = tmp_path / "subs.toml"
    path.write_text(policies_toml(vendor, budgets))
    project = parse_project(path.read_text(), str(path), env={})
    engine = Engine(project, redis, env=ENV, lease_ms=3000, clock=clock)
    await engine.start()
    return engine


async def turn(
    client: Client, agent: str, text: str, *, user: str = "alice", session: str | None = None
) -> tuple[str, dict[str, Any]]:
    body = {
        "type": "client.message",
        "agent_id": agent,
        "message": {"role": "user", "content": text},
    }
    identity = {"subject": {"issuer": "cli", "id": user}, "metadata": {}}
    reply = await client.submit(body, session_id=session, identity=identity)
    sid, turn_id = reply["session_id"], reply["turn_id"]
    return sid, await wait_for_event(client, sid, turn_ended(turn_id), timeout=30)


async def bucket_units(redis: Any, ref: BucketRef) -> int:
    fields = await redis.hgetall(use_key(ref.id))
    return sum(int(v) for k, v in fields.items() if not k.startswith(b"_"))


def ref_of(engine: Engine, sid: str, agent: str, user: str = "alice") -> BucketRef:
    identity = {"subject": {"issuer": "cli", "id": user}}
    [ref] = buckets_for(engine.project.budgets, context_of(sid, agent, identity))
    return ref


PER_AGENT = """\
[[budgets]]
name = "openai-hourly"
group_by = ["agent"]
match = { agent = "ops_openai" }
dimension = "total_tokens"
limit = 300
window = "1h"
"""


@on_both_redis
async def test_a_per_agent_policy_stops_the_turn_that_would_cross_it_while_another_agent_runs(
    redis, vendor, tmp_path
):
    clock = Clock()
    vendor.default = Text(LONG)
    engine = await start(redis, vendor, tmp_path, PER_AGENT, clock)
    try:
        client = Client(engine.store)
        sid1, end = await turn(client, "ops_openai", "hi")
        assert end["payload"]["type"] == "turn.completed", end["payload"]
        used = end["payload"]["usage"]["total"]
        assert used > 300
        ref = ref_of(engine, sid1, "ops_openai")
        assert ref.group == "agent=ops_openai"
        # Counted once the outbox is relayed, a moment after the commit.
        await poll_until(
            lambda: _equals(bucket_units(redis, ref), used), 10, "the first call charged"
        )
        # Another session of the same agent: the bucket spans sessions, and it is spent,
        # so the next call is not made.
        sent = len(vendor.requests)
        sid2, end = await turn(client, "ops_openai", "hi again " * 20)
        assert end["payload"]["type"] == "turn.failed"
        error = end["payload"]["error"]
        assert error["code"] == "budget_exceeded"
        detail = error["detail"]
        assert detail["policy"] == "openai-hourly" and detail["group"] == "agent=ops_openai"
        assert detail["allowed"] == "300" and detail["spent"] == str(used)
        assert detail["frees_at"] is not None  # when the first call leaves the window
        assert "openai-hourly" in error["message"] and "frees up at" in error["message"]
        assert len(vendor.requests) == sent  # the call never reached the vendor
        events = await assert_consistent(engine.store, sid2)
        assert payloads(events, "llm.call.requested") == []
        # The other agent is in no bucket of this policy: it still runs.
        _, end = await turn(client, "ops_anthropic", "hi")
        assert end["payload"]["type"] == "turn.completed"
    finally:
        await engine.stop()


async def _equals(value: Any, expected: Any) -> bool:
    return await value == expected


async def _is(value: bool) -> bool:
    return value


async def test_a_window_rolls_over_with_the_clock(redis, vendor, tmp_path):
    clock = Clock()
    vendor.default = Text(LONG)
    budgets = PER_AGENT
    engine = await start(redis, vendor, tmp_path, budgets, clock)
    try:
        client = Client(engine.store)
        sid, end = await turn(client, "ops_openai", "hi")
        assert end["payload"]["type"] == "turn.completed"
        ref = ref_of(engine, sid, "ops_openai")
        used = end["payload"]["usage"]["total"]
        await poll_until(lambda: _equals(bucket_units(redis, ref), used), 10, "the charge")
        clock.now += 30 * 60  # half an hour on: still in the window
        _, end = await turn(client, "ops_openai", "hi")
        assert end["payload"]["type"] == "turn.failed"
        frees_at = end["payload"]["error"]["detail"]["frees_at"]
        clock.now += 31 * 60  # past the first call's hour: the window has rolled over
        _, end = await turn(client, "ops_openai", "hi")
        assert end["payload"]["type"] == "turn.completed", end["payload"]
        assert frees_at <= _iso(clock.now)
        # Expiring with its window: the bucket's keys carry a TTL no longer than it.
        ttl = await redis.pttl(use_key(ref.id))
        assert 0 < ttl <= HOUR_MS + ref.policy.slot_ms
        assert 0 < await redis.pttl(seen_key(ref.id)) <= HOUR_MS + ref.policy.slot_ms
    finally:
        await engine.stop()


def _iso(seconds: float) -> str:
    from engine.machine import iso

    return iso(int(seconds * 1000))


async def test_a_charge_applied_twice_counts_once(redis, vendor, tmp_path):
    """The relay may apply a charge again (a crash between the bucket and the outbox's
    delete, two relays after a lease moved): the bucket counts each call attempt once."""
    clock = Clock()
    engine = await start(redis, vendor, tmp_path, PER_AGENT, clock)
    try:
        ref = ref_of(engine, "ses_x", "ops_openai")
        charge = {
            "id": "ses_x/llm_1/1",
            "at": int(T0 * 1000),
            "buckets": [
                {
                    "id": ref.id,
                    "policy": ref.policy.name,
                    "group": ref.group,
                    "dimension": "total_tokens",
                    "limit": "300",
                    "window_ms": HOUR_MS,
                    "slot_ms": ref.policy.slot_ms,
                    "amount": 7,
                }
            ],
        }
        now = int(T0 * 1000)
        assert await engine.store.charge(charge, now) == 1
        assert await engine.store.charge(charge, now + 1000) == 0
        assert await bucket_units(redis, ref) == 7
        # Another attempt of the same call is another charge.
        assert await engine.store.charge({**charge, "id": "ses_x/llm_1/2"}, now) == 1
        assert await bucket_units(redis, ref) == 14
        # One already out of the window is not counted at all.
        late = {**charge, "id": "ses_x/llm_2/1"}
        assert await engine.store.charge(late, now + HOUR_MS + 2 * ref.policy.slot_ms) == 0
        [listed] = await engine.store.list_buckets(now)
        assert (listed.policy, listed.group, listed.used, listed.limit) == (
            "openai-hourly",
            "agent=ops_openai",
            "14",
            "300",
        )
    finally:
        await engine.stop()


async def test_a_retried_commit_and_a_relay_that_failed_halfway_count_once(redis, vendor, tmp_path):
    """A commit whose answer was lost is recognised and not written again (apply.py), so
    its charge is in the outbox once; the relay then applies it to the bucket but fails to
    drop it from the outbox (Redis went away), so it applies it again: counted once."""
    clock = Clock()
    vendor.default = Text("fine")
    engine = await start(redis, vendor, tmp_path, PER_AGENT.replace("300", "100000"), clock)
    try:
        store = engine.store
        real = store.commit
        lost = {"n": 0}

        async def commit_then_lose_the_answer(p, lease, c, deltas):
            lose = any(b'"llm.call.completed"' in e for e in c.events) and not lost["n"]
            if lose:  # counted first: the turn's end is readable once Redis ran the commit
                lost["n"] += 1
            await real(p, lease, c, deltas)
            if lose:
                raise ConnectionError("the answer was lost with the connection")

        store.commit = commit_then_lose_the_answer  # type: ignore[method-assign]
        real_done, real_charge = store.outbox_done, store.charge
        applied: list[int] = []

        async def charge(message, now_ms):
            applied.append(await real_charge(message, now_ms))
            return applied[-1]

        async def done_fails_once(p, entry_id):
            if len(applied) == 1:
                raise RedisConnectionError("Redis went away before the outbox entry was dropped")
            await real_done(p, entry_id)

        store.charge = charge  # type: ignore[method-assign]
        store.outbox_done = done_fails_once  # type: ignore[method-assign]
        client = Client(store)
        sid, end = await turn(client, "ops_openai", "hi")
        assert end["payload"]["type"] == "turn.completed", end["payload"]
        assert lost["n"] == 1
        ref = ref_of(engine, sid, "ops_openai")
        used = end["payload"]["usage"]["total"]
        await poll_until(lambda: _is(len(applied) == 2), 10, "the charge applied again")
        assert applied == [1, 0]  # the second time, the bucket had counted it already
        assert await bucket_units(redis, ref) == used
        events = await assert_consistent(store, sid)
        assert len(payloads(events, "llm.call.completed")) == 1
        assert await redis.zcard(seen_key(ref.id)) == 1
        assert await redis.xlen(store.outbox_key(store.partition_of(sid))) == 0
    finally:
        await engine.stop()


INTERRUPT = """\
[[budgets]]
name = "per-user"
group_by = ["user"]
dimension = "total_tokens"
limit = 300
window = "5m"
strategy = "interrupt"
"""


async def test_the_interrupt_strategy_asks_and_an_approval_lets_the_turn_go_on(
    redis, vendor, tmp_path
):
    clock = Clock()
    vendor.default = Text(LONG)
    engine = await start(redis, vendor, tmp_path, INTERRUPT, clock)
    try:
        client = Client(engine.store)
        sid, end = await turn(client, "ops_openai", "hi", user="bob")
        assert end["payload"]["type"] == "turn.completed"
        ref = ref_of(engine, sid, "ops_openai", "bob")
        assert ref.group == "user=cli:bob"
        used = end["payload"]["usage"]["total"]
        await poll_until(lambda: _equals(bucket_units(redis, ref), used), 10, "the charge")
        sent = len(vendor.requests)
        body = {
            "type": "client.message",
            "agent_id": "ops_openai",
            "message": {"role": "user", "content": "more"},
        }
        reply = await client.submit(body, session_id=sid)
        asked = await wait_for_event(
            client, sid, lambda e: e["payload"]["type"] == "session.interrupted"
        )
        p = asked["payload"]
        assert p["origin"] == "budget"
        meta = p["payload"]["metadata"]
        assert meta["policy"] == "per-user" and meta["limit"] == "policy:per-user"
        assert (
            "per-user" in p["payload"]["message"]
            and "continue with another" in (p["payload"]["message"])
        )
        assert len(vendor.requests) == sent  # held, not sent
        resume = {
            "type": "interrupt.resume",
            "interrupt_id": p["interrupt_id"],
            "payload": {"value": "approve"},
        }
        assert (await client.submit(resume, session_id=sid))["resumed"] is True
        end = await wait_for_event(client, sid, turn_ended(reply["turn_id"]))
        assert end["payload"]["type"] == "turn.completed"
        assert len(vendor.requests) == sent + 1
        await assert_consistent(engine.store, sid)
        # The raise was this turn's only: the next turn asks again.
        reply = await client.submit(body, session_id=sid)
        asked = await wait_for_event(
            client,
            sid,
            lambda e: (
                e["payload"]["type"] == "session.interrupted"
                and e.get("turn_id") == reply["turn_id"]
            ),
        )
        resume["interrupt_id"] = asked["payload"]["interrupt_id"]
        resume["payload"] = {"value": "decline"}
        await client.submit(resume, session_id=sid)
        end = await wait_for_event(client, sid, turn_ended(reply["turn_id"]))
        assert end["payload"]["type"] == "turn.failed"
        assert end["payload"]["error"]["code"] == "budget_exceeded"
        assert end["payload"]["error"]["detail"]["policy"] == "per-user"
    finally:
        await engine.stop()


# -- the file ---------------------------------------------------------------------------

BASE = """\
[llm.main]
type = "openai"

[agent.a]
llm = "main"
model = "gpt-4.1-mini"

[[budgets]]
"""
GOOD = {
    "name": '"n"',
    "dimension": '"total_tokens"',
    "limit": "10",
    "window": '"1h"',
}


def _entry(**over: str | None) -> str:
    fields = {**GOOD, **over}
    return BASE + "".join(f"{k} = {v}\n" for k, v in fields.items() if v is not None)


@pytest.mark.parametrize(
    ("text", "key", "says"),
    [
        (_entry(name=None), "budgets.0.name", "required"),
        (_entry(name='"a b"'), "budgets.0.name", ""),
        (_entry(dimension='"dollars"'), "budgets.0.dimension", "total_tokens"),
        (_entry(limit="0"), "budgets.0.limit", "greater than 0"),
        (_entry(limit="1.5"), "budgets.0.limit", "whole number"),
        (_entry(limit='"10"'), "budgets.0.limit", ""),
        (_entry(window='"1w"'), "budgets.0.window", "5m"),
        (_entry(window='"0h"'), "budgets.0.window", "more than 0"),
        (_entry(window=None), "budgets.0.window", "required"),
        (_entry(strategy='"ask"'), "budgets.0.strategy", "reject"),
        (_entry(group_by='["team"]'), "budgets.0.group_by.0", "agent"),
        (_entry(group_by='["user", "user"]'), "budgets.0.group_by", "twice"),
        (_entry(match='{ model = "x" }'), "budgets.0.match.model", ""),
        (_entry(match='{ agent = "nope" }'), "budgets.0.match.agent", "no agent 'nope'"),
        (_entry(extra="1"), "budgets.0.extra", ""),
        (
            _entry() + "[[budgets]]\n" + "".join(f"{k} = {v}\n" for k, v in GOOD.items()),
            "budgets.1.name",
            "another",
        ),
    ],
)
def test_a_wrong_budgets_entry_is_one_error_naming_its_key(text: str, key: str, says: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_project(text, "subs.toml", env={})
    assert e.value.key == key, str(e.value)
    assert says in str(e.value)


def test_a_good_entry_builds_the_machines_policy() -> None:
    text = _entry(group_by='["user", "channel"]', match='{ agent = "a" }', strategy='"interrupt"')
    [policy] = parse_project(text, "subs.toml", env={}).budgets
    assert policy.group_by == ("user", "channel") and policy.match == (("agent", "a"),)
    assert policy.window_ms == HOUR_MS and policy.strategy == "interrupt"
    assert policy.slot_ms == HOUR_MS // 60


def test_a_cost_policy_over_an_unpriced_model_is_refused() -> None:
    from engine.effects.llm.prices import unpriced

    text = _entry(dimension='"cost_usd"').replace("gpt-4.1-mini", "my-model")
    project = parse_project(text, "subs.toml", env={})
    [(key, why)] = unpriced(project)
    assert key == "budgets.0.dimension" and "my-model" in why
    priced = text.replace(
        'type = "openai"', 'type = "openai"\nprices = { "my-model" = { input = 1, output = 2 } }'
    )
    assert unpriced(parse_project(priced, "subs.toml", env={})) == []


# -- shown ------------------------------------------------------------------------------


async def test_the_buckets_are_shown_to_the_admin_api_and_sessions_list(
    redis, vendor, tmp_path, capsys
):
    import httpx

    from engine.api.app import make_app
    from engine.api.auth import ApiKeys
    from engine.cli.sessions import _print_sessions
    from engine.metrics import Metrics
    from tests.api_helpers import ALICE, KEYS_ENV, ROOT, auth, serve

    clock = Clock()
    vendor.default = Text(LONG)
    engine = await start(redis, vendor, tmp_path, PER_AGENT, clock)
    try:
        client = Client(engine.store, policies=engine.project.budgets)
        sid, end = await turn(client, "ops_openai", "hi")
        used = end["payload"]["usage"]["total"]
        ref = ref_of(engine, sid, "ops_openai")
        await poll_until(lambda: _equals(bucket_units(redis, ref), used), 10, "the charge")
        keys = ApiKeys.from_env(KEYS_ENV)
        app = make_app(
            client, engine.store, keys=keys, metrics=Metrics(), max_body=65536, heartbeat=0.2
        )
        async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=10) as http:
            listed = (await http.get("/api/admin/budgets", headers=auth(ROOT))).json()
            [bucket] = listed["budgets"]
            assert bucket["policy"] == "openai-hourly" and bucket["group"] == "agent=ops_openai"
            assert bucket["used"] == str(used) and bucket["limit"] == "300"
            assert bucket["window_ms"] == HOUR_MS
            # Spent (the clock is the test's, the API's is real: frees_at is the first
            # call's sub-bucket plus the window, whatever the reader's time).
            assert bucket["frees_at"] is not None
            refused = await http.get("/api/admin/budgets", headers=auth(ALICE))
            assert refused.status_code == 403 and refused.json()["code"] == "forbidden"
            rows = (await http.get("/api/admin/sessions", headers=auth(ROOT))).json()["items"]
            [row] = [r for r in rows if r["session_id"] == sid]
            [mine] = row["budgets"]
            assert (mine["policy"], mine["used"], mine["limit"]) == (
                "openai-hourly",
                str(used),
                "300",
            )
        _print_sessions([row], jsonl=False)
        out = capsys.readouterr().out
        assert f"budget openai-hourly (agent=ops_openai): {used} of 300 tokens" in out
    finally:
        await engine.stop()


async def test_subs_check_names_a_wrong_budgets_key_and_an_unpriced_cost_policy(
    tmp_path: Path, vendor: FakeVendor
) -> None:
    from tests.engine_helpers import subs

    config = tmp_path / "subs.toml"
    config.write_text(policies_toml(vendor, PER_AGENT.replace('window = "1h"', 'window = "1w"')))
    code, out, err = await subs("check", "-c", str(config), env=ENV)
    assert code != 0 and "budgets.0.window" in out + err and '"5m"' in out + err
    unpriced = PER_AGENT.replace('"total_tokens"', '"cost_usd"')
    text = policies_toml(vendor, unpriced).replace('model = "gpt-4.1-mini"', 'model = "my-model"')
    config.write_text(text)
    code, out, err = await subs("check", "-c", str(config), env=ENV)
    assert code != 0 and "budgets.0.dimension" in out + err and "my-model" in out + err
    config.write_text(policies_toml(vendor, unpriced))
    code, out, err = await subs("check", "-c", str(config), env=ENV)
    assert code == 0, out + err


async def test_a_subagents_spend_counts_toward_the_person_who_started_the_root_session(
    redis, vendor, tmp_path
):
    """A per-user bucket: the child session's calls are charged to the root session's
    person (the child's own subject is its parent session), and a spent bucket stops the
    child's call too."""
    from tests.test_subagents import last_role, system_of

    text = textwrap.dedent(
        f"""\
        [llm.openai]
        type = "openai"
        base_url = "{vendor.url}/v1"

        [agent.lead]
        llm = "openai"
        model = "gpt-4.1-mini"
        system = "You lead."
        subagents = ["agent.helper"]

        [agent.helper]
        llm = "openai"
        model = "gpt-4.1-mini"
        system = "You help."

        [[budgets]]
        name = "per-user"
        group_by = ["user"]
        dimension = "total_tokens"
        limit = 100000
        window = "1h"
        """
    )

    def model(body: dict):
        if system_of(body) == "You help.":
            return Text("helped " * 50)
        if last_role(body) == "tool":
            return Text("lead done")
        return ToolCalls([("helper", {"message": "please"})])

    vendor.responder = model
    path = tmp_path / "subs.toml"
    path.write_text(text)
    engine = Engine(parse_project(text, str(path), env={}), redis, env=ENV, clock=Clock())
    await engine.start()
    try:
        client = Client(engine.store)
        sid, end = await turn(client, "lead", "go", user="carol")
        assert end["payload"]["type"] == "turn.completed", end["payload"]
        identity = {"subject": {"issuer": "cli", "id": "carol"}}
        [ref] = buckets_for(engine.project.budgets, context_of(sid, "lead", identity))
        assert ref.group == "user=cli:carol"
        # The parent's two calls and the child's one, all in carol's bucket.
        await poll_until(lambda: _equals(redis.zcard(seen_key(ref.id)), 3), 10, "3 charges")
        events = await engine.store.read_log(sid)
        [child_done] = payloads(events, "subagent.completed")
        parent_calls = payloads(events, "llm.call.completed")
        child_total = child_done["usage"]["total"]
        assert child_total > 50
        own = sum(p["usage"]["total"] for p in parent_calls)
        assert await bucket_units(redis, ref) == own + child_total
        # The listing shows the child in carol's bucket too.
        page = await Client(engine.store, policies=engine.project.budgets).list_page(
            session_id=f"{sid}~{child_done['tool_call_id']}"
        )
        [child_row] = page["items"]
        assert [b["group"] for b in child_row["budgets"]] == ["user=cli:carol"]
    finally:
        await engine.stop()


@on_both_redis
async def test_a_queued_turns_first_call_is_checked_against_its_own_submitters_bucket(
    redis, vendor, tmp_path
):
    """Bob's turn queued behind Alice's starts in the step that ends hers, and makes its
    first model call in that same step: it is checked against Bob's spent bucket, not
    against Alice's (the turn running before the step)."""
    clock = Clock()
    vendor.push(
        Text(LONG),  # Bob spends his bucket in another session
        ToolCalls([("confirm", {})], ids=["ask"]),  # Alice's turn waits on its client tool
        Text("ok"),  # and ends; Bob's queued turn must get nothing more
    )
    vendor.default = Text("a call that should not have been made")
    engine = await start(redis, vendor, tmp_path, PER_USER, clock)
    try:
        client = Client(engine.store)
        other, end = await turn(client, "ops_openai", "hi", user="bob")
        assert end["payload"]["type"] == "turn.completed"
        bob = ref_of(engine, other, "ops_openai", "bob")
        await poll_until(lambda: _at_least(bucket_units(redis, bob), 300), 10, "bob charged")

        body = {"type": "client.message", "agent_id": "ops_openai"}
        said = {**body, "message": {"role": "user", "content": "is the db ok?"}}
        alice = {"subject": {"issuer": "cli", "id": "alice"}, "metadata": {}}
        first = await client.submit(said, identity=alice)
        sid = first["session_id"]
        await wait_for_event(client, sid, lambda e: e["payload"]["type"] == "tool.call.dispatched")
        asked = {**body, "message": {"role": "user", "content": "and the cache?"}, "queue": True}
        as_bob = {"subject": {"issuer": "cli", "id": "bob"}, "metadata": {}}
        queued = await client.submit(asked, session_id=sid, identity=as_bob)
        assert queued["queued"] is True
        sent = len(vendor.requests)
        await client.submit({"type": "tool.result", "id": "ask", "result": "yes"}, session_id=sid)
        done = await wait_for_event(client, sid, turn_ended(first["turn_id"]))
        assert done["payload"]["type"] == "turn.completed"
        end = await wait_for_event(client, sid, turn_ended(queued["turn_id"]))
        assert end["payload"]["type"] == "turn.failed", end["payload"]
        detail = end["payload"]["error"]["detail"]
        assert detail["group"] == "user=cli:bob" and int(detail["spent"]) > 300
        assert len(vendor.requests) == sent + 1  # Alice's last call only
        await assert_consistent(engine.store, sid)
    finally:
        await engine.stop()


async def _at_least(units: Any, n: int) -> bool:
    return await units >= n


@on_both_redis
async def test_an_outbox_entry_that_cannot_be_handed_over_is_dead_lettered_and_the_rest_go(
    redis, vendor, tmp_path
):
    """A committed outbox entry whose hand-over fails for a reason that is not a Redis
    fault (here a charge with a bad time, as a bug would write it) would fail every relay
    after it: it goes to the dead-letter stream, logged once, and the session's own charge
    behind it still reaches its bucket."""
    clock = Clock()
    vendor.default = Text(LONG)
    engine = await start(redis, vendor, tmp_path, PER_AGENT, clock)
    store = engine.store
    poison = {"charge": {"id": "bad", "at": "not a time", "buckets": []}, "to": ""}
    try:
        for p in range(store.partitions):  # ahead of whatever the turn's commit adds
            await redis.xadd(store.outbox_key(p), {"m": json.dumps(poison)})
        client = Client(store)
        sid, end = await turn(client, "ops_openai", "hi")
        assert end["payload"]["type"] == "turn.completed"
        ref = ref_of(engine, sid, "ops_openai")
        used = end["payload"]["usage"]["total"]
        await poll_until(lambda: _equals(bucket_units(redis, ref), used), 10, "the call charged")
        p = store.partition_of(sid)
        assert await redis.xlen(store.outbox_key(p)) == 0
        [letter] = [d for d in await store.dead_letters() if d.get("outbox")]
        assert json.loads(letter["outbox"]) == poison
        assert letter["reason"].startswith("ValueError") and letter["session_id"] == ""
        # `subs sessions dead` names it as what it is.
        line = _dead_letter_line(letter)
        assert " - outbox entry (1x): ValueError" in line, line
    finally:
        await engine.stop()
