"""Fold events into session state.

Events are facts; state is `fold(events)`. `step` builds its new state by
applying each event it emits through `evolve`, so a snapshot and the fold of
the log cannot drift apart. An unknown event type is a bug, never skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

from engine.statuses import TurnStatus

from . import events as ev
from .accounting import add_cost, add_usage
from .shapes import Child, Queued, Synced
from .state import Call, Decision, Node, SessionState, Turn

Event = dict[str, Any]  # an `events.Envelope`; its payload one of the catalogue's records


def at_ms(event: Event) -> int:
    """The event's `occurred_at` as epoch milliseconds."""
    return int(datetime.fromisoformat(event["occurred_at"]).timestamp() * 1000)


def _session_created(s: SessionState | None, e: Event, p: ev.SessionCreated) -> SessionState:
    if s is not None:
        raise ValueError("session.created on an existing session")
    return SessionState(
        session_id=e["session_id"],
        agent_id=p["agent_id"],
        decider=p["decider"],
        created_at=at_ms(e),
        identity=p.get("identity") or {},
        llm_routes=p.get("llm_routes") or {},
        ancestry=p.get("ancestry") or [],
    )


def _agent_updated(s: SessionState, e: Event, p: ev.AgentUpdated) -> None:
    s.agent_writes.append([p.get("anchor"), p["agent"]])
    s.agent = p["agent"]


def _worker_state_updated(s: SessionState, e: Event, p: ev.WorkerStateUpdated) -> None:
    s.state_writes.append([p.get("anchor"), p["state"]])
    s.worker_state = p["state"]


def _on_path(s: SessionState, writes: list[list[Any]]) -> Any:
    """The last write made at a node on the active path (or before any message)."""
    path: set[str | None] = {None}
    node_id = s.head_id
    while node_id is not None:
        path.add(node_id)
        node_id = s.nodes[node_id].parent_id
    for anchor, value in reversed(writes):
        if anchor in path:
            return value
    return None


def _nothing(s: SessionState, e: Event, p: object) -> None:
    """Events that inform clients but change no state."""


def _message_new(s: SessionState, e: Event, p: ev.MessageNew) -> None:
    msg = p["message"]
    s.nodes[msg["id"]] = Node(message=msg, parent_id=p.get("parent_id"))
    s.head_id = msg["id"]


def _head_moved(s: SessionState, e: Event, p: ev.HeadMoved) -> None:
    s.head_id = p["head_id"]
    s.worker_state = _on_path(s, s.state_writes)
    s.agent = _on_path(s, s.agent_writes)


def _turn_queued(s: SessionState, e: Event, p: ev.TurnQueued) -> None:
    entry: Queued = {"turn_id": p["turn_id"], "input": p["input"]}
    if p.get("deadline_ms") is not None:
        entry["deadline_ms"] = p["deadline_ms"]
    if p.get("by"):
        entry["by"] = p["by"]
    s.queue.append(entry)
    s.turns[p["turn_id"]] = "queued"


def _turn_started(s: SessionState, e: Event, p: ev.TurnStarted) -> None:
    tid = p["turn_id"]
    s.turn = Turn(
        id=tid,
        started_at=at_ms(e),
        parent=p.get("parent"),
        tools=p.get("client_tools"),
        by=p.get("by"),
        trace=p.get("traceparent"),
        tracestate=p.get("tracestate"),
    )
    s.turns[tid] = "running"
    if s.queue and s.queue[0]["turn_id"] == tid:
        s.queue.pop(0)


def _turn_ended(
    status: TurnStatus,
) -> Callable[[SessionState, Event, ev.TurnCompleted | ev.TurnFailed], None]:
    def end(s: SessionState, e: Event, p: ev.TurnCompleted | ev.TurnFailed) -> None:
        tid = p["turn_id"]
        s.turns[tid] = status
        if s.turn is None or s.turn.id != tid:
            # A queued turn that never started (its queue timeout, its parent's call ended).
            s.queue = [q for q in s.queue if q["turn_id"] != tid]
            return
        s.last_turn = tid
        s.turn = None
        # The turn's decisions and pauses end with it; its calls were closed by events.
        s.decision = None
        s.pending = []
        s.interrupts = {}
        s.held = None

    return end


def _count_call(s: SessionState, e: Event, kind: str, p: Mapping[str, Any]) -> None:
    """A call requested in the running turn counts toward its budget (budgets.py)."""
    turn = s.turn
    if turn is None or e.get("turn_id") != turn.id:
        return
    if kind == "llm":
        turn.model_calls += 1
        if p.get("estimate"):
            turn.estimates[p["id"]] = [p["estimate"]["tokens"], p["estimate"]["cost"]]
    elif kind == "tool":
        turn.tool_calls += 1


def _settled(s: SessionState, call_id: str) -> None:
    """A model call ended: its estimate gives way to what it reported (or to nothing)."""
    if s.turn is not None:
        s.turn.estimates.pop(call_id, None)


CallRequested = ev.LlmCallRequested | ev.ToolCallRequested | ev.ConnectorSyncRequested


def _call_requested(kind: str) -> Callable[[SessionState, Event, CallRequested], None]:
    def requested(s: SessionState, e: Event, p: CallRequested) -> None:
        # What one kind of call has and the other lacks is read as absent.
        fields: Mapping[str, Any] = p
        s.calls[p["id"]] = Call(
            id=p["id"],
            kind=kind,
            turn_id=e["turn_id"],
            handler=p["handler"],
            attempt=0,
            status="requested",
            started_at=at_ms(e),
            retry=p["retry"],
            name=fields.get("name"),
            arguments=fields.get("arguments"),
            anchor=fields.get("anchor"),
            params=fields.get("params") or {},
        )
        _count_call(s, e, kind, p)

    return requested


def _call_dispatched(s: SessionState, e: Event, p: ev.CallDispatched) -> None:
    c = s.calls[p["id"]]
    c.attempt = p["attempt"]
    c.status = "running"
    c.deadline = p.get("deadline_ms")


def _subagent_requested(s: SessionState, e: Event, p: ev.SubagentRequested) -> None:
    child: Child = {"agent_id": p["agent_id"], "call_id": p["tool_call_id"]}
    if p.get("mode"):
        child["mode"] = p["mode"]
    s.children[p["id"]] = child


def _subagent_started(s: SessionState, e: Event, p: ev.SubagentStarted) -> None:
    call = s.calls.get(p["tool_call_id"])
    if call is not None:
        call.deadline = None  # out of the queue: only its total timeout is left
    child = s.children.get(p["id"])
    if child is not None and child.get("mode") == "detached":
        # Its call is answered now; the child runs on for that call, on its own.
        child["call_id"] = None
        child["detached"] = p["tool_call_id"]


def _subagent_ended(s: SessionState, e: Event, p: ev.SubagentEnded) -> None:
    child = s.children.get(p["id"])
    if child is not None and p.get("detached"):
        child["detached"] = None
        child["last"] = {
            "ok": p["type"] == ev.SUBAGENT_COMPLETED,
            "result": p.get("result"),
            "error": p.get("error"),
        }
    elif child is not None:
        child["call_id"] = None  # free for another call
    _add_cost(s, p.get("usage"), p.get("cost") or "0")


def _llm_completed(s: SessionState, e: Event, p: ev.LlmCallCompleted) -> None:
    call = s.calls.pop(p["id"])
    _settled(s, p["id"])
    _add_cost(s, p.get("usage"), p.get("cost") or "0")
    usage = p.get("usage") or {}
    tokens = int(usage.get("cache_read", 0) or 0) + int(usage.get("cache_write", 0) or 0)
    # What the vendor holds in its prompt cache after this call, for the next estimate.
    model = call.params.get("model") or (s.agent or {}).get("model")
    s.cached = {"tokens": tokens, "model": model, "at": at_ms(e)} if tokens else None


def _add_cost(s: SessionState, usage: dict[str, int] | None, cost: str) -> None:
    """Usage and cost count toward the session and its running turn."""
    if usage:
        s.usage = add_usage(s.usage, usage)
    s.cost = add_cost(s.cost, cost)
    if s.turn is not None:
        if usage:
            s.turn.usage = add_usage(s.turn.usage, usage)
        s.turn.cost = add_cost(s.turn.cost, cost)


def _call_closed(s: SessionState, e: Event, p: ev.ToolCallCompleted) -> None:
    s.calls.pop(p["id"])


def _call_errored(s: SessionState, e: Event, p: ev.CallErrored) -> None:
    if p["final"]:
        s.calls.pop(p["id"])
        _settled(s, p["id"])
        for child in s.children.values():
            if child.get("call_id") == p["id"]:
                child["call_id"] = None  # the call is over: its child may be called again
    else:
        s.calls[p["id"]].status = "failed"


def _retry_scheduled(s: SessionState, e: Event, p: ev.RetryScheduled) -> None:
    if p.get("kind") == "decision":
        assert s.decision is not None
        s.decision.status = "retry_scheduled"
        s.decision.deadline = None
        return
    c = s.calls[p["id"]]
    c.status = "retry_scheduled"
    c.deadline = None


def _call_waiting(s: SessionState, e: Event, p: ev.ToolCallWaiting) -> None:
    s.calls[p["id"]].status = "waiting"


def _decision_queued(s: SessionState, e: Event, p: ev.DecisionQueued) -> None:
    s.pending.append({"trigger": p["trigger"], "proposed": p["proposed"]})


def _decision_dispatched(s: SessionState, e: Event, p: ev.DecisionDispatched) -> None:
    if p["attempt"] == 1:
        if p.get("from_queue"):
            s.pending.pop(0)
        s.decision = Decision(
            id=p["decision_id"],
            trigger=p["trigger"],
            proposed=p["proposed"],
            attempt=1,
            status="running",
            started_at=at_ms(e),
            retry=p["retry"],
        )
    assert s.decision is not None and s.decision.id == p["decision_id"]
    s.decision.attempt = p["attempt"]
    s.decision.status = "running"
    s.decision.deadline = p.get("deadline_ms")


def _decision_completed(s: SessionState, e: Event, p: ev.DecisionCompleted) -> None:
    s.decision = None


def _decision_waiting(s: SessionState, e: Event, p: ev.DecisionWaiting) -> None:
    assert s.decision is not None and s.decision.id == p["decision_id"]
    s.decision.status = "waiting"


def _decision_errored(s: SessionState, e: Event, p: ev.DecisionErrored) -> None:
    assert s.decision is not None
    if p["final"]:
        s.decision = None
    else:
        s.decision.status = "failed"


def _interrupted(s: SessionState, e: Event, p: ev.SessionInterrupted) -> None:
    s.interrupts[p["interrupt_id"]] = {
        "interrupt_id": p["interrupt_id"],
        "origin": p["origin"],
        "reason": p["reason"],
        "payload": p.get("payload"),
    }
    if p.get("by"):
        s.interrupts[p["interrupt_id"]]["by"] = p["by"]


def _decision_held(s: SessionState, e: Event, p: ev.DecisionHeld) -> None:
    s.held = {"trigger": p["trigger"], "proposed": p["proposed"]}


def _decision_released(s: SessionState, e: Event, p: ev.DecisionReleased) -> None:
    s.held = None


def _connector_synced(s: SessionState, e: Event, p: ev.ConnectorSynced) -> None:
    s.calls.pop(p["id"])
    if "tools" not in p:
        return  # the same list as before
    synced: Synced = {"tools": p["tools"]}
    if p.get("prefix"):
        synced["prefix"] = p["prefix"]
    if p.get("off"):
        synced["off"] = p["off"]
    if p.get("approve_timeout_ms"):
        synced["approve_timeout_ms"] = p["approve_timeout_ms"]
    s.connectors[p["path"]] = synced


def _connector_errored(s: SessionState, e: Event, p: ev.CallErrored) -> None:
    """A sync that failed for good leaves the session without the connection's tools."""
    if p["final"]:
        call = s.calls.pop(p["id"])
        if (p["error"].get("detail") or {}).get("reason") != "turn_ended":
            s.connectors[call.name or ""] = {"tools": [], "error": p["error"]}
    else:
        s.calls[p["id"]].status = "failed"


def _interrupt_resumed(s: SessionState, e: Event, p: ev.SessionInterruptResumed) -> None:
    interrupt = s.interrupts.pop(p["interrupt_id"])
    if interrupt.get("origin") == "budget" and not p.get("expired") and s.turn is not None:
        # An approved budget prompt raises its limit by its own size, this turn only.
        answer = p.get("payload")
        if isinstance(answer, dict):
            answer = answer.get("value")
        limit = ((interrupt.get("payload") or {}).get("metadata") or {}).get("limit")
        if answer == "approve" and isinstance(limit, str):
            s.turn.raised[limit] = s.turn.raised.get(limit, 0) + 1


# One fold rule per kind of the catalogue but `session.created` (it makes the state).
_APPLY: dict[str, Callable[[SessionState, Event, Any], None]] = {
    ev.AGENT_UPDATED: _agent_updated,
    ev.WORKER_STATE_UPDATED: _worker_state_updated,
    ev.CHANNELS_UPDATED: _nothing,
    ev.MESSAGE_NEW: _message_new,
    ev.HEAD_MOVED: _head_moved,
    ev.TURN_QUEUED: _turn_queued,
    ev.TURN_STARTED: _turn_started,
    ev.TURN_COMPLETED: _turn_ended("completed"),
    ev.TURN_FAILED: _turn_ended("failed"),
    ev.LLM_CALL_REQUESTED: _call_requested("llm"),
    ev.LLM_CALL_DISPATCHED: _call_dispatched,
    ev.LLM_CALL_COMPLETED: _llm_completed,
    ev.LLM_CALL_ERRORED: _call_errored,
    ev.TOOL_CALL_REQUESTED: _call_requested("tool"),
    ev.TOOL_CALL_DISPATCHED: _call_dispatched,
    ev.TOOL_CALL_COMPLETED: _call_closed,
    ev.TOOL_CALL_ERRORED: _call_errored,
    ev.CALL_RETRY_SCHEDULED: _retry_scheduled,
    ev.TOOL_CALL_WAITING: _call_waiting,
    ev.DECISION_QUEUED: _decision_queued,
    ev.DECISION_DISPATCHED: _decision_dispatched,
    ev.DECISION_COMPLETED: _decision_completed,
    ev.DECISION_WAITING: _decision_waiting,
    ev.DECISION_ERRORED: _decision_errored,
    ev.SESSION_INTERRUPTED: _interrupted,
    ev.SESSION_INTERRUPT_RESUMED: _interrupt_resumed,
    ev.MESSAGE_SENT: _nothing,
    ev.INPUT_REJECTED: _nothing,
    ev.SUBAGENT_REQUESTED: _subagent_requested,
    ev.SUBAGENT_STARTED: _subagent_started,
    ev.SUBAGENT_COMPLETED: _subagent_ended,
    ev.SUBAGENT_ERRORED: _subagent_ended,
    ev.DECISION_HELD: _decision_held,
    ev.DECISION_RELEASED: _decision_released,
    ev.CONNECTOR_SYNC_REQUESTED: _call_requested("connector"),
    ev.CONNECTOR_SYNC_DISPATCHED: _call_dispatched,
    ev.CONNECTOR_SYNCED: _connector_synced,
    ev.CONNECTOR_SYNC_ERRORED: _connector_errored,
}

EVENT_TYPES = frozenset(ev.EVENTS)


def evolve(state: SessionState | None, event: Event) -> SessionState:
    """Apply one event. Mutates and returns `state` (or a new one on `session.created`)."""
    payload = event["payload"]
    kind = payload["type"]
    if kind == ev.SESSION_CREATED:
        state = _session_created(state, event, payload)
    else:
        if state is None:
            raise ValueError(f"{kind} before session.created")
        apply = _APPLY.get(kind)
        if apply is None:
            raise ValueError(f"unknown event type {kind!r}")
        apply(state, event, payload)
    state.seq = event["seq"]
    return state


def fold(events: Iterable[Event]) -> SessionState | None:
    """The state a log folds to: None for no events."""
    state: SessionState | None = None
    for e in events:
        state = evolve(state, e)
    return state
