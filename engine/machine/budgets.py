"""Budgets (issue #28): what a turn and a session may spend, checked before each call.

An agent's config may carry `budget` (per turn: `max_cost_usd`, `max_model_calls`,
`max_tool_calls`, `max_tokens`, `on_exceeded`, and `price`, the input and cache-read
prices of its model in USD per million tokens, filled in by the engine from its price
table) and `session_budget` (`max_cost_usd`, `on_exceeded`, over the session's life;
`price` too when there is no `budget` to carry it). Both are engine extensions of the
wire AgentConfig (a worker may return them at `session.start` to override the file's for
its session).

The check runs before a call is recorded: a model call is estimated from the request's
input tokens (its characters / 4) and that price (what the previous call left in the
vendor's prompt cache at the cache-read price: `cached_at`), and the estimates of the
turn's model calls still in flight are counted with it; when a call settles its estimate
is replaced by what the vendor reported (evolve.py), so the next check reads the real
figures. A child's spend reaches its parent's turn when the child's turn ends
(`subagent.*`).

A call that would cross a limit is not made. `on_exceeded = "fail"` (the default) fails
the turn with `budget_exceeded`; `"ask"` records the call without sending it and raises
an interrupt (origin `budget`); approving it raises that limit by its own size for this
turn only (evolve.py folds the raise) and sends the call, declining fails the turn.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from .core import Step, iso
from .ending import fail_turn
from .interrupts import raise_interrupt
from .policies import Bucket, PolicyCheck, Unread
from .shapes import ErrorInfo, OpenInterrupt, Raise
from .state import SessionState, Turn
from .tree import path_to

_MILLION = Decimal(1_000_000)
TURN_LIMITS = ("max_cost_usd", "max_model_calls", "max_tool_calls", "max_tokens")
SESSION_LIMIT = "session.max_cost_usd"  # the raise key of the session's limit
APPROVE_OPTIONS = [
    {"label": "Continue", "value": "approve", "style": "primary"},
    {"label": "Stop", "value": "decline", "style": "danger"},
]


@dataclass(frozen=True)
class Exceeded:
    """A limit the next call would cross, with the figures."""

    limit: str  # max_cost_usd | max_model_calls | max_tool_calls | max_tokens | session...
    allowed: Decimal  # the limit as it stands this turn (raises included)
    spent: Decimal  # what is spent (and reserved by calls in flight) before this call
    needed: Decimal  # what this call adds (1 call, or its estimate)
    step: Decimal  # the configured limit: what an approval adds
    on_exceeded: str

    def detail(self) -> dict[str, Any]:
        """The figures, as the error's `detail` and the interrupt's metadata carry them."""
        return {
            "limit": self.limit,
            "allowed": _text(self.allowed),
            "spent": _text(self.spent),
            "next": _text(self.needed),
        }

    def raise_text(self) -> str:
        """What an approval adds, as a person reads it."""
        return f"${_text(self.step)}" if self.limit.endswith("cost_usd") else _text(self.step)

    def sentence(self) -> str:
        """One line a person reads: which limit, and the figures."""
        unit = _UNITS.get(self.limit.removeprefix("session."), "")
        scope = "this session" if self.limit == SESSION_LIMIT else "this turn"
        money = unit == "$"
        spent = f"${_text(self.spent)}" if money else f"{_text(self.spent)}{unit}"
        allowed = f"${_text(self.allowed)}" if money else f"{_text(self.allowed)}{unit}"
        return f"{scope} has spent {spent} of {allowed} ({self.limit})"


_UNITS = {
    "max_cost_usd": "$",
    "max_model_calls": " model calls",
    "max_tool_calls": " tool calls",
    "max_tokens": " tokens",
}


def _text(d: Decimal) -> str:
    return format(d.normalize(), "f") if d else "0"


def _dec(value: Any) -> Decimal | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return Decimal(str(value))
    except InvalidOperation:
        return None


def turn_budget(state: SessionState) -> dict[str, Any]:
    """The running agent's per-turn budget ({} for none)."""
    budget = (state.agent or {}).get("budget")
    return budget if isinstance(budget, dict) else {}


def session_budget(state: SessionState) -> dict[str, Any]:
    """The running agent's session budget ({} for none)."""
    budget = (state.agent or {}).get("session_budget")
    return budget if isinstance(budget, dict) else {}


def _reserved(turn: Turn) -> tuple[int, Decimal]:
    """Tokens and cost the turn's model calls in flight are estimated at."""
    tokens = sum(int(t) for t, _ in turn.estimates.values())
    cost = sum((Decimal(c) for _, c in turn.estimates.values()), Decimal(0))
    return tokens, cost


def estimate(
    state: SessionState, params: dict[str, Any], now: int, *, policies: bool = False
) -> dict[str, Any] | None:
    """A model call's input estimate `{tokens, cost, cached?}`, or None when no limit needs
    one (`policies`: a budget policy's bucket does).

    Tokens: the request's characters / 4 (system, tools, the messages on the path), a
    rough count that the vendor's reported usage replaces when the call settles. Cost: the
    tokens the session's previous call left in the vendor's prompt cache (`cached_at`) at
    the cache-read price, the rest at the input price, so a long cached thread is not
    refused at the price of sending it afresh.
    """
    budget, whole = turn_budget(state), session_budget(state)
    wanted = any(k in budget for k in ("max_cost_usd", "max_tokens")) or "max_cost_usd" in whole
    if not (wanted or policies):
        return None
    agent = state.agent or {}
    chars = len(str(agent.get("system") or ""))
    tools = params.get("tools") or agent.get("tools")
    if tools:
        chars += len(json.dumps(tools, separators=(",", ":")))
    messages = params.get("messages") or path_to(state.nodes, state.head_id)
    chars += len(json.dumps(messages, separators=(",", ":"), default=str))
    tokens = (chars + 3) // 4
    price = budget.get("price") or whole.get("price") or {}
    full = _dec(price.get("input")) or Decimal(0)
    read = _dec(price.get("cache_read"))
    model = str(params.get("model") or agent.get("model") or "")
    cached = min(tokens, cached_at(state, model, now)) if read is not None else 0
    cost = (Decimal(tokens - cached) * full + Decimal(cached) * (read or 0)) / _MILLION
    out: dict[str, Any] = {"tokens": tokens, "cost": _text(cost)}
    if cached:
        out["cached"] = cached
    return out


# How long a vendor keeps a prompt prefix after the call that last used it: Anthropic's
# cache lives 5 minutes (refreshed by each read); OpenAI's 5 to 10 minutes idle
# (docs/prompt-caching.md). Past it, the estimate prices every input token in full.
CACHE_TTL_MS = 5 * 60 * 1000


def cached_at(state: SessionState, model: str, now: int) -> int:
    """The tokens of prompt prefix the session's last settled model call left in the
    vendor's cache (what it read from it and wrote to it, as the vendor reported), when
    that call asked the same model less than CACHE_TTL_MS before `now`; else 0."""
    last = state.cached
    if not last or last.get("model") != model or now - int(last.get("at", 0)) > CACHE_TTL_MS:
        return 0
    return int(last.get("tokens", 0))


def _allowed(turn: Turn, key: str, limit: Decimal) -> Decimal:
    return limit * (1 + int(turn.raised.get(key, 0)))


def check(state: SessionState, kind: str, est: dict[str, Any] | None) -> Exceeded | None:
    """The first limit a call of `kind` ("llm" | "tool") would cross, or None."""
    turn = state.turn
    if turn is None:
        return None
    budget, whole = turn_budget(state), session_budget(state)
    if not budget and not whole:
        return None
    on = str(budget.get("on_exceeded") or "fail")
    tokens_held, cost_held = _reserved(turn)
    est_tokens = Decimal(int((est or {}).get("tokens", 0)))
    est_cost = _dec((est or {}).get("cost")) or Decimal(0)
    counted = "max_model_calls" if kind == "llm" else "max_tool_calls"
    figures: list[tuple[str, Decimal, Decimal]] = [
        (counted, Decimal(turn.model_calls if kind == "llm" else turn.tool_calls), Decimal(1))
    ]
    if kind == "llm":
        figures.append(
            ("max_tokens", Decimal(turn.usage.get("total", 0) + tokens_held), est_tokens)
        )
        figures.append(("max_cost_usd", Decimal(turn.cost) + cost_held, est_cost))
    for key, spent, needed in figures:
        limit = _dec(budget.get(key))
        if limit is None:
            continue
        allowed = _allowed(turn, key, limit)
        if spent + needed > allowed:
            return Exceeded(key, allowed, spent, needed, limit, on)
    limit = _dec(whole.get("max_cost_usd"))
    if kind == "llm" and limit is not None:
        spent = Decimal(state.cost) + cost_held
        allowed = _allowed(turn, SESSION_LIMIT, limit)
        if spent + est_cost > allowed:
            on = str(whole.get("on_exceeded") or on)
            return Exceeded(SESSION_LIMIT, allowed, spent, est_cost, limit, on)
    return None


@dataclass(frozen=True)
class PolicyExceeded:
    """A budget policy's bucket (policies.py) the next model call would run over."""

    bucket: Bucket
    allowed: Decimal  # the bucket's limit as it stands for this turn (raises included)
    used: Decimal  # what the bucket holds in its window, read before this step
    needed: Decimal  # this call's input estimate, in the bucket's dimension

    @property
    def limit(self) -> str:
        """The raise key an approval of its interrupt folds (evolve.py)."""
        return POLICY_PREFIX + self.bucket.policy

    @property
    def step(self) -> Decimal:
        """What an approval adds to this turn's allowance: the policy's limit."""
        return Decimal(self.bucket.limit)

    @property
    def on_exceeded(self) -> str:
        """The policy's strategy in the per-turn budget's words."""
        return "ask" if self.bucket.strategy == "interrupt" else "fail"

    def _money(self, d: Decimal) -> str:
        if self.bucket.dimension == "cost_usd":
            return f"${_text(d)}"
        return f"{_text(d)} tokens"

    def raise_text(self) -> str:
        """What an approval adds, as a person reads it."""
        return self._money(self.step)

    def detail(self) -> dict[str, Any]:
        """The figures: which policy and bucket, what it holds, and when it frees up."""
        b = self.bucket
        return {
            "limit": self.limit,
            "policy": b.policy,
            "group": b.group,
            "dimension": b.dimension,
            "allowed": _text(self.allowed),
            "spent": _text(self.used),
            "next": _text(self.needed),
            "frees_at": iso(b.frees_at) if b.frees_at is not None else None,
        }

    def sentence(self) -> str:
        """One line a person reads: the policy, the figures, when it frees up."""
        b = self.bucket
        who = f" for {b.group}" if b.group else ""
        said = f"budget policy {b.policy!r}{who} has used {self._money(self.used)} of "
        said += f"{self._money(self.allowed)}"
        if b.frees_at is not None:
            said += f"; it frees up at {iso(b.frees_at)}"
        return said


POLICY_PREFIX = "policy:"


def check_policies(st: Step, est: dict[str, Any] | None) -> PolicyExceeded | None:
    """The first bucket a model call would run over: one already at its limit, or one
    this call's input estimate would cross (as the original engine reserves). With the
    buckets not read yet (`Unread`) the call is let through and its check recorded in
    the transition, for the shell to make once it has read them (`first_over`)."""
    turn = st.s.turn
    if turn is None or not st.buckets:
        return None
    if isinstance(st.buckets, Unread):
        raised = tuple((k, n) for k, n in turn.raised.items() if k.startswith(POLICY_PREFIX))
        st.out.policy_checks.append(PolicyCheck(est, raised))
        return None
    return _over(st.buckets, turn.raised, est)


def first_over(buckets: tuple[Bucket, ...], checks: Iterable[PolicyCheck]) -> PolicyExceeded | None:
    """The first recorded check (`check_policies` with the buckets unread) that the
    buckets' figures would not have let through; None when they allow each call."""
    for check in checks:
        over = _over(buckets, dict(check.raised), check.estimate)
        if over is not None:
            return over
    return None


def _over(
    buckets: tuple[Bucket, ...], raised: Mapping[str, int], est: dict[str, Any] | None
) -> PolicyExceeded | None:
    for b in buckets:
        limit = _dec(b.limit)
        used = _dec(b.used) or Decimal(0)
        if limit is None:
            continue
        key = "tokens" if b.dimension == "total_tokens" else "cost"
        needed = _dec((est or {}).get(key)) or Decimal(0)
        allowed = limit * (1 + int(raised.get(POLICY_PREFIX + b.policy, 0)))
        if used >= allowed or used + needed > allowed:
            return PolicyExceeded(b, allowed, used, needed)
    return None


def error_of(over: Exceeded | PolicyExceeded) -> ErrorInfo:
    """The `budget_exceeded` error a turn stopped by its budget fails with."""
    return {
        "message": f"budget exceeded: {over.sentence()}; the next call was not made",
        "code": "budget_exceeded",
        "detail": over.detail(),
    }


def refuse(st: Step, over: Exceeded | PolicyExceeded) -> None:
    """A call the budget does not allow, not yet recorded: the turn fails."""
    fail_turn(st, error_of(over))


def ask(st: Step, over: Exceeded | PolicyExceeded, call_id: str) -> None:
    """Hold a recorded (not sent) call behind an interrupt asking for more budget."""
    step = over.raise_text()
    detail = over.detail()
    detail.update({"call_id": call_id, "raise_by": _text(over.step), "options": APPROVE_OPTIONS})
    action: Raise = {
        "interrupt_id": f"budget-{call_id}",
        "reason": f"budget: {over.sentence()}",
        "payload": {
            "message": f"{over.sentence()}; continue with another {step}?",
            "metadata": detail,
        },
    }
    raise_interrupt(st, action, "budget")


def budget_of(interrupt: OpenInterrupt) -> dict[str, Any] | None:
    """A budget interrupt's metadata (limit, call_id, figures); None for any other."""
    if interrupt.get("origin") != "budget":
        return None
    payload = interrupt.get("payload")
    meta = payload.get("metadata") if isinstance(payload, dict) else None
    return meta if isinstance(meta, dict) else None


def metadata(state: SessionState) -> dict[str, str]:
    """What a worker sees of the budget on its decision requests (`identity.metadata`,
    string values as the schema has them): each limit as it stands this turn and what the
    turn (and the session) has spent against it."""
    turn = state.turn
    budget, whole = turn_budget(state), session_budget(state)
    if turn is None or not (budget or whole):
        return {}
    out: dict[str, str] = {}
    spent = {
        "max_cost_usd": turn.cost,
        "max_model_calls": str(turn.model_calls),
        "max_tool_calls": str(turn.tool_calls),
        "max_tokens": str(turn.usage.get("total", 0)),
    }
    for key in TURN_LIMITS:
        limit = _dec(budget.get(key))
        if limit is not None:
            out[f"budget.{key}"] = _text(_allowed(turn, key, limit))
            out[f"budget.spent.{key}"] = spent[key]
    limit = _dec(whole.get("max_cost_usd"))
    if limit is not None:
        out["budget.session.max_cost_usd"] = _text(_allowed(turn, SESSION_LIMIT, limit))
        out["budget.spent.session.max_cost_usd"] = state.cost
    return out
