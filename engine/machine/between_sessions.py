"""What passes between sessions (SPEC §5 `message.send`, §9): messages, and the child's
side of a subagent call.

A session's `message.send` is recorded here and handed to the other session after the
commit; there it starts a turn, or queues behind the running one. A parent's subagent
call reaches its child the same way: its spawn is a queued turn of the child's, whose
id is derived from the call, and its end (`ChildCancelled`) stops that turn, or drops it
still queued. The parent's side of the call is subagents.py's.
"""

from __future__ import annotations

from . import events as ev
from .core import Step
from .effects import Deliver
from .ending import drop_queued, fail_turn
from .inputs import ChildCancelled, ChildSpawned, ClientSubmitted, MessageDelivered
from .shapes import AppendInput, ErrorInfo, MessageInput, MessageSend, ParentRef
from .turns import submit_turn


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
