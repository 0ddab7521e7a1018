"""A submit's XADD and its wait for the answer, sent in one write (engine/store/work.py
`request`): the entry lands once, the answer is the one pushed on `reply_to`, no answer in
time is None (the client's 503), and a wait given up drops its connection."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from engine.client import Client
from engine.errors import ClientError
from engine.store.store import Store
from tests.engine_helpers import poll_until


def _in_use(store: Store) -> int:
    return len(store.redis.connection_pool._in_use_connections)


async def _entries(store: Store, sid: str) -> list[dict]:
    raw = await store.redis.xrange(store.work_key(store.partition_of(sid)))
    return [orjson.loads(fields[b"w"]) for _, fields in raw]


async def test_the_answer_pushed_on_reply_to_comes_back_and_the_entry_lands_once(redis) -> None:
    store = await Store.open(redis)
    reply_to = store.reply_key("ses-a", "r1")
    waiting = asyncio.create_task(store.request("ses-a", {"kind": "x"}, reply_to, 5.0))
    entries = await poll_until(lambda: _entries(store, "ses-a"), 5, "the work entry")
    assert entries == [{"sid": "ses-a", "input": {"kind": "x"}, "reply_to": reply_to}]
    await redis.rpush(reply_to, b'{"ok": true}')  # as the engine's commit answers
    assert await waiting == b'{"ok": true}'
    assert _in_use(store) == 0  # the connection went back to the pool


async def test_no_answer_in_time_is_the_clients_503_and_nothing_is_sent_twice(redis) -> None:
    store = await Store.open(redis)
    with pytest.raises(ClientError) as refused:
        await Client(store).submit(
            {
                "type": "client.message",
                "agent_id": "a",
                "message": {"role": "user", "content": "hi"},
            },
            session_id="ses-b",
            timeout=0.2,
        )
    assert (refused.value.code, refused.value.status) == ("unavailable", 503)
    assert len(await _entries(store, "ses-b")) == 1
    assert _in_use(store) == 0


async def test_a_wait_given_up_drops_its_connection(redis) -> None:
    store = await Store.open(redis)
    reply_to = store.reply_key("ses-c", "r1")
    waiting = asyncio.create_task(store.request("ses-c", {"kind": "x"}, reply_to, 30.0))
    await poll_until(lambda: _entries(store, "ses-c"), 5, "the work entry")
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert _in_use(store) == 0
    # The BLPOP still blocked on the server went with the connection: an answer pushed
    # now stays in the list for no one, rather than being popped by a dead wait.
    await redis.rpush(reply_to, b"late")
    await poll_until(lambda: redis.llen(reply_to), 5, "the late answer kept")
