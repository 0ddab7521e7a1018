"""Subagents (SPEC §9): a call that a child session runs as a turn of its own.

The call's side, here: the spawn, its child's start and end, retries and deadlines. The
child's side (a turn started for a parent's call, the parent told when it ends) is
between_sessions.py's (turns.py starts it) and ending.py's. A subagent call is a call
kind of its own (`KIND`), whose hooks the call rules run: its deadline, what a retried
attempt sends the child, what its timer firing means, and whom its early end must tell.

A subagent call's attempt is queued from its dispatch until the child's turn starts
(`subagent.started`): the child may be busy with a turn of its own, or its partition
without an engine. The subagent policy's `queue_timeout_secs` (default 30 s) bounds that
wait: the attempt fails with `deadline_exceeded`, `detail.reason: "queue_timeout"`,
the child drops the turn it had queued, and the call is retried under its policy.

Spawn modes (SPEC §9, the wire's SpawnMode): `blocking` keeps the call open until the
child's turn ends (`{session, result}`); `detached` answers it once the child's turn
has started (`{session, status: "started"}`) and leaves the child running on its own:
its end is recorded here as a fact (its cost rolls in) and prompts nothing; `wait`
starts nothing: it names a child started detached (`session`) and answers with that
run's result, at once if it has ended, else when it ends. A subagent's configured
`mode` says which a call may use (spawns.py `ALLOWED_MODES`).
"""

from __future__ import annotations

import json

from . import budgets, retry
from . import events as ev
from .calls import dispatch
from .core import CallKind, Step
from .effects import Deliver
from .inputs import ChildCancelled, ChildSpawned, SubagentFinished, SubagentStarted
from .kinds import always
from .retry import Fault
from .shapes import Child, ErrorInfo, SubagentSpawn
from .shapes import SubagentFinished as Finished  # the trigger (inputs has the input)
from .spawns import spawn_args, spawn_mode, subagent_entry
from .state import Call, SessionState
from .tool_messages import tool_finished
from .tools import tool_result_of

# -- the spawn --------------------------------------------------------------------


def start_subagent(st: Step, action: SubagentSpawn, unrunnable: list[tuple[Call, str]]) -> None:
    """`subagent.spawn`: the child is an ordinary session whose id derives from this call."""
    s = st.s
    call_id, agent_id = action["tool_call_id"], action["agent_id"]
    message = action.get("message")
    sub = subagent_entry(s.agent, agent_id)
    mode, mode_problem = spawn_mode((sub or {}).get("mode"), action.get("mode"))
    over = budgets.check(s, "tool", None)
    if over is not None:  # a child is a tool call: over max_tool_calls it is not spawned
        budgets.refuse(st, over)
        return
    arguments = {"message": (message or {}).get("content")}
    if action.get("session_id"):
        arguments["session"] = action["session_id"]
    if mode != "blocking":
        arguments["mode"] = mode
    st.emit(
        {
            "type": ev.TOOL_CALL_REQUESTED,
            "id": call_id,
            "name": agent_id,
            "arguments": json.dumps(arguments, separators=(",", ":")),
            "handler": "subagent",
            "retry": st.kinds.policy("subagent", s.agent, action.get("retry")),
        }
    )
    call = s.calls[call_id]
    child = action.get("session_id") or f"{st.session_id}~{call_id}"
    limit = (s.agent or {}).get("max_subagent_depth")
    limit = 5 if limit is None else limit
    known = s.children.get(child)
    problem = None
    if len(s.ancestry) >= limit:
        problem = f"subagent depth limit reached (max_subagent_depth = {limit})"
    elif sub is None:
        problem = f"agent {agent_id!r} is not a subagent of {s.agent_id!r}"
    elif mode_problem is not None:
        problem = mode_problem
    elif mode == "wait":
        problem = _wait_problem(action, known, agent_id)
    elif not message:
        problem = "a subagent call needs a `message`"
    elif action.get("session_id") and (known is None or known["agent_id"] != agent_id):
        problem = f"session {child!r} is not an earlier child of this session running {agent_id!r}"
    elif known is not None and (known.get("call_id") or known.get("detached")):
        problem = f"session {child!r} is busy with call {known['call_id'] or known['detached']!r}"
    if problem is not None:
        unrunnable.append((call, problem))
        return
    if mode == "wait":
        assert known is not None  # `_wait_problem` names the child
        last = None if known.get("detached") else known.get("last")
        if last is None:
            dispatch(st, call, 1)  # open until the child's run ends
        else:
            answer_from_child(st, call, child, agent_id, last["ok"], last["result"], last["error"])
        return
    dispatch(st, call, 1)
    requested: ev.SubagentRequested = {
        "type": ev.SUBAGENT_REQUESTED,
        "id": child,
        "tool_call_id": call_id,
        "agent_id": agent_id,
    }
    if mode == "detached":
        requested["mode"] = mode
    st.emit(requested)
    assert message  # a spawn without one is refused above
    spawned = ChildSpawned(st.session_id, call_id, agent_id, message, [*s.ancestry, st.session_id])
    st.out.effects.append(Deliver(child, spawned))


def _wait_problem(action: SubagentSpawn, known: Child | None, agent_id: str) -> str | None:
    """Why a `wait` call cannot collect the child it names (None: it can)."""
    session = action.get("session_id")
    if not session:
        return "a `wait` call names the `session` of a child started detached"
    if action.get("message"):
        return "a `wait` call sends no `message`: it collects a detached child's result"
    if known is None or known["agent_id"] != agent_id:
        return f"session {session!r} is not an earlier child of this session running {agent_id!r}"
    if not known.get("detached") and known.get("last") is None:
        return f"session {session!r} has no detached run to wait for"
    return None


def respawn(st: Step, call: Call, attempt: int) -> None:
    """A retried subagent call sends its child the spawn again, as a turn of its own."""
    s = st.s
    child = next((c for c, v in s.children.items() if v.get("call_id") == call.id), None)
    if child is None or call.name is None:
        return  # nothing was spawned (a `wait` call): nothing to send again
    message = {"role": "user", "content": spawn_args(call).get("message")}
    ancestry = [*s.ancestry, st.session_id]
    spawned = ChildSpawned(st.session_id, call.id, call.name, message, ancestry, attempt=attempt)
    st.out.effects.append(Deliver(child, spawned))


# -- the child's start and end ------------------------------------------------------


def subagent_started(st: Step, inp: SubagentStarted) -> None:
    """The child's turn began: the call is out of its queue; a detached one is answered."""
    call = st.s.calls.get(inp.call_id)
    if call is None or call.handler != "subagent" or call.status != "running":
        st.ignore(f"call {inp.call_id!r} is not waiting for a subagent")
        return
    if inp.attempt != call.attempt:
        st.ignore(f"call {call.id!r} attempt {inp.attempt} was replaced (now {call.attempt})")
        return
    st.emit({"type": ev.SUBAGENT_STARTED, "id": inp.child_session, "tool_call_id": call.id})
    if spawn_args(call).get("mode") == "detached":
        result = tool_result_of({"session": inp.child_session, "status": "started"})
        st.emit({"type": ev.TOOL_CALL_COMPLETED, "id": call.id, "result": result})
        tool_finished(st, call, result, None)


def subagent_finished(st: Step, inp: SubagentFinished) -> None:
    """The child's turn ended: roll its cost in, record the tool result, re-prompt."""
    s = st.s
    child = s.children.get(inp.child_session)
    if child is not None and child.get("detached") == inp.call_id:
        detached_finished(st, inp)
        return
    call = s.calls.get(inp.call_id)
    if call is None or call.handler != "subagent" or call.status != "running":
        st.ignore(f"call {inp.call_id!r} is not waiting for a subagent")
        return
    if inp.attempt != call.attempt:
        st.ignore(f"call {call.id!r} attempt {inp.attempt} was replaced (now {call.attempt})")
        return
    ended: ev.SubagentEnded = {
        "type": ev.SUBAGENT_COMPLETED if inp.ok else ev.SUBAGENT_ERRORED,
        "id": inp.child_session,
        "tool_call_id": call.id,
        "usage": inp.usage,
        "cost": inp.cost,
    }
    if not inp.ok:
        ended["error"] = inp.error
    st.emit(ended)
    answer_from_child(st, call, inp.child_session, inp.agent_id, inp.ok, inp.result, inp.error)


def detached_finished(st: Step, inp: SubagentFinished) -> None:
    """A detached child's turn ended: a fact on this log (its cost rolls in, its result
    is kept) that prompts nothing, except the `wait` calls open on it, now answered."""
    ended: ev.SubagentEnded = {
        "type": ev.SUBAGENT_COMPLETED if inp.ok else ev.SUBAGENT_ERRORED,
        "id": inp.child_session,
        "tool_call_id": inp.call_id,
        "usage": inp.usage,
        "cost": inp.cost,
        "detached": True,
        "result": inp.result if inp.ok else None,
    }
    if not inp.ok:
        ended["error"] = inp.error
    st.emit(ended)
    for call in waiting_on(st.s, inp.child_session):
        answer_from_child(st, call, inp.child_session, inp.agent_id, inp.ok, inp.result, inp.error)


def waiting_on(s: SessionState, child: str) -> list[Call]:
    """The open `wait` calls that collect `child`'s detached run."""
    return [
        c
        for c in s.calls.values()
        if c.handler == "subagent"
        and c.status == "running"
        and spawn_args(c).get("mode") == "wait"
        and spawn_args(c).get("session") == child
    ]


def answer_from_child(
    st: Step,
    call: Call,
    child: str,
    agent_id: str,
    ok: bool,
    result: str | None,
    error: ErrorInfo | None,
) -> None:
    """A child's run answers `call`: the tool result `{session, result}`, `subagent.finished`."""
    text = result if ok else f"Error: {error.get('message', 'failed') if error else 'failed'}"
    answer = tool_result_of({"session": child, "result": text})
    st.emit({"type": ev.TOOL_CALL_COMPLETED, "id": call.id, "result": answer})
    trigger: Finished = {
        "type": "subagent.finished",
        "id": call.id,
        "ok": ok,
        "session_id": child,
        "agent_id": agent_id,
    }
    if ok:
        trigger["result"] = result
    else:
        trigger["error"] = error
    tool_finished(st, call, answer, None, trigger=trigger)


# -- its kind: the hooks the call rules run --------------------------------------------


def attempt_deadline(call: Call, now: int) -> int | None:
    """Until the child's turn starts: its queue deadline (a `wait` call starts nothing:
    only its total timeout bounds it)."""
    if spawn_args(call).get("mode") == "wait":
        return None
    return retry.queue_deadline(call.retry, now)


def dispatched(st: Step, call: Call, attempt: int) -> None:
    """A retried spawn starts the child's turn again; the first attempt already did."""
    if attempt > 1:
        respawn(st, call, attempt)


def whole_run(call: Call) -> int | None:
    """A timer at the call's total timeout, counted from its start (a child's run)."""
    total = call.retry.get("total_timeout_secs")
    return None if total is None else call.started_at + int(total * 1000)


def queue_then_whole_run(call: Call) -> int | None:
    """The deadline timer: its attempt's queue deadline until the child's turn starts
    (the fold then clears `deadline`), and its total timeout all along."""
    dues = [d for d in (call.deadline, whole_run(call)) if d is not None]
    return min(dues) if dues else None


def overdue(call: Call, now: int) -> tuple[ErrorInfo, bool]:
    """The child's turn never started: this attempt failed (the next one spawns again).
    Or its whole run is over its total timeout: final, whatever attempts are left."""
    total_due = whole_run(call)
    queued = call.deadline is not None and now >= call.deadline
    if queued and (total_due is None or now < total_due):
        return retry.queue_timeout(f"subagent {call.name!r}", call.retry), Fault.DEADLINE.retryable
    fault = Fault.CHILD_DEADLINE
    total = call.retry.get("total_timeout_secs")
    return fault.error(f"subagent {call.name!r} did not finish within {total} s"), fault.retryable


def stop_child(st: Step, call: Call) -> None:
    """A subagent call ends early: the child still running its turn is stopped."""
    child = next((c for c, v in st.s.children.items() if v.get("call_id") == call.id), None)
    if child is not None:
        cancel = ChildCancelled(st.session_id, call.id, call.attempt)
        st.out.effects.append(Deliver(child, cancel))


KIND = CallKind(
    kind="tool",
    handler="subagent",
    retry="subagent",
    runnable=always,
    effect=None,
    deadline=queue_then_whole_run,
    in_flight=False,
    outside_settles=True,
    attempt_deadline=attempt_deadline,
    dispatched=dispatched,
    overdue=overdue,
    stop=stop_child,
)
