"""The client side of the engine over Redis: submit input, read and follow sessions.

Used by the CLI (and later the HTTP API and the Slack bot). Submitting is a
request/reply: the input goes onto its partition's work stream and the owning
engine answers on a reply list once the transition is committed.
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson

from engine.errors import ClientError as ClientError  # re-exported for the bot and the CLI
from engine.errors import ProtocolError
from engine.files import file_link
from engine.ids import new_id
from engine.jsonedge import JsonEdgeError, check
from engine.listing import SessionListing
from engine.machine import (
    CallSettled,
    CancelRequested,
    DecisionSubmitted,
    InterruptRequested,
    SessionState,
    input_to_json,
)
from engine.machine.policies import BudgetPolicy
from engine.machine.shapes import Answer
from engine.machine.tree import path_to
from engine.machine.turns import TURN_STARTS
from engine.protocol import parse_client_input
from engine.store.retention import FULL_AT
from engine.store.snapshots import load_state
from engine.store.store import RedisError, Store
from engine.telemetry.ids import parse_traceparent, parse_tracestate


def validate_client_input(data: Any) -> None:
    """Check a ClientInput against the protocol (`parse_client_input`), wherever it comes
    from: every `Client.submit` does (the API, AG-UI, the CLI, the Slack bot), and
    `subs run --input` before it starts anything.

    Raises:
        ClientError: `invalid_input` (400) naming the bad field under `input.`.
    """
    try:
        parse_client_input(data)
    except ProtocolError as err:
        text = err.message.removeprefix("invalid client input: ")
        where = f"input.{err.param}" if err.param else "input"
        message = f"input.{text}" if err.param else f"input: {text}"
        raise ClientError(
            message, code="invalid_input", status=400, detail={"param": where}
        ) from None


def session_view(state: SessionState) -> dict[str, Any]:
    """A session as a client reads it (`GET /api/client/sessions/{id}`): status, the running
    turn, open interrupts, the active path and the whole message tree."""
    return {
        "session_id": state.session_id,
        "agent_id": state.agent_id,
        "status": state.status,
        "turn_id": state.turn.id if state.turn else None,
        "seq": state.seq,
        "interrupts": list(state.interrupts.values()),
        "messages": path_to(state.nodes, state.head_id),
        "message_tree": {
            "nodes": [
                {"message": n.message, "parent_id": n.parent_id} for n in state.nodes.values()
            ],
            "head_id": state.head_id,
        },
    }


MEMORY_EVERY_S = 1.0  # how stale the Redis memory reading a submit checks may be


class Client(SessionListing):
    """A `SessionClient` over the engine's own Redis: for a process that runs an engine
    (or shares its Redis) and so needs no HTTP hop."""

    def __init__(self, store: Store, *, policies: tuple[BudgetPolicy, ...] = ()) -> None:
        """`policies`: the project's `[[budgets]]`, whose buckets a listing shows."""
        self.store = store
        self.policies = policies
        self.memory_every_s = MEMORY_EVERY_S
        self._memory: tuple[int, int] = (0, 0)  # used_memory, maxmemory (0: no limit)
        self._memory_at = -math.inf

    async def store_memory(self) -> tuple[int, int, bool]:
        """Redis's used_memory, its maxmemory (0: no limit) and whether it is full (past
        `FULL_AT`: new sessions are refused). One INFO a second at most."""
        now = time.monotonic()
        if now - self._memory_at >= self.memory_every_s:
            try:
                self._memory = await self.store.memory()
            except RedisError:  # a server that will not say (INFO refused): no limit known
                self._memory = (0, 0)
            self._memory_at = now
        used, limit = self._memory
        return used, limit, bool(limit) and used >= FULL_AT * limit

    async def _refuse_when_full(self, session_id: str | None) -> None:
        """A new session is refused (503 store_full) while Redis is past `FULL_AT` of its
        maxmemory: what is left is for the sessions that run."""
        used, limit, full = await self.store_memory()
        if not full:
            return
        if session_id is not None and await self.store.head(session_id) is not None:
            return
        raise ClientError(
            f"Redis is {used * 100 // limit}% full ({used} of its maxmemory {limit} bytes): "
            "new sessions are refused until retention frees room or the limit is raised "
            "([store] max_memory for the embedded Redis, the server's maxmemory otherwise)",
            code="store_full",
            status=503,
            detail={"used_memory": used, "maxmemory": limit, "setting": "[store] max_memory"},
        )

    async def submit(
        self,
        payload: dict[str, Any],
        *,
        session_id: str | None = None,
        identity: dict[str, Any] | None = None,
        owner: dict[str, Any] | None = None,
        traceparent: str | None = None,
        tracestate: str | None = None,
        timeout: float = 30.0,
    ) -> dict[str, Any]:
        """Send one ClientInput; returns `{session_id, turn_id, queued}` once committed.
        One the protocol refuses is a ClientError (`validate_client_input`), sent nowhere.

        With `owner`, an existing session must belong to that subject (else 403).
        A valid W3C `traceparent` makes the turn it starts join the caller's trace (an
        invalid one is ignored, as the spec asks of a receiver).

        An input that starts a turn gets its `turn_id` here when it has none: the write
        to Redis may be sent twice (a connection lost after Redis applied it, retried by
        redis-py), and the turn id is what makes the second one a no-op.
        """
        if payload.get("type") in TURN_STARTS:
            await self._refuse_when_full(session_id)
        sid = session_id or new_id("ses")
        if payload.get("type") in TURN_STARTS and not payload.get("turn_id"):
            payload = {**payload, "turn_id": new_id("turn")}
        body = {"kind": "client", "input": payload, "identity": identity or {}, "owner": owner}
        trace = parse_traceparent(traceparent)
        if trace is not None:
            body["traceparent"] = trace.traceparent()
            state = parse_tracestate(tracestate)
            if state is not None:
                body["tracestate"] = state
        return await self._request(sid, body, timeout)

    async def _request(self, sid: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Put one input on the session's work stream and wait for the owner's answer.

        Whatever a client sends (the API, AG-UI, the CLI, a Slack payload) is checked here,
        once, before it can reach a commit: JSON any reader can read back (a lone surrogate
        or a NaN would fail there), then a ClientInput the protocol accepts.
        """
        try:
            check(body)
        except JsonEdgeError as exc:
            raise ClientError(exc.message, code="invalid_json", status=400, detail={}) from None
        if body["kind"] == "client":
            validate_client_input(body["input"])
        reply_to = self.store.reply_key(sid, secrets.token_hex(8))
        answer = await self.store.request(sid, body, reply_to, timeout)
        if answer is None:
            raise ClientError(
                f"no engine answered within {timeout:g} s (is one running on this Redis?)",
                code="unavailable",
                status=503,
                detail={},
            )
        reply: dict[str, Any] = orjson.loads(answer)
        if not reply.pop("ok"):
            raise ClientError(
                reply.pop("error"), code=reply.pop("code"), status=reply.pop("status"), detail=reply
            )
        reply.setdefault("session_id", sid)
        return reply

    async def settle(
        self,
        session_id: str,
        call_id: str,
        *,
        attempt: int | None = None,
        result: Any = None,
        error: str | None = None,
        retryable: bool = False,
        message_id: str | None = None,
        client_only: bool = False,
        timeout: float = 30.0,
    ) -> dict[str, Any]:
        """End an async worker tool call (or a client tool call) from outside (SPEC §6);
        `message_id` names the tool message it records. `client_only` (a scoped key's
        settle) refuses any call but a client tool's with 403."""
        settled = CallSettled(
            call_id,
            attempt,
            result=result,
            error=error,
            retryable=retryable,
            message_id=message_id,
            client_only=client_only,
        )
        return await self._request(session_id, input_to_json(settled), timeout)

    async def submit_decision(
        self, session_id: str, decision_id: str, response: Answer, *, timeout: float = 30.0
    ) -> dict[str, Any]:
        """A worker's DecisionResponse for a decision it deferred (answered with an empty
        body); `{"ok": true}` once applied, 409 `decision_not_pending` for any other id."""
        inp = DecisionSubmitted(decision_id, response)
        return await self._request(session_id, input_to_json(inp), timeout)

    async def interrupt(
        self, session_id: str, reason: str, payload: Any = None, *, timeout: float = 30.0
    ) -> dict[str, Any]:
        """Pause the session's running turn (SPEC §8); returns `{interrupt_id}`."""
        inp = InterruptRequested(reason, payload)
        return await self._request(session_id, input_to_json(inp), timeout)

    async def cancel(
        self, session_id: str, reason: str | None = None, *, timeout: float = 30.0
    ) -> dict[str, Any]:
        """End the session's running turn (`turn.failed`: `handler_error`, `detail.cancelled`);
        returns `{session_id, turn_id}`. Refused with `no_turn_running` when none runs."""
        return await self._request(session_id, input_to_json(CancelRequested(reason)), timeout)

    async def delete(self, session_id: str) -> None:
        """Remove an idle session and everything stored for it.

        Raises:
            ClientError: `unknown_session` (404), or `turn_running` (409): cancel it first.
        """
        for _ in range(10):  # each retry means a commit landed in between: rare
            state = await load_state(self.store, session_id)
            if state is None:
                raise ClientError(
                    f"session {session_id!r} does not exist",
                    code="unknown_session",
                    status=404,
                    detail={},
                )
            if state.turn is not None:
                raise ClientError(
                    f"session {session_id} is running turn {state.turn.id}: cancel it first "
                    f"(subs sessions cancel {session_id})",
                    code="turn_running",
                    status=409,
                    detail={"turn_id": state.turn.id},
                )
            if await self.store.delete_session(session_id, state.seq):
                return
        raise ClientError(
            f"session {session_id} keeps changing; try again",
            code="turn_running",
            status=409,
            detail={},
        )

    async def put_file(self, session_id: str, data: bytes, mime: str, name: str) -> dict[str, Any]:
        """Keep a file for the session (once, whatever number of messages carry it); returns
        the `link` content part a message names it by (engine/files.py)."""
        digest = await self.store.put_file(session_id, data)
        return file_link(digest, mime, name)

    async def turn_status(self, session_id: str, turn_id: str) -> str | None:
        """What became of a turn the session has seen (queued, running, completed, failed),
        from its own state, however long ago; None for a turn id it never saw."""
        state = await load_state(self.store, session_id)
        return None if state is None else state.turns.get(turn_id)

    async def interrupts(self, session_id: str) -> dict[str, dict[str, Any]]:
        """The session's open interrupts as recorded, by id; none for no session."""
        state = await load_state(self.store, session_id)
        return {k: dict(v) for k, v in state.interrupts.items()} if state is not None else {}

    async def session(self, session_id: str) -> dict[str, Any] | None:
        """The session as a client reads it (`session_view`); None when there is none."""
        state = await load_state(self.store, session_id)
        return session_view(state) if state is not None else None

    async def dead_letters(self, limit: int = 100) -> list[dict[str, Any]]:
        """Inputs the engine could not apply (each failed its turn), newest first."""
        return await self.store.dead_letters(limit)

    async def events(self, session_id: str, after_seq: int = 0) -> list[dict[str, Any]]:
        """The session's log after `after_seq`, oldest first."""
        return await self.store.read_log(session_id, after_seq)

    async def last_seq(self, session_id: str) -> int:
        """The seq of the session's newest event; 0 for a session not yet created."""
        return await self.store.last_seq(session_id)

    async def delta_cursor(self, session_id: str) -> str:
        """Where the delta stream ends now: follow from here to miss nothing new."""
        return await self.store.delta_cursor(session_id)

    def follow(
        self,
        session_id: str,
        after_seq: int = 0,
        *,
        delta_cursor: str | None = None,
        block_ms: int = 5000,
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """Yield `("event", Event)` and `("delta", TokenDelta)` in arrival order, forever
        (deltas only when `delta_cursor` says where to start)."""
        return self.store.follow(session_id, after_seq, delta_cursor, block_ms)
