"""Sessions as an older version (or a lenient path) stored them, for the readers-of-old-data
tests: each reader (the CLI, the API, the console, the fold) must show them, not fail.

`store_log` writes a log the way a commit leaves it (the stream, the snapshot, the index),
so it works beside a running engine, which holds every partition's lease.
"""

from __future__ import annotations

from typing import Any

from engine.jsonedge import compact_json
from engine.machine import default_kinds, fold, state_to_json
from engine.machine.state import ZERO_USAGE
from engine.store.reindex import index_sessions
from engine.store.store import Store

AGENT = "ops_openai"
FAILURE = "the model is unavailable: quota exhausted"

# The first messages older versions accepted, or that nothing but a reader ever checks.
OLD_FIRST_MESSAGES: dict[str, dict[str, Any]] = {
    "ses-old-no-content": {"role": "user"},
    "ses-old-null-content": {"role": "user", "content": None},
    "ses-old-parts-no-text": {
        "role": "user",
        "content": [{"type": "image_url", "image_url": {"url": "https://x.test/a.png"}}, {}],
    },
    "ses-old-text-parts": {
        "role": "user",
        "content": [{"type": "text", "text": "look at"}, {"type": "text", "text": None}],
    },
    "ses-old-unknown-role": {"role": "developer", "content": "be brief"},
}


def old_log(
    sid: str, first: dict[str, Any], *, minute: int = 0, failed: bool = False
) -> list[dict[str, Any]]:
    """One session with one turn, started at `minute` past nine: `first` recorded as its
    first message, then a reply (or, `failed`, the turn failing), as the engine logs it."""
    turn = f"turn-{sid}"
    user_id = f"msg-{sid}"
    payloads: list[dict[str, Any]] = [
        {
            "type": "session.created",
            "agent_id": AGENT,
            "decider": "engine",
            "identity": {"subject": {"issuer": "api", "id": "older"}, "metadata": {}},
            "llm_routes": {},
            "ancestry": [],
        },
        {"type": "turn.started", "turn_id": turn},
        {"type": "message.new", "message": {**first, "id": user_id}, "parent_id": None},
    ]
    if failed:
        error = {"message": FAILURE, "code": "provider_error"}
        payloads.append(
            {
                "type": "turn.failed",
                "turn_id": turn,
                "error": error,
                "cost": "0",
                "usage": ZERO_USAGE,
            }
        )
    else:
        reply = {"id": f"llm-{sid}", "role": "assistant", "content": None}  # an empty reply
        payloads += [
            {"type": "message.new", "message": reply, "parent_id": user_id},
            {"type": "turn.completed", "turn_id": turn, "cost": "0", "usage": ZERO_USAGE},
        ]
    return [
        {
            "session_id": sid,
            "seq": seq,
            "occurred_at": f"2025-06-01T09:{minute:02d}:{seq:02d}.000Z",
            "payload": payload,
            **({"turn_id": turn} if payload["type"] != "session.created" else {}),
        }
        for seq, payload in enumerate(payloads, 1)
    ]


def old_logs() -> list[list[dict[str, Any]]]:
    """Every shape in `OLD_FIRST_MESSAGES`, and a session whose turn failed."""
    logs = [
        old_log(sid, first, minute=n) for n, (sid, first) in enumerate(OLD_FIRST_MESSAGES.items())
    ]
    failed = {"role": "user", "content": "hi"}
    logs.append(old_log("ses-old-failed", failed, minute=len(logs), failed=True))
    return logs


async def store_log(store: Store, events: list[dict[str, Any]], *, indexed: bool = True) -> None:
    """A log as a commit leaves it: the stream, the snapshot (the fold) and the indexes
    (`indexed=False`: as a version before the listing indexes left it, the creation
    index alone)."""
    sid = events[0]["session_id"]
    state = fold(events)
    assert state is not None
    seq = events[-1]["seq"]
    async with store.redis.pipeline(transaction=False) as pipe:
        for event in events:
            pipe.xadd(store.log_key(sid), {"e": compact_json(event)}, f"{event['seq']}-0")
        snapshot = {"seq": seq, "at": seq, "state": compact_json(state_to_json(state))}
        pipe.hset(store.snap_key(sid), mapping=snapshot)
        pipe.zadd(store.sessions_key(store.partition_of(sid)), {sid: state.created_at})
        await pipe.execute()
    if indexed:
        await index_sessions(store, [sid], default_kinds())
