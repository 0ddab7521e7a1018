"""Calls (SPEC §5-§7, §9, §11): model, tool and subagent calls, their attempts, retries
and deadlines.

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
`mode` says which a call may use (`ALLOWED_MODES`).
"""

from __future__ import annotations

import json
from typing import Any

from . import connectors, decisions, kinds, retry, turns
from . import events as ev
from .core import MachineError, Step, iso
from .effects import Deliver, StartTimer
from .inputs import (
    CallAnswered,
    CallDeadline,
    CallLost,
    CallSettled,
    ChildSpawned,
    LlmCallSettled,
    SubagentFinished,
    SubagentStarted,
    TimerFired,
)
from .retry import Fault, resolve_policy, run_deadline
from .state import Call, SessionState
from .tools import arguments_of, check_output, find_tool, result_text, tool_result_of

_LLM_PARAMS = (
    "llm",
    "model",
    "messages",
    "tools",
    "temperature",
    "max_completion_tokens",
    "reasoning",
    "stream",
)


# -- starting --------------------------------------------------------------------


def llm_handler(st: Step, block: str | None) -> tuple[str, str | None]:
    """Where a model call runs, and in which wire format (SPEC §7, seed 002)."""
    agent = st.s.agent or {}
    if agent.get("handler") == "worker":
        return "worker", agent.get("format")
    route = st.s.llm_routes.get(block or "")
    if route and route.get("type") == "worker":
        return "worker", route.get("format")
    return "server", None


def start_llm_call(st: Step, action: dict[str, Any]) -> None:
    call_id = action.get("id") or st.ids("llm")
    params = {k: action[k] for k in _LLM_PARAMS if action.get(k) is not None}
    handler, fmt = llm_handler(st, params.get("llm") or (st.s.agent or {}).get("llm"))
    if fmt:
        params["format"] = fmt
    st.emit(
        {
            "type": ev.LLM_CALL_REQUESTED,
            "id": call_id,
            "handler": handler,
            "anchor": st.s.head_id,
            "params": params,
            "retry": resolve_policy("llm", st.s.agent, action.get("retry")),
        }
    )
    dispatch(st, st.s.calls[call_id], 1)


def start_tool_call(st: Step, action: dict[str, Any], unrunnable: list[tuple[Call, str]]) -> None:
    call_id = action.get("id") or st.ids("tool")
    name = action["name"]
    arguments = action.get("arguments")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments if arguments is not None else {}, separators=(",", ":"))
    tool = find_tool(st.s.agent, name, st.s.turn_tools) or connectors.call_params(st.s, name)
    handler = (tool or {}).get("handler") or "worker"
    kind = kinds.of("tool", handler)
    requested: ev.ToolCallRequested = {
        "type": ev.TOOL_CALL_REQUESTED,
        "id": call_id,
        "name": name,
        "arguments": arguments,
        "handler": handler,
        "retry": resolve_policy(kind.retry if kind else "tool", st.s.agent, action.get("retry")),
    }
    if tool is not None and "connector" in tool:
        requested["params"] = {"connector": tool["connector"], "tool": tool["tool"]}
    st.emit(requested)
    call = st.s.calls[call_id]
    if kind is not None and kind.runnable(st.s):
        dispatch(st, call, 1)
        return
    # An engine-decided agent has no worker to run it: the model learns that.
    if tool is None:
        reason = f"tool {name!r} is not declared"
    elif kind is None:
        reason = f"no handler {handler!r} runs {name!r}"
    else:
        reason = f"no {handler} runs {name!r}"
    unrunnable.append((call, reason))


def dispatch(st: Step, call: Call, attempt: int) -> None:
    if call.handler != "subagent":
        deadline = run_deadline(call.retry, st.now)
    elif spawn_args(call).get("mode") == "wait":
        deadline = None  # it starts nothing: only its total timeout bounds it
    else:
        deadline = retry.queue_deadline(call.retry, st.now)  # until the child starts
    st.emit(
        {
            "type": ev.call_event(call.kind, "dispatched"),
            "id": call.id,
            "attempt": attempt,
            "deadline_ms": deadline,
        }
    )
    kind = kinds.of(call.kind, call.handler)
    if kind is not None and kind.effect is not None:
        st.out.effects.append(kind.effect(call.id, attempt, deadline))
    if call.handler == "subagent" and attempt > 1:
        respawn(st, call, attempt)


# -- finding the attempt an answer belongs to ------------------------------------


def live_call(st: Step, call_id: str, attempt: int, kind: str | None) -> Call | None:
    call = st.s.calls.get(call_id)
    if call is None or (kind is not None and call.kind != kind):
        st.ignore(f"call {call_id!r} is not open")
        return None
    if call.status not in ("running", "waiting") or call.attempt != attempt:
        st.ignore(f"call {call_id!r} attempt {attempt} was replaced (now {call.attempt})")
        return None
    return call


# -- answers of a kind's runner ----------------------------------------------------


def call_answered(st: Step, inp: CallAnswered) -> None:
    """A registered kind's runner ended an attempt: the kind settles it (kinds.py)."""
    call = live_call(st, inp.call_id, inp.attempt, None)
    if call is None:
        return
    if call.status == "waiting":
        st.ignore(f"call {call.id!r} was already answered (it is async)")
        return
    kind = kinds.of(call.kind, call.handler)
    settle = kind.settle if kind is not None and kind.settle is not None else answered
    settle(st, call, inp)
    turns.settle_turn(st)


def answered(st: Step, call: Call, inp: CallAnswered) -> None:
    """How an answer settles by default: a model reply, or a tool's result."""
    if inp.error is not None:
        call_failed(st, call, inp.error, inp.retryable, inp.retry_after)
    elif call.kind == "llm":
        llm_completed(st, call, inp.result)
    else:
        settle_tool(st, call, tool_result_of(inp.result), None, False)


# -- model calls -----------------------------------------------------------------


def llm_settled(st: Step, inp: LlmCallSettled) -> None:
    call = live_call(st, inp.call_id, inp.attempt, "llm")
    if call is None:
        return
    if inp.response is not None:
        llm_completed(st, call, inp.response)
    else:
        error = inp.error or {"message": "the model call failed", "code": "provider_error"}
        call_failed(st, call, error, inp.retryable, inp.retry_after)
    turns.settle_turn(st)


def llm_completed(st: Step, call: Call, resp: dict[str, Any]) -> None:
    """`llm.finished`: record the reply, then start its tool calls or end the turn."""
    usage, cost = resp.get("usage"), resp.get("cost") or "0"
    st.emit(
        {
            "type": ev.LLM_CALL_COMPLETED,
            "id": call.id,
            "attempt": call.attempt,
            "usage": usage,
            "cost": cost,
            "finish_reason": resp.get("finish_reason"),
            "model": resp.get("model"),
        }
    )
    message: dict[str, Any] = {
        "id": call.id,
        "role": "assistant",
        "content": resp.get("content"),
    }
    tool_calls = resp.get("tool_calls") or []
    if tool_calls:
        message["tool_calls"] = tool_calls
    if resp.get("reasoning"):
        message["reasoning"] = resp["reasoning"]
    finish = resp.get("finish_reason")
    truncated = finish == "length"
    refused = finish == "content_filter"
    actions: list[dict[str, Any]]
    if truncated:
        actions = [_fail("the model's reply was cut off at its length limit", "provider_error")]
    elif refused:
        actions = [_fail("the model declined to answer", "refused")]
    elif tool_calls:
        actions = [tool_call_action(st, tc) for tc in tool_calls]
    else:
        actions = [{"type": "done"}]
    trigger: dict[str, Any] = {
        "type": "llm.finished",
        "id": call.id,
        "ok": True,
        "message": {k: v for k, v in message.items() if v is not None},
        "truncated": truncated,
        "refused": refused,
        "cost": cost,
    }
    if usage:
        trigger["usage"] = usage
    decisions.decide(st, trigger, {"messages": [message], "actions": actions})


def tool_call_action(st: Step, tc: dict[str, Any]) -> dict[str, Any]:
    """A model's tool call: a plain `tool.call`, or a `subagent.spawn` for a child's tool."""
    name, arguments = tc["function"]["name"], tc["function"]["arguments"]
    child = subagent_named(st.s.agent, name)
    if child is None:
        return {"type": "tool.call", "id": tc["id"], "name": name, "arguments": arguments}
    parsed = arguments_of(arguments or "")
    args = parsed if isinstance(parsed, dict) else {}
    spawn: dict[str, Any] = {
        "type": "subagent.spawn",
        "agent_id": child,
        "tool_call_id": tc["id"],
    }
    if isinstance(args.get("message"), str):
        spawn["message"] = {"role": "user", "content": args["message"]}
    if isinstance(args.get("session"), str):
        spawn["session_id"] = args["session"]
    if args.get("mode") is not None:
        spawn["mode"] = args["mode"]
    return spawn


MODES = ("blocking", "detached", "wait")
# The spawn modes a subagent's configured `mode` allows, its default first. `wait`
# collects a child started detached, so it goes wherever `detached` does.
ALLOWED_MODES: dict[str, tuple[str, ...]] = {
    "blocking": ("blocking",),
    "detached": ("detached", "wait"),
    "any": MODES,
}


def spawn_mode(configured: str | None, asked: Any) -> tuple[str, str | None]:
    """The mode a spawn runs in under its subagent's configured mode, and the problem
    with the mode it asked for (None: it may run)."""
    allowed = ALLOWED_MODES.get(configured or "blocking", ("blocking",))
    if asked is None:
        return allowed[0], None
    if asked not in MODES:
        return "blocking", f"mode {asked!r} is not one of {', '.join(MODES)}"
    if asked not in allowed:
        return asked, (
            f"a {asked!r} call is not allowed: the subagent's mode is "
            f"{configured or 'blocking'!r} (allowed: {', '.join(allowed)})"
        )
    return asked, None


def spawn_args(call: Call) -> dict[str, Any]:
    """A subagent call's recorded arguments: `message`, `session?`, `mode?`."""
    args = json.loads(call.arguments or "{}")
    return args if isinstance(args, dict) else {}


def start_subagent(st: Step, action: dict[str, Any], unrunnable: list[tuple[Call, str]]) -> None:
    """`subagent.spawn`: the child is an ordinary session whose id derives from this call."""
    s = st.s
    call_id, agent_id = action["tool_call_id"], action["agent_id"]
    message = action.get("message")
    sub = subagent_entry(s.agent, agent_id)
    mode, mode_problem = spawn_mode((sub or {}).get("mode"), action.get("mode"))
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
            "retry": resolve_policy("subagent", s.agent, action.get("retry")),
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


def _wait_problem(
    action: dict[str, Any], known: dict[str, Any] | None, agent_id: str
) -> str | None:
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
        turns.settle_turn(st)


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
    turns.settle_turn(st)


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
    turns.settle_turn(st)


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
    error: dict[str, Any] | None,
) -> None:
    """A child's run answers `call`: the tool result `{session, result}`, `subagent.finished`."""
    text = result if ok else f"Error: {(error or {}).get('message', 'failed')}"
    answer = tool_result_of({"session": child, "result": text})
    st.emit({"type": ev.TOOL_CALL_COMPLETED, "id": call.id, "result": answer})
    trigger: dict[str, Any] = {
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


def call_failed(
    st: Step,
    call: Call,
    error: dict[str, Any],
    retryable: bool,
    retry_after: float | None,
    *,
    at_once: bool = False,
    policy: dict[str, Any] | None = None,
    counted: bool = True,
    message_id: str | None = None,
) -> None:
    """Retry under the call's policy (or `policy`), or end it for good (its tool message
    recorded under `message_id` when given).

    An attempt lost with its engine is not `counted` against max_attempts: the
    call did not fail, the engine did. The total timeout still bounds it.
    """
    nxt = retry.after_failure(
        policy or call.retry,
        call.attempt,
        call.started_at,
        st.now,
        retryable=retryable,
        retry_after=retry_after,
        at_once=at_once,
        counted=counted,
        total=call.retry,
    )
    final = nxt.final
    if nxt.timed_out:
        error = {
            "message": f"gave up after {call.attempt} attempts: the call's total timeout "
            f"({call.retry['total_timeout_secs']} s) would pass before the next one",
            "code": "deadline_exceeded",
            "detail": {"last_error": error},
        }
    st.emit(
        {
            "type": ev.call_event(call.kind, "errored"),
            "id": call.id,
            "attempt": call.attempt,
            "error": error,
            "retryable": retryable,
            "final": final,
        }
    )
    if final:
        ending = kinds.of(call.kind, call.handler)
        if ending is not None and ending.failed is not None:
            ending.failed(st, call, error)
        elif call.kind == "llm":
            trigger = {
                "type": "llm.finished",
                "id": call.id,
                "ok": False,
                "truncated": False,
                "error": error,
            }
            decisions.decide(st, trigger, {"actions": [{"type": "fail", "error": error}]})
        else:
            tool_finished(st, call, None, error, message_id=message_id)
        return
    next_attempt = call.attempt + 1
    if nxt.due <= st.now:
        dispatch(st, call, next_attempt)
        return
    st.emit(
        {
            "type": ev.CALL_RETRY_SCHEDULED,
            "id": call.id,
            "attempt": next_attempt,
            "due_at": iso(nxt.due),
        }
    )
    st.out.effects.append(StartTimer(nxt.due, TimerFired(call.id, next_attempt)))


def timer_fired(st: Step, inp: TimerFired) -> None:
    call = st.s.calls.get(inp.call_id)
    if call is None or call.status != "retry_scheduled" or inp.attempt != call.attempt + 1:
        st.ignore(f"timer for {inp.call_id!r} attempt {inp.attempt} is stale")
        return
    dispatch(st, call, inp.attempt)


def call_lost(st: Step, inp: CallLost) -> None:
    decision = st.s.decision
    if decision is not None and decision.id == inp.call_id:
        decisions.decision_lost(st, inp)
        return
    call = live_call(st, inp.call_id, inp.attempt, None)
    if call is None or call.status == "waiting":
        return
    lost = Fault.LOST
    error = lost.error("the engine running this call stopped")
    call_failed(st, call, error, lost.retryable, None, at_once=True, counted=False)
    turns.settle_turn(st)


def delivery_failed(st: Step, call: Call, error: dict[str, Any], retryable: bool) -> None:
    """The worker was not reached or answered nonsense: retried like a decision
    (SPEC §11, worker decision row), not under the tool's own attempts."""
    policy = resolve_policy("decision", st.s.agent)
    call_failed(st, call, error, retryable, None, policy=policy)


def call_deadline(st: Step, inp: CallDeadline) -> None:
    call = live_call(st, inp.call_id, inp.attempt, None)
    if call is None:
        return
    if call.handler == "subagent":
        total_due = kinds.whole_run(call)
        queued = call.deadline is not None and st.now >= call.deadline
        if queued and (total_due is None or st.now < total_due):
            # The child's turn never started: this attempt failed; the next one spawns again.
            turns.stop_child(st, call)
            error = retry.queue_timeout(f"subagent {call.name!r}", call.retry)
            call_failed(st, call, error, Fault.DEADLINE.retryable, None)
            turns.settle_turn(st)
            return
        # Its whole run is over its total timeout: final, whatever attempts are left.
        fault = Fault.CHILD_DEADLINE
        total = call.retry.get("total_timeout_secs")
        error = fault.error(f"subagent {call.name!r} did not finish within {total} s")
        turns.stop_child(st, call)
    else:
        fault = Fault.DEADLINE
        error = fault.error(f"{call.name or call.id} ran past its deadline")
    call_failed(st, call, error, fault.retryable, None)
    turns.settle_turn(st)


# -- tool results ----------------------------------------------------------------


def settle_tool(
    st: Step,
    call: Call,
    result: dict[str, Any] | None,
    error: str | None,
    retryable: bool,
    message_id: str | None = None,
) -> None:
    """A tool attempt ended: check the output, retry a retryable error, or finish."""
    if error is None:
        assert result is not None
        mismatch = check_output(find_tool(st.s.agent, call.name or "", st.s.turn_tools), result)
        if mismatch is not None:
            bad = Fault.BAD_OUTPUT
            call_failed(st, call, bad.error(mismatch), bad.retryable, None)
            return
        st.emit({"type": ev.TOOL_CALL_COMPLETED, "id": call.id, "result": result})
        tool_finished(st, call, result, None, message_id=message_id)
        return
    error_info = {"message": error, "code": "handler_error"}
    call_failed(st, call, error_info, retryable, None, message_id=message_id)


def tool_finished(
    st: Step,
    call: Call,
    result: dict[str, Any] | None,
    error: dict[str, Any] | None,
    *,
    trigger: dict[str, Any] | None = None,
    message_id: str | None = None,
) -> None:
    """`tool.finished` (or `subagent.finished`): record the tool message (under
    `message_id` when the client named it); re-prompt once no other call is open."""
    if result is not None:
        content = result_text(result)
    else:
        assert error is not None  # a tool ends with a result or an error
        content = f"Error: {error['message']}"
    message = {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": content}
    if message_id is not None:
        message["id"] = message_id
    if trigger is None:
        trigger = {
            "type": "tool.finished",
            "id": call.id,
            "ok": error is None,
            "name": call.name,
        }
        if result is not None:
            trigger["result"] = result
        if error is not None:
            trigger["error"] = error
    proposed = reprompt_or_nothing(st)
    proposed["messages"] = [message]
    decisions.decide(st, trigger, proposed)


def reprompt_or_nothing(st: Step) -> dict[str, Any]:
    """Re-prompt only once nothing else is open and the branch is not paused."""
    s = st.s
    if s.interrupts or any(c.turn_id == (s.turn.id if s.turn else None) for c in s.calls.values()):
        return {}
    return {"actions": [{"type": "llm.call"}]}


def client_settles_tool(st: Step, body: dict[str, Any]) -> None:
    """A client's `tool.result` / `tool.error` for one of its own tool calls."""
    call = settleable(st, body["id"], body.get("attempt"), client_input=True)
    if body["type"] == "tool.result":
        result = tool_result_of(
            body.get("result"),
            body.get("content"),
            body.get("structured_content"),
            bool(body.get("is_error")),
        )
        settle_tool(st, call, result, None, False)
    else:
        settle_tool(st, call, None, body["error"], bool(body.get("retryable")))
    st.out.reply = {"session_id": st.session_id, "turn_id": call.turn_id, "queued": False}
    turns.settle_turn(st)


def api_settles_call(st: Step, inp: CallSettled) -> None:
    """The settle API: ends an async (waiting) worker call or a client call."""
    call = settleable(st, inp.call_id, inp.attempt, client_input=False)
    if inp.message_id is not None and inp.message_id in st.s.nodes:
        raise MachineError(
            "duplicate_message_id", f"message {inp.message_id!r} is already recorded"
        )
    if inp.error is None:
        result = tool_result_of(inp.result, inp.content)
        settle_tool(st, call, result, None, False, inp.message_id)
    else:
        settle_tool(st, call, None, inp.error, inp.retryable, inp.message_id)
    st.out.reply = {
        "session_id": st.session_id,
        "call_id": call.id,
        "attempt": call.attempt,
    }
    turns.settle_turn(st)


def settleable(st: Step, call_id: str, attempt: int | None, *, client_input: bool) -> Call:
    """The open call a settle names, or a MachineError that says why not."""
    call = st.state.calls.get(call_id) if st.state is not None else None
    if call is None or call.kind != "tool" or call.status not in ("running", "waiting"):
        raise MachineError("call_not_open", f"tool call {call_id!r} is not open", status=409)
    if client_input and call.handler != "client":
        raise MachineError(
            "call_not_open",
            f"tool call {call.id!r} runs on the {call.handler}, not the client",
        )
    kind = kinds.of(call.kind, call.handler)
    if not client_input and call.status != "waiting" and not (kind and kind.outside_settles):
        raise MachineError(
            "call_not_open",
            f"tool call {call.id!r} is being run by the {call.handler}; only an async call "
            "(answered with an empty decision) can be settled",
        )
    if attempt is not None and attempt != call.attempt:
        raise MachineError(
            "stale_attempt",
            f"tool call {call.id!r} is at attempt {call.attempt}, not {attempt}",
        )
    return call


def subagent_entry(agent: dict[str, Any] | None, agent_id: str) -> dict[str, Any] | None:
    """The agent config's subagent entry a spawn names (by id, or by its offered name)."""
    named = subagent_named(agent, agent_id) or agent_id
    return next((sub for sub in (agent or {}).get("subagents") or () if sub["id"] == named), None)


def subagent_named(agent: dict[str, Any] | None, tool_name: str) -> str | None:
    """The child agent a tool name offers (`<id>`, or `agent__<id>` with `prefix`)."""
    for sub in (agent or {}).get("subagents") or ():
        offered = f"agent__{sub['id']}" if sub.get("prefix") else sub["id"]
        if offered == tool_name:
            child: str = sub["id"]
            return child
    return None


def _fail(message: str, code: str) -> dict[str, Any]:
    return {"type": "fail", "error": {"message": message, "code": code}}
