"""Turns (SPEC §2, §10): submitting, starting, queueing; resuming an interrupt (§8);
messages between sessions; the child's side of a subagent call.

Queued turns: an input sent with `queue: true` while a turn runs waits in the session's
FIFO. The agent's `retry.default.queue_timeout_secs` bounds that wait when it is set (no
limit by default, retry.py `turn`): the deadline is recorded on `turn.queued`, a timer
enforces it, and a turn still waiting then fails (`turn.failed`, `deadline_exceeded`,
`detail.reason: "queue_timeout"`) without running.
It is not retried: another wait in the same queue is what a retry would be. A turn a
parent's subagent call runs has no timer here: the parent's call times its start.

How a turn ends is ending.py's; starting the next queued one is `advance`'s (step.py),
which also takes the turn's first decision (`Opening`) once the turn has started.
"""

from __future__ import annotations

from typing import Any

from . import budgets, retry
from . import events as ev
from .asking import decide
from .calls import call_failed, dispatch, reprompt_or_nothing, send_tool
from .connections import connector_of, own_names, tools_of
from .connectors import start_sync
from .core import MachineError, Opening, Step
from .effects import Deliver
from .ending import drop_queued, fail_turn
from .inputs import (
    ChildCancelled,
    ChildSpawned,
    ClientSubmitted,
    InterruptDeadline,
    MessageDelivered,
    QueueDeadline,
    SubagentStarted,
)
from .interrupts import EXPIRED, approved, expired, submitter
from .shapes import (
    ActionInput,
    Answer,
    AppendInput,
    ClientAction,
    ClientMessages,
    ErrorInfo,
    InterruptResumed,
    LlmCall,
    MessageInput,
    MessageSend,
    OpenInterrupt,
    ParentRef,
    Submitter,
    TurnStart,
    ViewInput,
)
from .tools import client_tool_clash, submitted_tools
from .tree import id_clash, match_view, path_to

TURN_STARTS = ("client.message", "client.messages", "client.append", "client.action")


LLM_CALL: LlmCall = {"type": "llm.call"}


# -- starting ------------------------------------------------------------------


def submit_turn(
    st: Step, inp: ClientSubmitted, body: TurnStart, *, delivered: bool = False
) -> None:
    """A turn-starting input (`body`, the input's): started now, queued behind the running
    turn, or refused."""
    if inp.traceparent is not None:
        body = body.copy()
        body["traceparent"] = inp.traceparent
        if inp.tracestate is not None:
            body["tracestate"] = inp.tracestate
    st.slash_commands = inp.slash_commands
    s = st.state
    if s is not None and s.agent_id != inp.agent_id:
        raise MachineError(
            f"session {st.session_id} runs agent {s.agent_id!r}, not {inp.agent_id!r}",
            code="agent_mismatch",
        )
    turn_id = body.get("turn_id")
    if s is not None and turn_id and turn_id in s.turns:
        status = s.turns[turn_id]
        st.out.reply = _reply(st, turn_id, queued=status == "queued", existing=True)
        return
    if s is not None and s.interrupts and not delivered:
        iid = next(iter(s.interrupts))
        raise MachineError(
            f"session {st.session_id} is paused at interrupt {iid!r}: resume it first",
            code="session_interrupted",
            interrupt_id=iid,
        )
    _check_client_tools(st, inp, body)
    clash = id_clash(_drafts(st, body), _recorded_or_queued(st))
    if clash is not None:
        raise MachineError(clash, code="duplicate_message_id", status=409)
    if s is not None and body["type"] == "client.append" and not _fresh(st, body["messages"]):
        st.out.reply = {"session_id": st.session_id, "turn_id": None, "queued": False}
        st.ignore("every appended message is already recorded")
        return
    if s is not None and s.turn is not None and _moves_head_away(st, body):
        # The client left the branch the turn works on: its in-flight work is void.
        # (A queued turn then starts on the branch the client is looking at.)
        assert body["type"] == "client.messages"  # only a view moves the head away
        st.emit({"type": ev.HEAD_MOVED, "head_id": match_view(s.nodes, body["messages"]).known})
        fail_turn(st, {"message": "the conversation moved to another branch", "code": "internal"})
        st.out.reply = {"session_id": st.session_id, "turn_id": None, "queued": False}
        return
    if s is not None and s.turn is not None:
        if _queues(body):
            turn_id = turn_id or st.ids("turn")
            queued: ev.TurnQueued = {"type": ev.TURN_QUEUED, "turn_id": turn_id, "input": body}
            if not delivered:
                queued["by"] = submitter(inp.owner, inp.identity)
            due = None
            if not body.get("parent"):
                due = retry.queue_deadline(st.kinds.policy("turn", s.agent), st.now)
            if due is not None:
                queued["deadline_ms"] = due
            st.emit(queued, turn_id)
            st.out.reply = _reply(st, turn_id, queued=True)
            return
        raise MachineError(
            f"turn {s.turn.id} is still running in session {st.session_id}",
            code="turn_already_active",
            turn_id=s.turn.id,
        )
    if s is not None and body["type"] == "client.messages" and _only_moves_head(st, body):
        return
    turn_id = turn_id or st.ids("turn")
    st.out.reply = _reply(st, turn_id, queued=False)
    by = None if delivered else submitter(inp.owner, inp.identity)
    if s is None:
        st.emit(
            {
                "type": ev.SESSION_CREATED,
                "agent_id": inp.agent_id,
                "decider": inp.decider,
                "identity": inp.identity,
                "llm_routes": inp.llm_routes or {},
                "ancestry": inp.ancestry or [],
            }
        )
        start_turn(st, turn_id, body, start_config=inp.agent_config or {}, by=by)
    else:
        start_turn(st, turn_id, body, by=by)


def _queues(body: TurnStart) -> bool:
    """Whether the input asks to wait behind a running turn (only some kinds may)."""
    if body["type"] == "client.message" or body["type"] == "client.append":
        return bool(body.get("queue"))
    return False


def _client_of(body: TurnStart) -> dict[str, Any] | None:
    """The input's ClientContext (its per-submit tools), for the kinds that carry one."""
    client: dict[str, Any] | None = None
    if body["type"] == "client.messages" or body["type"] == "client.append":
        client = body.get("client")
    return client


def _check_client_tools(st: Step, inp: ClientSubmitted, body: TurnStart) -> None:
    """A per-submit tool may not take a name the model is already offered (SPEC §6): an
    agent tool, a subagent, a connection's tool as last synced."""
    tools = submitted_tools(_client_of(body))
    if not tools:
        return
    s = st.state
    agent = s.agent if s is not None else inp.agent_config
    offered = own_names(agent)
    if s is not None:
        offered |= set(tools_of(s, offered))
    clash = client_tool_clash(tools, offered)
    if clash is not None:
        index, why = clash
        param = f"input.client.tools.{index}.name"
        raise MachineError(f"{param}: {why}", code="invalid_input", status=422, param=param)


def _fresh(st: Step, drafts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Drafts whose ids are neither recorded nor already waiting in the queue."""
    known = _recorded_or_queued(st)
    return [m for m in drafts if not (m.get("id") and m["id"] in known)]


def _recorded_or_queued(st: Step) -> set[str]:
    s = st.state
    if s is None:
        return set()
    queued = {m["id"] for q in s.queue for m in _carried(q["input"]) if m.get("id")}
    return queued | set(s.nodes)


def _carried(body: TurnStart) -> list[dict[str, Any]]:
    """The messages an input carries, as it carries them."""
    if body["type"] == "client.message":
        return [body["message"] or {}]
    if body["type"] == "client.action":
        return [{}]
    return body["messages"] or [{}]


def _drafts(st: Step, body: TurnStart) -> list[dict[str, Any]]:
    """The messages this input would record (an append's known ones are dropped)."""
    if body["type"] == "client.message":
        return [body["message"]]
    if body["type"] == "client.append":
        messages = body["messages"] or []
        return _fresh(st, messages) if st.state else messages
    if body["type"] == "client.messages":
        messages = body["messages"] or []
        nodes = st.state.nodes if st.state else {}
        return messages[match_view(nodes, messages).new_from :]
    return []


def _moves_head_away(st: Step, body: TurnStart) -> bool:
    """A view with nothing new that ends at an earlier reply (see `_only_moves_head`)."""
    if body["type"] != "client.messages":
        return False
    match = match_view(st.s.nodes, body["messages"])
    if match.new_from < len(body["messages"]) or match.known == st.s.head_id:
        return False
    return match.known is None or st.s.nodes[match.known].message["role"] != "user"


def _only_moves_head(st: Step, body: ViewInput) -> bool:
    """A view with nothing new moves the head there and writes nothing else.

    Unless it ends at a user message: that is a regenerate (the view without the
    reply), which runs a turn whose reply is a sibling of the old one.
    """
    match = match_view(st.s.nodes, body["messages"])
    if match.new_from < len(body["messages"]):
        return False
    if match.known is not None and st.s.nodes[match.known].message["role"] == "user":
        return False
    if match.known != st.s.head_id:
        st.emit({"type": ev.HEAD_MOVED, "head_id": match.known})
    st.out.reply = {"session_id": st.session_id, "turn_id": None, "queued": False}
    return True


def _reply(st: Step, turn_id: str, *, queued: bool, existing: bool = False) -> dict[str, Any]:
    reply = {"session_id": st.session_id, "turn_id": turn_id, "queued": queued}
    if existing:
        reply["existing"] = True
    return reply


def start_turn(
    st: Step,
    turn_id: str,
    body: TurnStart,
    start_config: dict[str, Any] | None = None,
    by: Submitter | None = None,
) -> None:
    """Record the turn's start and what opens it; `advance` asks for its first decision."""
    started: ev.TurnStarted = {"type": ev.TURN_STARTED, "turn_id": turn_id}
    if by:
        started["by"] = by
    tools = submitted_tools(_client_of(body))
    if tools:
        started["client_tools"] = tools
    traceparent, tracestate = body.get("traceparent"), body.get("tracestate")
    if traceparent:
        started["traceparent"] = traceparent
        if tracestate:
            started["tracestate"] = tracestate
    parent = body.get("parent")
    if parent:
        started["parent"] = parent
        begun = SubagentStarted(st.session_id, parent["call_id"], parent.get("attempt", 1))
        st.out.effects.append(Deliver(parent["session_id"], begun))
    st.emit(started, turn_id)
    if start_config is not None:
        # session.start: the engine proposes the file's agent config.
        decide(st, {"type": "session.start"}, {"agent": start_config} if start_config else {})
    if body["type"] == "client.action":
        action: ClientAction = {"type": "client.action", "name": body["name"]}
        if body.get("args") is not None:
            action["args"] = body["args"]
        st.record(Opening(action, _action_proposal(st, body), start_config, _sync_asked(body)))
    else:
        messages, proposed = _messages_trigger(st, body)
        st.record(Opening(messages, proposed, start_config, None))


def start_queued(st: Step) -> None:
    """No turn runs: the oldest queued one starts."""
    nxt = st.s.queue[0]
    start_turn(st, nxt["turn_id"], nxt["input"], by=nxt.get("by"))


def _sync_asked(body: ActionInput) -> str | None:
    """A client's `connector.sync` action: the connection to fetch afresh."""
    args = body.get("args")
    if body["name"] != "connector.sync":
        return None
    path = args.get("path") if isinstance(args, dict) else None
    return path if isinstance(path, str) else None


def _action_proposal(st: Step, body: ActionInput) -> Answer:
    """Nothing, except for a slash command: record `/<command> <text>` and call the model,
    so commands work with no worker code (a worker may replace it)."""
    command = f"/{body['name']}"
    if command not in st.slash_commands:
        return {}
    args = body.get("args")
    text = args.get("text") if isinstance(args, dict) else None
    content = f"{command} {text}".strip() if isinstance(text, str) else command
    return {"messages": [{"role": "user", "content": content}], "actions": [LLM_CALL]}


def _messages_trigger(
    st: Step, body: MessageInput | ViewInput | AppendInput
) -> tuple[ClientMessages, Answer]:
    """Every message input reaches a worker as `client.messages` (SPEC §4)."""
    if body["type"] == "client.messages":
        view = body["messages"]
        match = match_view(st.s.nodes, view)
        if match.known != st.s.head_id:
            st.emit({"type": ev.HEAD_MOVED, "head_id": match.known})
        new, new_from = view[match.new_from :], match.new_from
    else:
        # The view is the recorded path and the new messages: the log keeps where the
        # path ends, not the path (a turn's events stay the same size as the session
        # grows); the request spells it out (`wire_trigger`).
        new = (
            [body["message"]] if body["type"] == "client.message" else _fresh(st, body["messages"])
        )
        path = path_to(st.s.nodes, st.s.head_id)
        recorded: ClientMessages = {
            "type": "client.messages",
            "path_to": st.s.head_id,
            "messages": new,
            "new_from": len(path),
            "client": _client_context(_client_of(body)),
        }
        return recorded, {"messages": new, "actions": [LLM_CALL]}
    trigger: ClientMessages = {
        "type": "client.messages",
        "messages": view,
        "new_from": new_from,
        "client": _client_context(_client_of(body)),
    }
    return trigger, {"messages": new, "actions": [LLM_CALL]}


def _client_context(given: dict[str, Any] | None) -> dict[str, Any]:
    """The input's ClientContext as a worker gets it: its tools as the turn runs them."""
    client: dict[str, Any] = given or {}
    if client.get("tools"):
        client = {**client, "tools": submitted_tools(client)}
    return client


def record_messages(st: Step, drafts: list[dict[str, Any]]) -> None:
    """Add messages to the tree at the head; their ids were checked before."""
    clash = id_clash(drafts, st.s.nodes)
    if clash is not None:  # inputs and answers are checked before this: a bug if reached
        raise ValueError(clash)
    for draft in drafts:
        msg = {k: v for k, v in draft.items() if v is not None}
        msg["id"] = msg.get("id") or st.ids("msg")
        st.emit({"type": ev.MESSAGE_NEW, "message": msg, "parent_id": st.s.head_id})


def queue_deadline(st: Step, inp: QueueDeadline) -> None:
    """A queued turn's queue timeout passed: one still waiting fails, never having run."""
    queued = next((q for q in st.s.queue if q["turn_id"] == inp.turn_id), None)
    if queued is None:
        st.ignore(f"turn {inp.turn_id!r} is no longer queued")
        return
    policy = st.kinds.policy("turn", st.s.agent)
    drop_queued(st, inp.turn_id, retry.queue_timeout(f"turn {inp.turn_id}", policy))


# -- interrupts (SPEC §8) --------------------------------------------------------


def resume_interrupt(st: Step, iid: str, payload: Any, *, expire: bool = False) -> bool:
    """Resume; an old or repeated id does nothing. One past its `expiresAt` (or `expire`,
    its timer) resolves as expired instead, with `EXPIRED` as the payload: False then."""
    if st.state is None or iid not in st.s.interrupts:
        st.ignore(f"interrupt {iid!r} is not open")
        return False
    interrupt = st.s.interrupts[iid]
    expire = expire or expired(interrupt, st.now)
    if expire:
        payload = EXPIRED
    connector = connector_of(interrupt)
    resumed: ev.SessionInterruptResumed = {
        "type": ev.SESSION_INTERRUPT_RESUMED,
        "interrupt_id": iid,
    }
    trigger: InterruptResumed = {"type": "interrupt.resumed", "interrupt_id": iid}
    if payload is not None:
        resumed["payload"] = payload
        trigger["payload"] = payload
    if expire:
        resumed["expired"] = True
    st.emit(resumed)
    if budgets.budget_of(interrupt) is not None:
        _budget_answered(st, interrupt, payload, expire)
        return not expire
    if interrupt.get("origin") == "approval":
        if st.by_worker and st.s.turn is not None:
            # The worker is told, as of any interrupt on its branch (SPEC §8), though it
            # did not raise this one: the engine's own answer follows (the held call is
            # sent, or ends as a tool error), so nothing is proposed; `tool.finished`
            # comes after, as for any other call.
            decide(st, trigger, {})
        _approval_answered(st, interrupt, payload, expire)
        return not expire
    if connector is not None and st.s.turn is not None:
        start_sync(st, connector, force=True)  # the held decision follows it
        return not expire
    decide(st, trigger, reprompt_or_nothing(st))
    return not expire


def interrupt_deadline(st: Step, inp: InterruptDeadline) -> None:
    """An interrupt's `expiresAt` passed: one still open resolves as expired."""
    if st.state is None or inp.interrupt_id not in st.s.interrupts:
        st.ignore(f"interrupt {inp.interrupt_id!r} is not open")
        return
    resume_interrupt(st, inp.interrupt_id, None, expire=True)


def _approval_answered(st: Step, interrupt: OpenInterrupt, payload: Any, expire: bool) -> None:
    """A tool call that waited for a person (connectors' `approve`): approved, it is sent;
    declined or expired, it ends as a tool error the model reads."""
    call_id = (interrupt.get("payload") or {}).get("toolCallId")
    call = st.s.calls.get(call_id or "")
    if call is None or call.status != "requested":
        return
    if not expire and approved(payload):
        dispatch(st, call, 1)
        return
    why = "nobody approved it before the prompt expired" if expire else "a person declined it"
    error: ErrorInfo = {
        "message": f"{call.name} was not run: {why}",
        "code": "handler_error",
        "detail": {"declined": True, "expired": expire},
    }
    call_failed(st, call, error, False, None)


def _budget_answered(st: Step, interrupt: OpenInterrupt, payload: Any, expire: bool) -> None:
    """A call held by its budget (budgets.py): approved, its limit was raised (the resume
    event's fold) and it is sent; declined or expired, the turn fails as over budget."""
    meta = budgets.budget_of(interrupt) or {}
    call = st.s.calls.get(str(meta.get("call_id") or ""))
    if st.s.turn is None:
        return
    if not expire and approved(payload):
        if call is not None and call.status == "requested":
            # A tool call may still need its connection's approval; a model call is sent.
            if call.kind == "tool":
                send_tool(st, call)
            else:
                dispatch(st, call, 1)
        return
    why = "the prompt expired" if expire else "a person declined to raise it"
    figures: dict[str, Any] = {
        k: meta[k]
        for k in ("limit", "allowed", "spent", "next", "policy", "group", "dimension", "frees_at")
        if k in meta
    }
    said = str(interrupt.get("reason") or "").removeprefix("budget: ")
    error: ErrorInfo = {
        "message": f"budget exceeded: {said}; {why}",
        "code": "budget_exceeded",
        "detail": {**figures, "declined": not expire, "expired": expire},
    }
    fail_turn(st, error)


# -- messages between sessions ---------------------------------------------------


def send_message(st: Step, action: MessageSend) -> None:
    """Record a message for another session and hand it over after the commit."""
    message = {k: v for k, v in action["message"].items() if v is not None}
    # The id travels with the message: the receiver drops one it has seen.
    message["id"] = message.get("id") or f"{st.session_id}:{st.s.seq + 1}"
    st.emit({"type": ev.MESSAGE_SENT, "to": action["session_id"], "message": message})
    st.out.effects.append(Deliver(action["session_id"], MessageDelivered(st.session_id, message)))


def message_delivered(st: Step, inp: MessageDelivered) -> None:
    """Another session's message arrives: it starts or queues a turn here."""
    s = st.state
    if s is None:
        st.ignore(f"message.send to {st.session_id!r}, which does not exist")
        return
    body: AppendInput = {
        "type": "client.append",
        "agent_id": s.agent_id,
        "messages": [inp.message],
        "queue": True,
    }
    identity = {"subject": {"issuer": "session", "id": inp.from_session}}
    submit_turn(st, ClientSubmitted(body, s.agent_id, identity, None), body, delivered=True)


# -- subagents: the child's side (SPEC §9) ---------------------------------------


def child_spawned(st: Step, inp: ChildSpawned) -> None:
    """Start (or continue) this child session with the parent's message, as one turn.

    The turn id is derived from the parent's call (and its attempt, past the first), so a
    replayed spawn is the same turn and a retried one a turn of its own.
    """
    parent: ParentRef = {"session_id": inp.parent_session, "call_id": inp.call_id}
    turn_id = f"sub~{inp.parent_session}~{inp.call_id}"
    if inp.attempt > 1:
        parent["attempt"] = inp.attempt
        turn_id += f"~{inp.attempt}"
    body: MessageInput = {
        "type": "client.message",
        "agent_id": inp.agent_id,
        "message": inp.message,
        "turn_id": turn_id,
        "queue": True,
        "parent": parent,
    }
    identity = {"subject": {"issuer": "session", "id": inp.parent_session}, "metadata": {}}
    submitted = ClientSubmitted(
        body,
        inp.agent_id,
        identity,
        inp.agent_config,
        inp.decider,
        inp.llm_routes,
        ancestry=inp.ancestry,
        traceparent=inp.traceparent,
    )
    submit_turn(st, submitted, body, delivered=True)


def child_cancelled(st: Step, inp: ChildCancelled) -> None:
    """The parent's call ended: its turn here stops, or, still queued, never starts."""

    def for_call(parent: ParentRef | None) -> bool:
        if parent is None or (parent["session_id"], parent["call_id"]) != (
            inp.parent_session,
            inp.call_id,
        ):
            return False
        return inp.attempt is None or parent.get("attempt", 1) <= inp.attempt

    error: ErrorInfo = {"message": "the parent's call ended", "code": "internal"}
    waiting = [q["turn_id"] for q in st.s.queue if for_call(q["input"].get("parent"))]
    for turn_id in waiting:
        drop_queued(st, turn_id, error)
    turn = st.s.turn
    if turn is not None and for_call(turn.parent):
        fail_turn(st, error)
    elif not waiting:
        st.ignore("no turn of this session runs for that call")
