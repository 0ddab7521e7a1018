"""The budget buckets a step is checked against: which ones, and what they hold now.

A `[[budgets]]` policy (engine/machine/policies.py) groups sessions into buckets by
agent, person, channel and session. Most steps start no model call, so the buckets are
not read before a step: the machine lets a call through with them `UNREAD` and records
its check, and only a step that started one reads them (one round trip), after the step
and before its commit. When their figures would have refused or held a call, the step is
run again from the stored state with them, so a call is refused exactly as if they had
been read first. With no policies, none of this costs anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.machine import ChildSpawned, ClientSubmitted, Input, SessionState, Transition
from engine.machine import events as ev
from engine.machine.budgets import first_over
from engine.machine.policies import Bucket, BucketRef, BudgetPolicy, buckets_for, context_of
from engine.store.store import Store

ROOTS_KEPT = 10_000  # root sessions' identities kept for their subagents' budget buckets


@dataclass(frozen=True)
class Whose:
    """What a step's buckets depend on, taken before the step changes the state: the
    session's agent, the identity it spends as, and its ancestry (root first)."""

    session_id: str
    agent_id: str
    identity: dict[str, Any]
    ancestry: tuple[str, ...]


@dataclass(frozen=True)
class Checked:
    """A step's buckets after it ran: where its settled calls are charged, and, when their
    figures refuse or hold a model call the step let through, those figures (the step is
    to be run again with them); else None."""

    refs: list[BucketRef]
    again: tuple[Bucket, ...] | None = None


class Budgets:
    """The project's budget policies, as one engine's steps read them."""

    def __init__(self, policies: tuple[BudgetPolicy, ...], store: Store) -> None:
        self.policies = policies
        self.store = store
        self._roots: dict[str, dict[str, Any]] = {}  # root session -> identity (subagents')

    def whose(self, sid: str, state: SessionState | None, inp: Input) -> Whose | None:
        """Whose buckets a step of `sid` counts toward (None: none, or no policies): the
        session's agent and identity, or, for a session this input creates, the input's;
        `user` is whoever submitted the turn the step works on (in a shared Slack thread
        each person spends their own bucket, not the thread starter's). No I/O."""
        if not self.policies:
            return None
        if state is not None:
            agent_id, identity, ancestry = state.agent_id, state.identity, state.ancestry
        elif isinstance(inp, ClientSubmitted):
            agent_id, identity, ancestry = inp.agent_id, inp.identity, list(inp.ancestry or ())
        elif isinstance(inp, ChildSpawned):
            agent_id, identity, ancestry = inp.agent_id, {}, inp.ancestry
        else:
            return None
        if not ancestry:
            identity = _as_submitted(identity, state, inp)
        return Whose(sid, agent_id, identity or {}, tuple(ancestry))

    async def refs(self, whose: Whose | None) -> list[BucketRef]:
        """The buckets `whose` counts toward (policies.py). A subagent's session counts
        toward its root session's person and channel (its own agent and id): a user's
        subagents spend that user's budget. Only a root's identity is read (once: it never
        changes); the rest is a few comparisons."""
        if whose is None:
            return []
        identity = whose.identity
        if whose.ancestry:
            identity = await self._root_identity(whose.ancestry[0])
        return buckets_for(self.policies, context_of(whose.session_id, whose.agent_id, identity))

    async def checked(self, whose: Whose | None, t: Transition, now: int) -> Checked:
        """After a step run with its buckets `UNREAD`: the buckets, read only when it let a
        model call through (whose check they then make) or settled one (to be charged)."""
        if whose is None or not (t.policy_checks or _settles_a_model_call(t)):
            return Checked([])
        refs = await self.refs(whose)
        if not refs or not t.policy_checks:
            return Checked(refs)
        buckets = await self.usage(refs, now)
        return Checked(refs, buckets if first_over(buckets, t.policy_checks) else None)

    async def _root_identity(self, root: str) -> dict[str, Any]:
        """A root session's identity (read once, from its snapshot: it never changes)."""
        known = self._roots.get(root)
        if known is None:
            known = (await self.store.identities([root]))[root]
            if len(self._roots) >= ROOTS_KEPT:
                self._roots.pop(next(iter(self._roots)))
            self._roots[root] = known
        return known

    async def usage(self, refs: list[BucketRef], now: int) -> tuple[Bucket, ...]:
        """The buckets' usage as the machine is to check a model call against it."""
        if not refs:
            return ()
        uses = await self.store.read_buckets(refs, now)
        return tuple(
            Bucket(u.policy, u.group, u.dimension, u.limit, u.used, u.frees_at, ref.policy.strategy)
            for ref, u in zip(refs, uses, strict=True)
        )


def _settles_a_model_call(t: Transition) -> bool:
    return any(e["payload"]["type"] == ev.LLM_CALL_COMPLETED for e in t.events)


def _as_submitted(
    identity: dict[str, Any], state: SessionState | None, inp: Input
) -> dict[str, Any]:
    """`identity` with the subject of the turn a step works on: the running turn's
    submitter, or, when the step's input starts the turn, the input's own subject."""
    subject: Any = None
    if state is not None and state.turn is not None and state.turn.by:
        subject = state.turn.by.get("subject")
    elif isinstance(inp, ClientSubmitted):
        subject = (inp.identity or {}).get("subject")
    if not isinstance(subject, dict) or not subject.get("id"):
        return identity
    return {**identity, "subject": subject}
