"""Turns (SPEC §2, §10): submitting, starting, queueing.

Queued turns: an input sent with `queue: true` while a turn runs waits in the session's
FIFO. The agent's `retry.default.queue_timeout_secs` bounds that wait when it is set (no
limit by default, retry.py `turn`): the deadline is recorded on `turn.queued`, a timer
enforces it, and a turn still waiting then fails (`turn.failed`, `deadline_exceeded`,
`detail.reason: "queue_timeout"`) without running.
It is not retried: another wait in the same queue is what a retry would be. A turn a
parent's subagent call runs has no timer here: the parent's call times its start.

How a turn ends is ending.py's; starting the next queued one is `advance`'s (step.py),
which also takes the turn's first decision (`Opening`) once the turn has started.
Resuming an interrupt is resuming.py's; what other sessions send here (a message, a
parent's subagent call) is between_sessions.py's, which submits it as a turn.
"""

from __future__ import annotations

from typing import Any

from . import events as ev
from . import retry
from .asking import decide
from .connections import own_names, tools_of
from .core import MachineError, Opening, Step
from .effects import Deliver
from .ending import drop_queued, fail_turn
from .inputs import ClientSubmitted, QueueDeadline, SubagentStarted
from .interrupts import submitter
from .shapes import (
    ActionInput,
    Answer,
    AppendInput,
    ClientAction,
    ClientMessages,
    LlmCall,
    MessageInput,
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
