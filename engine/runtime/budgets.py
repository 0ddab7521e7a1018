"""The budget buckets a step is checked against: which ones, and what they hold now.

A `[[budgets]]` policy (engine/machine/policies.py) groups sessions into buckets by
agent, person, channel and session. Before a step the applier asks which buckets the
session counts toward (worked out each step from its state or, for a session the input
creates, the input). Most steps start no model call, so their usage is not read before
the step: the machine lets a call through with them `UNREAD` and records its check, and
only a step that started one reads them (one round trip), after the step and before its
commit. When their figures refuse or hold a call the step let through, it is run again
from the stored state with them, so a call is refused exactly as if they had been read
first. With no policies, none of this costs anything.
"""

from __future__ import annotations

from typing import Any

from engine.machine import ChildSpawned, ClientSubmitted, Input, SessionState, Transition
from engine.machine.budgets import first_over
from engine.machine.policies import Bucket, BucketRef, BudgetPolicy, buckets_for, context_of
from engine.store.store import Store

ROOTS_KEPT = 10_000  # root sessions' identities kept for their subagents' budget buckets


class Budgets:
    """The project's budget policies, as one engine's steps read them."""

    def __init__(self, policies: tuple[BudgetPolicy, ...], store: Store) -> None:
        self.policies = policies
        self.store = store
        self._roots: dict[str, dict[str, Any]] = {}  # root session -> identity (subagents')

    async def refs(self, sid: str, state: SessionState | None, inp: Input) -> list[BucketRef]:
        """The budget-policy buckets a session counts toward (policies.py): from its agent
        and identity, or, for a session this input creates, the input's; `user` is whoever
        submitted the turn the step works on (in a shared Slack thread each person spends
        their own bucket, not the thread starter's). A subagent's
        session counts toward its root session's person and channel (its own agent and
        id): a user's subagents spend that user's budget. Worked out each step (a few
        comparisons); only a root's identity is kept, as it never changes."""
        if not self.policies:
            return []
        if state is not None:
            agent_id, identity, ancestry = state.agent_id, state.identity, state.ancestry
        elif isinstance(inp, ClientSubmitted):
            agent_id, identity, ancestry = inp.agent_id, inp.identity, list(inp.ancestry or ())
        elif isinstance(inp, ChildSpawned):
            agent_id, identity, ancestry = inp.agent_id, {}, inp.ancestry
        else:
            return []
        if ancestry:
            identity = await self._root_identity(ancestry[0])
        else:
            identity = _as_submitted(identity, state, inp)
        return buckets_for(self.policies, context_of(sid, agent_id, identity))

    async def _root_identity(self, root: str) -> dict[str, Any]:
        """A root session's identity (read once, from its snapshot: it never changes)."""
        known = self._roots.get(root)
        if known is None:
            known = (await self.store.identities([root]))[root]
            if len(self._roots) >= ROOTS_KEPT:
                self._roots.pop(next(iter(self._roots)))
            self._roots[root] = known
        return known

    async def recheck(
        self, sid: str, inp: Input, t: Transition, now: int
    ) -> tuple[Bucket, ...] | None:
        """After a step run with its buckets unread: their figures when they refuse or hold
        a model call the step let through (it is to run again with them), else None. Read
        only when the step started a model call; worked out from the state after the step,
        as that call's turn is the one running then: a step that ends a turn may start the
        queued next, whose first call counts toward its own submitter's buckets."""
        if not t.policy_checks:
            return None
        refs = await self.refs(sid, t.state, inp)
        if not refs:
            return None
        buckets = await self.usage(refs, now)
        return buckets if first_over(buckets, t.policy_checks) is not None else None

    async def usage(self, refs: list[BucketRef], now: int) -> tuple[Bucket, ...]:
        """The buckets' usage as the machine is to check a model call against it."""
        if not refs:
            return ()
        uses = await self.store.read_buckets(refs, now)
        return tuple(
            Bucket(u.policy, u.group, u.dimension, u.limit, u.used, u.frees_at, ref.policy.strategy)
            for ref, u in zip(refs, uses, strict=True)
        )


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
