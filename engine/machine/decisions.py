"""Decisions (SPEC §3-§5): who decides, the one live decision, applying an answer.

For an engine-decided agent a trigger's proposal is applied at once. For a
worker, the trigger takes the session's one decision slot (or waits for it),
and the worker's answer is checked against the session before any of it is
applied: an answer that names a call that is not open, or an attempt a retry
replaced, is a failed attempt with a precise reason, never a half-applied one.
"""

from __future__ import annotations

from typing import Any

from .core import StepBase, iso
from .effects import RunDecision, StartTimer
from .inputs import (
    CallLost,
    DecisionAnswered,
    DecisionDeadline,
    DecisionFailed,
    DecisionTimerFired,
    ExecuteAnswered,
    ExecuteFailed,
)
from .retry import backoff_ms, past_total, resolve_policy, run_deadline
from .state import Call, Decision
from .tools import tool_result_of
from .tree import id_clash

_SETTLES = {"tool.result": "tool", "tool.error": "tool", "llm.result": "llm", "llm.error": "llm"}
_UNSUPPORTED = ("connector.sync",)


class DecisionRules(StepBase):
    """Needs CallRules and TurnRules beside it (see step.py)."""

    # -- who decides -----------------------------------------------------------------

    def trigger(self, trigger: dict[str, Any], proposed: dict[str, Any]) -> None:
        if not self.by_worker:
            self.apply_decision(proposed, trigger)
        elif self.s.decision is not None or self.s.pending:
            self.emit({"type": "decision.queued", "trigger": trigger, "proposed": proposed})
        else:
            self.dispatch_decision(trigger, proposed, from_queue=False)

    def dispatch_decision(
        self, trigger: dict[str, Any], proposed: dict[str, Any], *, from_queue: bool
    ) -> None:
        decision_id = self.ids("dec")
        # Before session.start is answered, the file's config (its proposal) sets the policy.
        agent = self.s.agent if self.s.agent is not None else proposed.get("agent")
        policy = resolve_policy("decision", agent)
        deadline = run_deadline(policy, self.now)
        self.emit(
            {
                "type": "decision.dispatched",
                "decision_id": decision_id,
                "trigger": trigger,
                "proposed": proposed,
                "attempt": 1,
                "deadline_ms": deadline,
                "retry": policy,
                "from_queue": from_queue,
            }
        )
        self.out.effects.append(RunDecision(decision_id, 1, deadline))

    def redispatch(self, decision: Decision, attempt: int) -> None:
        deadline = run_deadline(decision.retry, self.now)
        self.emit(
            {
                "type": "decision.dispatched",
                "decision_id": decision.id,
                "attempt": attempt,
                "deadline_ms": deadline,
            }
        )
        self.out.effects.append(RunDecision(decision.id, attempt, deadline))

    def advance(self) -> None:
        """Give the free decision slot to the oldest waiting trigger."""
        s = self.s
        if s.turn is not None and s.decision is None and s.pending:
            nxt = s.pending[0]
            self.dispatch_decision(nxt["trigger"], nxt["proposed"], from_queue=True)

    # -- answers ---------------------------------------------------------------------

    def live_decision(self, decision_id: str, attempt: int) -> Decision | None:
        d = self.s.decision
        if d is None or d.id != decision_id:
            self.ignore(f"decision {decision_id!r} is not live (answered already?)")
            return None
        if d.status != "running" or d.attempt != attempt:
            self.ignore(
                f"decision {decision_id!r} attempt {attempt} was replaced (now {d.attempt})"
            )
            return None
        return d

    def decision_answered(self, inp: DecisionAnswered) -> None:
        d = self.live_decision(inp.decision_id, inp.attempt)
        if d is None:
            return
        problem = self.check_response(inp.response, d.trigger)
        if problem is not None:
            self.decision_failed(d, {"message": problem, "code": "invalid_response"}, True)
            return
        self.emit({"type": "decision.completed", "decision_id": d.id, "attempt": d.attempt})
        self.apply_decision(inp.response, d.trigger)
        if d.trigger["type"] == "turn.finished" and self.s.turn is not None and not self.busy():
            self.end_turn(None)  # asked once more and still nothing to do: the turn is over
        self.after_decision()

    def after_decision(self) -> None:
        if self.s.turn is not None:
            self.advance()
            self.settle_turn()

    def decision_failed_input(self, inp: DecisionFailed) -> None:
        d = self.live_decision(inp.decision_id, inp.attempt)
        if d is not None:
            self.decision_failed(d, inp.error, inp.retryable)

    def decision_lost(self, inp: CallLost) -> None:
        d = self.live_decision(inp.call_id, inp.attempt)
        if d is not None:
            error = {"message": "the engine waiting for this decision stopped", "code": "internal"}
            self.decision_failed(d, error, True, at_once=True)

    def decision_failed(
        self, d: Decision, error: dict[str, Any], retryable: bool, *, at_once: bool = False
    ) -> None:
        """Retry the delivery under the decision policy, or fail the turn cleanly."""
        next_attempt = d.attempt + 1
        wait = 0 if at_once else backoff_ms(d.retry, next_attempt)
        due = self.now + wait
        final = (
            not retryable
            or next_attempt > d.retry["max_attempts"]
            or past_total(d.retry, d.started_at, due)
        )
        self.emit(
            {
                "type": "decision.errored",
                "decision_id": d.id,
                "attempt": d.attempt,
                "error": error,
                "retryable": retryable,
                "final": final,
            }
        )
        if final:
            if self.s.turn is not None:
                self.fail_turn(error)
            return
        if wait <= 0:
            self.redispatch(d, next_attempt)
            return
        self.emit(
            {
                "type": "call.retry_scheduled",
                "kind": "decision",
                "id": d.id,
                "attempt": next_attempt,
                "due_at": iso(due),
            }
        )
        self.out.effects.append(StartTimer(due, DecisionTimerFired(d.id, next_attempt)))

    def decision_deadline(self, inp: DecisionDeadline) -> None:
        d = self.live_decision(inp.decision_id, inp.attempt)
        if d is not None:
            error = {
                "message": f"the worker did not answer decision {d.id!r} (attempt {d.attempt}) "
                "before its deadline",
                "code": "deadline_exceeded",
            }
            self.decision_failed(d, error, True)

    def decision_timer_fired(self, inp: DecisionTimerFired) -> None:
        d = self.s.decision
        if d is None or d.id != inp.decision_id or d.status != "retry_scheduled":
            self.ignore(f"timer for decision {inp.decision_id!r} is stale")
            return
        if inp.attempt != d.attempt + 1:
            self.ignore(f"timer for decision {inp.decision_id!r} attempt {inp.attempt} is stale")
            return
        self.redispatch(d, inp.attempt)

    # -- a call's own execute ----------------------------------------------------------

    def execute_answered(self, inp: ExecuteAnswered) -> None:
        call = self.live_call(inp.call_id, inp.attempt, None)
        if call is None:
            return
        if call.status == "waiting":
            self.ignore(f"call {call.id!r} was already answered (it is async)")
            return
        trigger = {"type": f"{call.kind}.execute", "id": call.id, "attempt": call.attempt}
        problem = self.check_response(inp.response, trigger)
        if problem is None and call.kind == "llm" and not _ends(inp.response, call.id):
            problem = "llm.execute must be answered with llm.result or llm.error"
        if problem is not None:
            self.delivery_failed(call, {"message": problem, "code": "invalid_response"}, True)
            self.after_decision()
            return
        self.apply_decision(inp.response, trigger)
        still = self.s.calls.get(call.id)
        if still is not None and still.status == "running" and still.attempt == inp.attempt:
            # An empty answer leaves the call open: an async tool, settled later.
            self.emit({"type": "tool.call.waiting", "id": call.id, "attempt": call.attempt})
        self.after_decision()

    def execute_failed(self, inp: ExecuteFailed) -> None:
        call = self.live_call(inp.call_id, inp.attempt, None)
        if call is None:
            return
        self.delivery_failed(call, inp.error, inp.retryable)
        self.after_decision()

    # -- checking and applying ---------------------------------------------------------

    def check_response(self, resp: dict[str, Any], trigger: dict[str, Any]) -> str | None:
        """Why this answer cannot be applied to the session as it is, or None."""
        clash = id_clash(resp.get("messages") or [], self.s.nodes)
        if clash is not None:
            return clash
        ended: set[str] = set()
        for i, action in enumerate(resp.get("actions") or ()):
            kind = action["type"]
            if kind in _UNSUPPORTED:
                return f"actions.{i}.type: {kind} is not supported by this engine yet"
            call_kind = _SETTLES.get(kind)
            if call_kind is None:
                continue
            answers = trigger["type"] == f"{call_kind}.execute"
            call_id = action.get("id") or (trigger["id"] if answers else None)
            if call_id is None:
                return f"actions.{i}.id: {kind} must name the call it ends"
            call = self.s.calls.get(call_id)
            if (
                call is None
                or call.kind != call_kind
                or call.handler != "worker"
                or call.status not in ("running", "waiting")
            ):
                return f"actions.{i}: {kind} for call {call_id!r}, which is not open on the worker"
            attempt = action.get("attempt")
            if attempt is None:
                attempt = (
                    trigger["attempt"] if answers and call_id == trigger["id"] else call.attempt
                )
            if attempt != call.attempt:
                return (
                    f"actions.{i}.attempt: call {call_id!r} is at attempt {call.attempt}, "
                    f"not {attempt}"
                )
            if call_id in ended:
                return f"actions.{i}: call {call_id!r} is ended twice"
            ended.add(call_id)
        return None

    def apply_decision(self, resp: dict[str, Any], trigger: dict[str, Any]) -> None:
        if resp.get("messages"):
            self.record_messages(resp["messages"])
        if resp.get("state") is not None:
            anchor = self.s.head_id
            self.emit({"type": "worker.state.updated", "state": resp["state"], "anchor": anchor})
        if resp.get("agent") is not None:
            self.emit({"type": "agent.updated", "agent": resp["agent"], "anchor": self.s.head_id})
        if resp.get("channels"):
            self.emit({"type": "channels.updated", "channels": resp["channels"]})
        unrunnable: list[tuple[Call, str]] = []
        for action in resp.get("actions") or ():
            if self.s.turn is None:
                break  # `done`/`fail` ended the turn: later actions have no turn to act in.
            self.apply_action(action, trigger, unrunnable)
        # Fail the calls nothing can run only once all of the decision's calls are
        # open, so the re-prompt waits for every one of them.
        for call, reason in unrunnable:
            self.call_failed(call, {"message": reason, "code": "unroutable"}, False, None)

    def apply_action(
        self, action: dict[str, Any], trigger: dict[str, Any], unrunnable: list[tuple[Call, str]]
    ) -> None:
        kind = action["type"]
        if kind == "llm.call":
            if not self.s.interrupts:  # a paused branch makes no new model call
                self.start_llm_call(action)
        elif kind == "tool.call":
            self.start_tool_call(action, unrunnable)
        elif kind == "subagent.spawn":
            self.start_subagent(action, unrunnable)
        elif kind in _SETTLES:
            self.settle_from_worker(action, trigger)
        elif kind == "interrupt":
            self.raise_interrupt(action, "worker")
        elif kind == "interrupt.resolve":
            self.resume_interrupt(action["interrupt_id"], action.get("payload"))
        elif kind == "message.send":
            self.send_message(action)
        elif kind == "done":
            if self.by_worker and trigger["type"] != "turn.finished":
                self.finish_with_worker(action.get("data"))
            else:
                self.end_turn(action.get("data"))
        elif kind == "fail":
            self.fail_turn(action["error"])
        else:
            raise ValueError(f"unchecked action {kind!r}")  # check_response lets none through

    def settle_from_worker(self, action: dict[str, Any], trigger: dict[str, Any]) -> None:
        call = self.s.calls[action.get("id") or trigger["id"]]
        kind = action["type"]
        if kind == "tool.result":
            result = tool_result_of(
                action.get("result"),
                action.get("content"),
                action.get("structured_content"),
                bool(action.get("is_error")),
            )
            self.settle_tool(call, result, None, False)
        elif kind == "tool.error":
            self.settle_tool(call, None, action["error"], bool(action.get("retryable")))
        elif kind == "llm.result":
            self.llm_completed(call, action["response"])
        else:
            error = {"message": action["error"], "code": action.get("code") or "handler_error"}
            self.call_failed(call, error, bool(action.get("retryable")), None)


def _ends(resp: dict[str, Any], call_id: str) -> bool:
    return any(
        a["type"] in ("llm.result", "llm.error") and (a.get("id") or call_id) == call_id
        for a in resp.get("actions") or ()
    )
