"""The context every rule works in: the state, the events it emits, the effects it asks
for, the facts it leaves for `advance` (step.py), and the table of call kinds it runs by.

`CallKind` and `Kinds` live here, beside `Step`, because each names the other: a kind's
hooks are rules of a `Step`, and a step carries its table. The kinds themselves are
data in the modules that own their rules (kinds.py for the built-in ones).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, Protocol

from ..errors import SubsError
from . import events as ev
from . import retry
from .effects import Effect, RunCall
from .evolve import Event, evolve
from .inputs import CallAnswered
from .policies import Bucket, PolicyCheck, Unread
from .shapes import Answer, ClientAction, ClientMessages, ErrorInfo, RetryPolicy, Trigger
from .state import Call, SessionState


class Ids(Protocol):
    """Mints ids; passed in so the machine stays free of clock and randomness."""

    def __call__(self, prefix: str) -> str:
        """A new id starting `prefix`."""
        ...


class MachineError(SubsError):
    """An input the session refuses. `status` is the HTTP status hint."""

    def __init__(self, message: str, *, code: str, status: int = 409, **detail: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
        self.detail = detail


@dataclass
class Transition:
    """What one step produced: the new state and the events, effects and reply to commit."""

    state: SessionState | None
    events: list[Event] = field(default_factory=list)
    effects: list[Effect] = field(default_factory=list)
    reply: dict[str, Any] | None = None
    ignored: str | None = None
    # The triggers the engine decided itself in this step (an engine-decided agent's
    # proposals): no event records them, a trace shows them (engine/telemetry/spans.py).
    decided: list[str] = field(default_factory=list)
    # When the step emitted: the due times of the deadline timers armed after it
    # (deadlines.py), which the session's wake time is read from; None: not worked out.
    dues: tuple[int, ...] | None = None
    # The model calls this step let through with its budget-policy buckets unread
    # (policies.Unread): the shell checks them once it has read the buckets.
    policy_checks: list[PolicyCheck] = field(default_factory=list)


def iso(ms: int) -> str:
    """RFC 3339 in UTC, to the millisecond (every event's `occurred_at`)."""
    seconds, milli = divmod(ms, 1000)
    return f"{_iso_second(seconds)}.{milli:03d}Z"


@lru_cache(maxsize=64)
def _iso_second(seconds: int) -> str:
    # A step's events share their second: formatting it once is 5x faster per event.
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S")


Deadline = Callable[[Call], int | None]  # when the attempt's deadline timer fires (ms)


@dataclass(frozen=True)
class CallKind:
    """The rules of one kind of call (see kinds.py for what each field is for)."""

    kind: str  # "llm" | "tool" | "connector": which family of call events it records
    handler: str  # where it runs, as `*.call.requested` records it
    retry: str  # its policy: one of retry.DEFAULTS, or its own `retry_defaults`
    runnable: Callable[[SessionState], bool]  # can this session run it at all
    effect: type[RunCall] | None  # what dispatching an attempt asks the shell to run
    deadline: Deadline  # its attempt's deadline timer
    in_flight: bool  # an attempt is a request a dead engine loses (sent again)
    # The settle API may end a running attempt (a waiting, async one it always may).
    outside_settles: bool = False
    settle: Callable[[Step, Call, CallAnswered], None] | None = None  # None: settling.answered
    # How a call that failed for good ends (its `errored` event is out); None: the tool
    # message the model sees (tool_messages.tool_finished).
    failed: Callable[[Step, Call, ErrorInfo], None] | None = None
    retry_defaults: Mapping[str, Any] | None = None  # a policy of its own, named `retry`
    agent_retry: str | None = None  # the agent's `retry.<block>` over its own policy
    # The deadline of an attempt dispatched at `now` (ms); None: its policy's run deadline.
    attempt_deadline: Callable[[Call, int], int | None] | None = None
    dispatched: Callable[[Step, Call, int], None] | None = None  # after attempt n went out
    # Its deadline timer fired at `now`: the attempt's error and whether it is retryable;
    # None: `deadline_exceeded`, retryable.
    overdue: Callable[[Call, int], tuple[ErrorInfo, bool]] | None = None
    # It ends before its answer (its turn ended, its deadline passed): whom to tell.
    stop: Callable[[Step, Call], None] | None = None


class Kinds:
    """The table of call kinds a step runs by, and the retry policies they name.

    Built once by whoever composes the engine (engine/runtime/engine.py, from
    defaults.py unless handed one) and passed to every `step`: nothing registers
    itself, and nothing changes it once built.
    """

    def __init__(self, kinds: Iterable[CallKind]) -> None:
        by_key: dict[tuple[str, str], CallKind] = {}
        policies: dict[str, RetryPolicy] = dict(retry.DEFAULTS)
        blocks: dict[str, str] = dict(retry.AGENT_BLOCKS)
        for k in kinds:
            key = (k.kind, k.handler)
            if by_key.setdefault(key, k) != k:
                raise ValueError(f"call kind {key} is already registered, differently")
            if k.retry_defaults is not None:
                own = retry.own_policy(k.retry, k.retry_defaults)
                if policies.setdefault(k.retry, own) != own:
                    raise ValueError(f"retry policy {k.retry!r} is already defined differently")
                if k.agent_retry is not None:
                    blocks[k.retry] = k.agent_retry
        self._by_key = by_key
        self.policies: Mapping[str, RetryPolicy] = policies
        self.agent_blocks: Mapping[str, str] = blocks

    def __iter__(self) -> Iterator[CallKind]:
        return iter(self._by_key.values())

    def adding(self, *kinds: CallKind) -> Kinds:
        """This table and `kinds`: a new table (a test's own kind beside the defaults)."""
        return Kinds([*self, *kinds])

    def of(self, kind: str, handler: str) -> CallKind | None:
        """The rules of a call, or None for a handler not in the table (it cannot run)."""
        return self._by_key.get((kind, handler))

    def tool_handlers(self) -> set[str]:
        """The handlers an agent's tool may name (a subagent's tool is offered, not declared)."""
        offered = ("subagent", "server")
        return {h for (kind, h) in self._by_key if kind == "tool" and h not in offered}

    def policy(
        self, name: str, agent: dict[str, Any] | None, action_retry: Mapping[str, Any] | None = None
    ) -> RetryPolicy:
        """Policy `name` resolved for `agent` and the action's own `retry` (retry.py)."""
        return retry.resolve_policy(
            name, agent, action_retry, defaults=self.policies, agent_blocks=self.agent_blocks
        )


@dataclass(frozen=True)
class Proposal:
    """The engine decides (no worker): `proposed` is to be applied as the answer to
    `trigger` (decisions.apply_decision)."""

    trigger: Trigger
    proposed: Answer


@dataclass(frozen=True)
class Opening:
    """A turn's first decision, held for its connections' syncs or decided at once;
    `start_config` is the file's agent config of a session's first turn."""

    trigger: ClientMessages | ClientAction
    proposed: Answer
    start_config: dict[str, Any] | None
    force: str | None  # a connection the client asked to fetch afresh


@dataclass(frozen=True)
class CannotRun:
    """A call nothing can run: it fails (`unroutable`), once all its decision's calls are
    open, so the re-prompt waits for every one of them."""

    call_id: str
    reason: str


Fact = Proposal | Opening | CannotRun


class Step:
    """One transition in the making: the context every rule function takes.

    Rules are plain functions of a `Step`; it holds what they share and nothing else.
    Every state change goes through `emit`. A rule does not call what comes next: it
    records a fact (`record`), and `advance` (step.py) does what the facts and the state
    call for.
    """

    def __init__(
        self, state: SessionState | None, session_id: str, now: int, ids: Ids, kinds: Kinds
    ) -> None:
        self.state = state
        self.session_id = session_id
        self.now = now
        self.occurred_at = iso(now)
        self.ids = ids
        self.kinds = kinds
        self.facts: list[Fact] = []
        # The turn whose worker answered `turn.finished` in this step: it may end.
        self.finished: str | None = None
        self.out = Transition(state=state)
        # The agent's Slack slash commands, from the client input being applied.
        self.slash_commands: tuple[str, ...] = ()
        # The session's budget-policy buckets as the shell read them before this step
        # (policies.py), or `Unread`: a model call is checked against them.
        self.buckets: tuple[Bucket, ...] | Unread = ()

    @property
    def s(self) -> SessionState:
        """The state, for a rule that runs only once the session exists."""
        assert self.state is not None
        return self.state

    @property
    def by_worker(self) -> bool:
        """Whether the agent's worker decides (else the engine does)."""
        return self.s.decider == "worker"

    def emit(self, payload: ev.Payload, turn_id: str | None = None) -> None:
        """Record one event (a record of events.py) and fold it into the state."""
        seq = (self.state.seq if self.state else 0) + 1
        if turn_id is None and self.state is not None and self.state.turn is not None:
            turn_id = self.state.turn.id
        event: Event = {
            "session_id": self.session_id,
            "seq": seq,
            "occurred_at": self.occurred_at,
            "payload": payload,
        }
        if turn_id is not None:
            event["turn_id"] = turn_id
        self.state = evolve(self.state, event)
        self.out.state = self.state
        self.out.events.append(event)

    def record(self, fact: Fact) -> None:
        """Leave `fact` for `advance`, after what this rule is doing."""
        self.facts.append(fact)

    def take_facts(self) -> list[Fact]:
        """The facts recorded since the last call, oldest first."""
        facts, self.facts = self.facts, []
        return facts

    def ignore(self, reason: str) -> None:
        """Record why the input changed nothing (stale, duplicate): said, not raised."""
        self.out.ignored = reason
