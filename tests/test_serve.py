"""`subs serve` as a process: watchers over real HTTP, SIGTERM mid-turn, and a bounded load test."""

from __future__ import annotations

import asyncio
import json
import signal
import time

import aiohttp

from engine.cli.remote import HttpClient
from engine.effects.http_pool import new_session
from tests.engine_helpers import session_of, subs
from tests.fakes.llm_vendor import Text, ToolCalls


def say(text: str) -> dict:
    message = {"role": "user", "content": text}
    return {"type": "client.message", "agent_id": "ops_openai", "message": message}


async def collect(client: HttpClient, sid: str, turn_id: str, after: int = 0) -> list[dict]:
    return [
        item async for kind, item in client.follow(sid, after, turn_id=turn_id) if kind == "event"
    ]


async def test_two_watchers_one_reconnecting_see_the_same_events(serve_processes, vendor):
    slow = " ".join(f"w{i}" for i in range(30))
    vendor.push(Text(slow, chunk_delay=0.02))
    proc = await serve_processes()
    http = new_session()
    client = HttpClient(proc.api, http=http)
    reply = await client.submit(say("go"))
    sid, turn_id = reply["session_id"], reply["turn_id"]

    steady = asyncio.create_task(collect(client, sid, turn_id))
    # The second watcher reads a few events, hangs up, then reconnects with Last-Event-ID.
    first_part: list[dict] = []
    stream = f"{proc.api}/api/client/sessions/{sid}/events/stream"
    async with http.get(stream) as response:
        async for raw in response.content:  # line by line
            line = raw.decode()
            if line.startswith("data:") and '"seq"' in line and len(first_part) < 3:
                first_part.append(line)
            if len(first_part) == 3:
                break
    seen_seq = 3
    rest = await collect(client, sid, turn_id, after=seen_seq)
    full = await asyncio.wait_for(steady, 30)
    assert [e["seq"] for e in full] == list(range(1, len(full) + 1))
    assert [e["seq"] for e in rest] == list(range(seen_seq + 1, len(full) + 1))
    assert rest == full[seen_seq:]
    assert full[-1]["payload"]["type"] == "turn.completed"
    await http.close()


async def test_sigterm_mid_turn_exits_fast_and_a_new_serve_finishes_the_turn(
    serve_processes, vendor
):
    slow = " ".join(f"w{i}" for i in range(200))
    vendor.push(Text(slow, chunk_delay=0.05), Text("Finished after the restart."))
    proc = await serve_processes()
    client = HttpClient(proc.api)
    reply = await client.submit(say("long job"))
    sid, turn_id = reply["session_id"], reply["turn_id"]
    await vendor.wait_for_requests(1)
    started = time.monotonic()
    assert proc.proc is not None
    proc.proc.send_signal(signal.SIGTERM)
    assert await proc.stop() == 0
    assert time.monotonic() - started < 10
    await client.aclose()

    proc = await serve_processes()
    client = HttpClient(proc.api)
    events = await asyncio.wait_for(collect(client, sid, turn_id), 30)
    assert events[-1]["payload"]["type"] == "turn.completed"
    replies = [
        e["payload"]["message"]["content"]
        for e in events
        if e["payload"]["type"] == "message.new" and e["payload"]["message"]["role"] == "assistant"
    ]
    assert replies == ["Finished after the restart."]
    assert len(vendor.requests) == 2
    assert await client.session("nope") is None  # a 404 `unknown_session`, as Client says it
    await client.aclose()


def three_steps(body: dict) -> ToolCalls | Text:
    """A model that calls an undeclared tool once, then answers: three steps per turn."""
    if body["messages"][-1]["role"] == "tool":
        return Text("done")
    return ToolCalls([("ghost", {})])


async def test_load_100_sessions_with_100_watchers(serve_processes, vendor):
    vendor.responder = three_steps
    proc = await serve_processes()
    connector = aiohttp.TCPConnector(limit=300)
    timeout = aiohttp.ClientTimeout(total=None, connect=60.0)
    http = aiohttp.ClientSession(connector=connector, timeout=timeout)
    client = HttpClient(proc.api, http=http)

    async def one(n: int) -> list[dict]:
        sid = f"load-{n}"
        await client.submit(say(f"job {n}"), session_id=sid)
        return await _watch_until_done(client, sid)  # from seq 0: catch-up, then live

    started = time.monotonic()
    results = await asyncio.wait_for(asyncio.gather(*(one(n) for n in range(100))), 120)
    elapsed = time.monotonic() - started
    for n, events in enumerate(results):
        log = await client.events(f"load-{n}")
        assert events == log, f"watcher {n} missed or reordered events"
        assert events[-1]["payload"]["type"] == "turn.completed"
        calls = [e for e in events if e["payload"]["type"] == "llm.call.completed"]
        assert len(calls) == 2
    assert elapsed < 120
    await http.close()


async def _watch_until_done(client: HttpClient, sid: str) -> list[dict]:
    events = []
    async for kind, item in client.follow(sid, 0):
        if kind != "event":
            continue
        events.append(item)
        if item["payload"]["type"] in ("turn.completed", "turn.failed"):
            return events
    return events


async def test_the_cli_drives_a_remote_engine_with_url(serve_processes, vendor):
    vendor.push(Text("Remote answer.", chunks=3))
    proc = await serve_processes()
    code, out, err = await subs("run", "-o", "pretty", "ops_openai", "hello", "--url", proc.api)
    assert code == 0, err
    assert out.strip() == "Remote answer."
    sid = session_of(err)
    assert f"console: {proc.api}/console/sessions/{sid}\n" in err
    code, out, _ = await subs("sessions", "list", "--url", proc.api)
    rows = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and [(r["session_id"], r["first_message"]) for r in rows] == [(sid, "hello")]
    code, out, _ = await subs("sessions", "events", sid, "--url", proc.api, "-o", "jsonl")
    assert code == 0 and '"turn.completed"' in out.splitlines()[-1]
