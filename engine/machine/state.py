"""Session state: the fold of a session's event log.

Plain dataclasses, JSON round-trippable, so the snapshot in Redis is exactly
`state_to_json(fold(log))`. Closed calls are dropped: a result for a call
that is not open is refused whether the call never existed or already ended.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.statuses import CallStatus, DecisionStatus, SessionStatus, TurnStatus

from .shapes import (
    Answer,
    Asked,
    Child,
    OpenInterrupt,
    ParentRef,
    Queued,
    RetryPolicy,
    Submitter,
    Synced,
    Trigger,
)

# How `evolve` folds the log and how the snapshot spells the state. A snapshot written
# under another version (or before versions: none) is not trusted: its reader folds the
# session's log again (engine/store/snapshots.py). Raise it with any change to either; the
# golden logs (tests/golden/) hold every version to folding old logs the same way.
FOLD_VERSION = 4

ZERO_USAGE: dict[str, int] = {
    "input": 0,
    "output": 0,
    "uncached_input": 0,
    "cache_read": 0,
    "cache_write": 0,
    "total": 0,
}


@dataclass
class Node:
    """One message in the conversation tree."""

    message: dict[str, Any]
    parent_id: str | None


@dataclass
class Call:
    """An open effect: a model call or a tool call.

    `handler` says where it runs: `server` (the engine), `worker`, `client`,
    `subagent`; with `kind`, it names the call's rules in kinds.py.
    `status` is `running` while an attempt is out, `retry_scheduled` while a
    backoff timer waits.
    """

    id: str
    kind: str  # "llm" | "tool"
    turn_id: str
    handler: str
    attempt: int
    status: CallStatus
    started_at: int  # ms, first attempt: the total-timeout clock
    retry: RetryPolicy  # resolved (retry.py)
    name: str | None = None
    arguments: str | None = None
    anchor: str | None = None  # head node the call was requested at
    params: dict[str, Any] = field(default_factory=dict)  # llm.call overrides
    deadline: int | None = None  # ms, current attempt's run deadline


@dataclass
class Decision:
    """The session's one live decision, sent to its worker.

    Only control triggers take this slot; `tool.execute` and `llm.execute` ride
    on their call, so parallel calls run concurrently.
    """

    id: str
    trigger: Trigger
    proposed: Answer
    attempt: int
    status: DecisionStatus
    started_at: int
    retry: RetryPolicy
    deadline: int | None = None


@dataclass
class Turn:
    """The running turn: when it started, what it cost and who runs it."""

    id: str
    started_at: int
    usage: dict[str, int] = field(default_factory=lambda: dict(ZERO_USAGE))
    cost: str = "0"
    parent: ParentRef | None = None  # when a parent's call runs it
    tools: list[dict[str, Any]] | None = None  # the client's per-submit tools, this turn only
    by: Submitter | None = None  # who submitted it (interrupts.py)
    trace: str | None = None  # the client's traceparent: the turn's trace joins it
    tracestate: str | None = None  # and its tracestate, passed on to the turn's workers
    # What its budget counts (budgets.py): calls requested, the input estimates of its
    # model calls in flight (call id -> [tokens, cost]), and approved raises by limit.
    model_calls: int = 0
    tool_calls: int = 0
    estimates: dict[str, list[Any]] = field(default_factory=dict)
    raised: dict[str, int] = field(default_factory=dict)


@dataclass
class SessionState:
    """Everything the machine knows of a session: the fold of its log."""

    session_id: str
    agent_id: str
    decider: str  # "engine" | "worker"
    created_at: int
    identity: dict[str, Any] = field(default_factory=dict)
    seq: int = 0
    agent: dict[str, Any] | None = None
    worker_state: Any = None
    nodes: dict[str, Node] = field(default_factory=dict)
    head_id: str | None = None
    turn: Turn | None = None
    queue: list[Queued] = field(default_factory=list)  # queued turn starts, FIFO
    turns: dict[str, TurnStatus] = field(default_factory=dict)  # by turn id
    last_turn: str | None = None
    calls: dict[str, Call] = field(default_factory=dict)
    usage: dict[str, int] = field(default_factory=lambda: dict(ZERO_USAGE))
    cost: str = "0"
    decision: Decision | None = None
    pending: list[Asked] = field(default_factory=list)  # triggers waiting for the slot
    interrupts: dict[str, OpenInterrupt] = field(default_factory=dict)  # open, by id
    llm_routes: dict[str, dict[str, Any]] = field(default_factory=dict)  # block -> type, format
    ancestry: list[str] = field(default_factory=list)  # parent sessions, root first
    # Every write of the worker state / agent config with the node it was made at, so
    # both are read along the active path: after a branch, as of the branch point.
    state_writes: list[list[Any]] = field(default_factory=list)  # [anchor, state]
    agent_writes: list[list[Any]] = field(default_factory=list)  # [anchor, agent]
    children: dict[str, Child] = field(default_factory=dict)  # by the child's session id
    # Each connection's tool list as last synced, by path (connectors.py).
    connectors: dict[str, Synced] = field(default_factory=dict)
    held: Asked | None = None  # the turn's first decision, waiting on its syncs
    # What the last settled model call left in the vendor's prompt cache: {tokens, model,
    # at (ms)}; a budget's estimate prices that much of the next call at the read rate.
    cached: dict[str, Any] | None = None

    @property
    def turn_tools(self) -> list[dict[str, Any]]:
        """The running turn's per-submit client tools (SPEC §6 `client.tools`)."""
        return (self.turn.tools or []) if self.turn is not None else []

    @property
    def status(self) -> SessionStatus:
        """Derived, not stored: an open interrupt outranks a running turn."""
        if self.interrupts:
            return "interrupted"
        return "running" if self.turn is not None else "idle"


def state_to_json(s: SessionState) -> dict[str, Any]:
    """The snapshot form. Key order is fixed so equal states serialise equally."""
    turn = s.turn
    turn_json: dict[str, Any] | None = None
    if turn is not None:
        turn_json = {
            "id": turn.id,
            "started_at": turn.started_at,
            "usage": turn.usage,
            "cost": turn.cost,
            "parent": turn.parent,
        }
        if turn.tools:  # only then: a snapshot of any other turn is spelled as before
            turn_json["tools"] = turn.tools
        if turn.by:  # likewise
            turn_json["by"] = turn.by
        if turn.trace:  # the same
            turn_json["trace"] = turn.trace
        if turn.tracestate:
            turn_json["tracestate"] = turn.tracestate
        for key in ("model_calls", "tool_calls", "estimates", "raised"):  # the same
            if getattr(turn, key):
                turn_json[key] = getattr(turn, key)
    return {
        "fold_version": FOLD_VERSION,
        "session_id": s.session_id,
        "agent_id": s.agent_id,
        "decider": s.decider,
        "created_at": s.created_at,
        "identity": s.identity,
        "seq": s.seq,
        "agent": s.agent,
        "worker_state": s.worker_state,
        "nodes": [[nid, n.message, n.parent_id] for nid, n in s.nodes.items()],
        "head_id": s.head_id,
        "turn": turn_json,
        "queue": s.queue,
        "turns": s.turns,
        "last_turn": s.last_turn,
        "calls": [dict(c.__dict__) for c in s.calls.values()],
        "usage": s.usage,
        "cost": s.cost,
        "decision": None if s.decision is None else dict(s.decision.__dict__),
        "pending": s.pending,
        "interrupts": s.interrupts,
        "llm_routes": s.llm_routes,
        "ancestry": s.ancestry,
        "state_writes": s.state_writes,
        "agent_writes": s.agent_writes,
        "children": s.children,
        "connectors": s.connectors,
        "held": s.held,
        "cached": s.cached,
    }


def state_from_json(d: dict[str, Any]) -> SessionState:
    """The state a snapshot holds; its `fold_version` is the reader's to check first."""
    t = d["turn"]
    return SessionState(
        session_id=d["session_id"],
        agent_id=d["agent_id"],
        decider=d["decider"],
        created_at=d["created_at"],
        identity=d["identity"],
        seq=d["seq"],
        agent=d["agent"],
        worker_state=d["worker_state"],
        nodes={nid: Node(message=m, parent_id=p) for nid, m, p in d["nodes"]},
        head_id=d["head_id"],
        turn=None if t is None else Turn(**t),
        queue=d["queue"],
        turns=d["turns"],
        last_turn=d["last_turn"],
        calls={c["id"]: Call(**c) for c in d["calls"]},
        usage=d["usage"],
        cost=d["cost"],
        decision=None if d["decision"] is None else Decision(**d["decision"]),
        pending=d["pending"],
        interrupts=d["interrupts"],
        llm_routes=d["llm_routes"],
        ancestry=d["ancestry"],
        state_writes=d["state_writes"],
        agent_writes=d["agent_writes"],
        children=d["children"],
        connectors=d["connectors"],
        held=d["held"],
        cached=d.get("cached"),
    )
