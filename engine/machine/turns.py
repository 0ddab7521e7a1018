"""Turns (SPEC §2, §10): starting, queueing, ending; interrupts (§8); messages between sessions."""

from __future__ import annotations

from typing import Any

from .core import MachineError, StepBase
from .effects import Deliver
from .inputs import (
    ChildCancelled,
    ChildSpawned,
    ClientSubmitted,
    MessageDelivered,
    SubagentFinished,
    SubagentStarted,
)
from .tree import id_clash, match_view, path_to

TURN_STARTS = ("client.message", "client.messages", "client.append", "client.action")
QUEUEABLE = ("client.message", "client.append")
LLM_CALL = {"type": "llm.call"}


class TurnRules(StepBase):
    # -- starting ------------------------------------------------------------------

    slash_commands: tuple[str, ...] = ()

    def submit_turn(self, inp: ClientSubmitted, *, delivered: bool = False) -> None:
        body = inp.input
        self.slash_commands = inp.slash_commands
        s = self.state
        if s is not None and s.agent_id != inp.agent_id:
            raise MachineError(
                "agent_mismatch",
                f"session {self.session_id} runs agent {s.agent_id!r}, not {inp.agent_id!r}",
            )
        turn_id = body.get("turn_id")
        if s is not None and turn_id and turn_id in s.turns:
            status = s.turns[turn_id]
            self.out.reply = self._reply(turn_id, queued=status == "queued", existing=True)
            return
        if s is not None and s.interrupts and not delivered:
            iid = next(iter(s.interrupts))
            raise MachineError(
                "session_interrupted",
                f"session {self.session_id} is paused at interrupt {iid!r}: resume it first",
                interrupt_id=iid,
            )
        clash = id_clash(self._drafts(body), self._recorded_or_queued())
        if clash is not None:
            raise MachineError("duplicate_message_id", clash, status=409)
        if s is not None and body["type"] == "client.append" and not self._fresh(body["messages"]):
            self.out.reply = {"session_id": self.session_id, "turn_id": None, "queued": False}
            self.ignore("every appended message is already recorded")
            return
        if s is not None and s.turn is not None and self._moves_head_away(body):
            # The client left the branch the turn works on: its in-flight work is void.
            # (A queued turn then starts on the branch the client is looking at.)
            self.emit(
                {"type": "head.moved", "head_id": match_view(s.nodes, body["messages"]).known}
            )
            self.fail_turn(
                {"message": "the conversation moved to another branch", "code": "internal"}
            )
            self.out.reply = {"session_id": self.session_id, "turn_id": None, "queued": False}
            return
        if s is not None and s.turn is not None:
            if body.get("queue") and body["type"] in QUEUEABLE:
                turn_id = turn_id or self.ids("turn")
                self.emit({"type": "turn.queued", "turn_id": turn_id, "input": body}, turn_id)
                self.out.reply = self._reply(turn_id, queued=True)
                return
            raise MachineError(
                "turn_already_active",
                f"turn {s.turn.id} is still running in session {self.session_id}",
                turn_id=s.turn.id,
            )
        if s is not None and body["type"] == "client.messages" and self._only_moves_head(body):
            return
        turn_id = turn_id or self.ids("turn")
        self.out.reply = self._reply(turn_id, queued=False)
        if s is None:
            self.emit(
                {
                    "type": "session.created",
                    "agent_id": inp.agent_id,
                    "decider": inp.decider,
                    "identity": inp.identity,
                    "llm_routes": inp.llm_routes or {},
                    "ancestry": inp.ancestry or [],
                }
            )
            self.start_turn(turn_id, body, start_config=inp.agent_config or {})
        else:
            self.start_turn(turn_id, body)

    def _fresh(self, drafts: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Drafts whose ids are neither recorded nor already waiting in the queue."""
        known = self._recorded_or_queued()
        return [m for m in drafts if not (m.get("id") and m["id"] in known)]

    def _recorded_or_queued(self) -> set[str]:
        s = self.state
        if s is None:
            return set()
        queued = {
            m["id"]
            for q in s.queue
            for m in (q["input"].get("messages") or [q["input"].get("message") or {}])
            if m.get("id")
        }
        return queued | set(s.nodes)

    def _drafts(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        """The messages this input would record (an append's known ones are dropped)."""
        kind = body["type"]
        if kind == "client.message":
            return [body["message"]]
        if kind == "client.append":
            return self._fresh(body["messages"]) if self.state else body["messages"]
        if kind == "client.messages":
            nodes = self.state.nodes if self.state else {}
            return body["messages"][match_view(nodes, body["messages"]).new_from :]
        return []

    def _moves_head_away(self, body: dict[str, Any]) -> bool:
        """A view with nothing new that ends at an earlier reply (see `_only_moves_head`)."""
        if body["type"] != "client.messages":
            return False
        match = match_view(self.s.nodes, body["messages"])
        if match.new_from < len(body["messages"]) or match.known == self.s.head_id:
            return False
        return match.known is None or self.s.nodes[match.known].message["role"] != "user"

    def _only_moves_head(self, body: dict[str, Any]) -> bool:
        """A view with nothing new moves the head there and writes nothing else.

        Unless it ends at a user message: that is a regenerate (the view without the
        reply), which runs a turn whose reply is a sibling of the old one.
        """
        match = match_view(self.s.nodes, body["messages"])
        if match.new_from < len(body["messages"]):
            return False
        if match.known is not None and self.s.nodes[match.known].message["role"] == "user":
            return False
        if match.known != self.s.head_id:
            self.emit({"type": "head.moved", "head_id": match.known})
        self.out.reply = {"session_id": self.session_id, "turn_id": None, "queued": False}
        return True

    def _reply(self, turn_id: str, *, queued: bool, existing: bool = False) -> dict[str, Any]:
        reply = {"session_id": self.session_id, "turn_id": turn_id, "queued": queued}
        if existing:
            reply["existing"] = True
        return reply

    def start_turn(
        self, turn_id: str, body: dict[str, Any], start_config: dict[str, Any] | None = None
    ) -> None:
        started: dict[str, Any] = {"type": "turn.started", "turn_id": turn_id}
        if body.get("parent"):
            started["parent"] = body["parent"]
            parent = body["parent"]
            self.out.effects.append(
                Deliver(parent["session_id"], SubagentStarted(self.session_id, parent["call_id"]))
            )
        self.emit(started, turn_id)
        if start_config is not None:
            # session.start: the engine proposes the file's agent config.
            self.trigger({"type": "session.start"}, {"agent": start_config} if start_config else {})
        kind = body["type"]
        if kind == "client.action":
            trigger = {"type": "client.action", "name": body["name"]}
            if body.get("args") is not None:
                trigger["args"] = body["args"]
            self.trigger(trigger, self._action_proposal(body))
        else:
            self.trigger(*self._messages_trigger(body))
        self.settle_turn()

    def _action_proposal(self, body: dict[str, Any]) -> dict[str, Any]:
        """Nothing, except for a slash command: record `/<command> <text>` and call the model,
        so commands work with no worker code (a worker may replace it)."""
        command = f"/{body['name']}"
        if command not in self.slash_commands:
            return {}
        args = body.get("args")
        text = args.get("text") if isinstance(args, dict) else None
        content = f"{command} {text}".strip() if isinstance(text, str) else command
        return {"messages": [{"role": "user", "content": content}], "actions": [LLM_CALL]}

    def _messages_trigger(self, body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """Every message input reaches a worker as `client.messages` (SPEC §4)."""
        kind = body["type"]
        if kind == "client.messages":
            view = body["messages"]
            match = match_view(self.s.nodes, view)
            if match.known != self.s.head_id:
                self.emit({"type": "head.moved", "head_id": match.known})
            new, new_from = view[match.new_from :], match.new_from
        else:
            # The view is the recorded path and the new messages: the log keeps where the
            # path ends, not the path (a turn's events stay the same size as the session
            # grows); the request spells it out (`wire_trigger`).
            new = [body["message"]] if kind == "client.message" else self._fresh(body["messages"])
            path = path_to(self.s.nodes, self.s.head_id)
            trigger = {
                "type": "client.messages",
                "path_to": self.s.head_id,
                "messages": new,
                "new_from": len(path),
                "client": body.get("client") or {},
            }
            return trigger, {"messages": new, "actions": [LLM_CALL]}
        trigger = {
            "type": "client.messages",
            "messages": view,
            "new_from": new_from,
            "client": body.get("client") or {},
        }
        return trigger, {"messages": new, "actions": [LLM_CALL]}

    def record_messages(self, drafts: list[dict[str, Any]]) -> None:
        clash = id_clash(drafts, self.s.nodes)
        if clash is not None:  # inputs and answers are checked before this: a bug if reached
            raise ValueError(clash)
        for draft in drafts:
            msg = {k: v for k, v in draft.items() if v is not None}
            msg["id"] = msg.get("id") or self.ids("msg")
            self.emit({"type": "message.new", "message": msg, "parent_id": self.s.head_id})

    # -- ending ----------------------------------------------------------------------

    def open_calls(self) -> list[Any]:
        turn = self.s.turn
        return [c for c in self.s.calls.values() if turn is not None and c.turn_id == turn.id]

    def busy(self) -> bool:
        """Anything still in flight or waiting in this turn."""
        s = self.s
        return bool(self.open_calls() or s.decision or s.pending or s.interrupts)

    def settle_turn(self) -> None:
        """A turn with nothing left in flight is over.

        An engine-decided turn ends at once. For a worker, the empty decision
        "parks" the session; we read that as the turn having nothing more to do
        and ask the worker one last time with `turn.finished`.
        """
        s = self.state
        if s is None or s.turn is None or self.busy():
            return
        if self.by_worker:
            self.finish_with_worker(None)
        else:
            self.end_turn(None)

    def finish_with_worker(self, data: Any) -> None:
        turn = self.s.turn
        assert turn is not None
        trigger: dict[str, Any] = {
            "type": "turn.finished",
            "turn_id": turn.id,
            "cost": turn.cost,
            "usage": turn.usage,
        }
        done: dict[str, Any] = {"type": "done"}
        if data is not None:
            trigger["data"] = data
            done["data"] = data
        self.trigger(trigger, {"actions": [done]})

    def tell_parent(self, turn: Any, *, ok: bool, error: dict[str, Any] | None) -> None:
        """A child's turn ended: its parent's call gets the last reply, usage and cost."""
        if turn.parent is None:
            return
        head = self.s.nodes.get(self.s.head_id or "")
        reply = head.message if head is not None and head.message["role"] == "assistant" else {}
        content = reply.get("content")
        finished = SubagentFinished(
            child_session=self.session_id,
            call_id=turn.parent["call_id"],
            agent_id=self.s.agent_id,
            ok=ok,
            result=content if isinstance(content, str) else None,
            error=error,
            usage=turn.usage,
            cost=turn.cost,
        )
        self.out.effects.append(Deliver(turn.parent["session_id"], finished))

    def close_open_calls(self) -> None:
        """A turn that ends closes what it still has open, each with an event of its own;
        a child still running for one of them is stopped."""
        for call in self.open_calls():
            self.stop_child(call)
            self.emit(
                {
                    "type": f"{call.kind}.call.errored",
                    "id": call.id,
                    "attempt": call.attempt,
                    "error": {
                        "message": "the turn ended before the call finished",
                        "code": "internal",
                        "detail": {"reason": "turn_ended"},
                    },
                    "retryable": False,
                    "final": True,
                }
            )

    def stop_child(self, call: Any) -> None:
        """A subagent call ends early: the child still running its turn is stopped."""
        if call.handler != "subagent":
            return
        child = next((c for c, v in self.s.children.items() if v.get("call_id") == call.id), None)
        if child is not None:
            self.out.effects.append(Deliver(child, ChildCancelled(self.session_id, call.id)))

    def end_turn(self, data: Any) -> None:
        turn = self.s.turn
        assert turn is not None
        self.close_open_calls()
        payload: dict[str, Any] = {
            "type": "turn.completed",
            "turn_id": turn.id,
            "cost": turn.cost,
            "usage": turn.usage,
        }
        if data is not None:
            payload["data"] = data
        self.emit(payload)
        self.tell_parent(turn, ok=True, error=None)
        self.next_queued()

    def fail_turn(self, error: dict[str, Any]) -> None:
        turn = self.s.turn
        assert turn is not None
        self.close_open_calls()
        self.emit(
            {
                "type": "turn.failed",
                "turn_id": turn.id,
                "error": error,
                "cost": turn.cost,
                "usage": turn.usage,
            }
        )
        self.tell_parent(turn, ok=False, error=error)
        self.next_queued()

    def next_queued(self) -> None:
        if self.s.queue:
            nxt = self.s.queue[0]
            self.start_turn(nxt["turn_id"], nxt["input"])

    # -- interrupts (SPEC §8) --------------------------------------------------------

    def raise_interrupt(self, action: dict[str, Any], origin: str) -> None:
        iid = action.get("interrupt_id") or self.ids("int")
        if iid in self.s.interrupts:
            return
        self.emit(
            {
                "type": "session.interrupted",
                "interrupt_id": iid,
                "origin": origin,
                "reason": action.get("reason") or "",
                "payload": action.get("payload"),
            }
        )

    def resume_interrupt(self, iid: str, payload: Any) -> bool:
        """Resume; an old or repeated id does nothing."""
        if self.state is None or iid not in self.s.interrupts:
            self.ignore(f"interrupt {iid!r} is not open")
            return False
        resumed: dict[str, Any] = {"type": "session.interrupt_resumed", "interrupt_id": iid}
        trigger: dict[str, Any] = {"type": "interrupt.resumed", "interrupt_id": iid}
        if payload is not None:
            resumed["payload"] = payload
            trigger["payload"] = payload
        self.emit(resumed)
        self.trigger(trigger, self.reprompt_or_nothing())
        return True

    # -- messages between sessions ---------------------------------------------------

    def send_message(self, action: dict[str, Any]) -> None:
        message = {k: v for k, v in action["message"].items() if v is not None}
        # The id travels with the message: the receiver drops one it has seen.
        message["id"] = message.get("id") or f"{self.session_id}:{self.s.seq + 1}"
        self.emit({"type": "message.sent", "to": action["session_id"], "message": message})
        self.out.effects.append(
            Deliver(action["session_id"], MessageDelivered(self.session_id, message))
        )

    def message_delivered(self, inp: MessageDelivered) -> None:
        s = self.state
        if s is None:
            self.ignore(f"message.send to {self.session_id!r}, which does not exist")
            return
        body = {
            "type": "client.append",
            "agent_id": s.agent_id,
            "messages": [inp.message],
            "queue": True,
        }
        identity = {"subject": {"issuer": "session", "id": inp.from_session}}
        self.submit_turn(ClientSubmitted(body, s.agent_id, identity, None), delivered=True)

    # -- subagents: the child's side (SPEC §9) ---------------------------------------

    def child_spawned(self, inp: ChildSpawned) -> None:
        """Start (or continue) this child session with the parent's message, as one turn.

        The turn id is derived from the parent's call, so a replayed spawn is the same turn.
        """
        parent = {"session_id": inp.parent_session, "call_id": inp.call_id}
        body = {
            "type": "client.message",
            "agent_id": inp.agent_id,
            "message": inp.message,
            "turn_id": f"sub~{inp.parent_session}~{inp.call_id}",
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
        )
        self.submit_turn(submitted, delivered=True)

    def child_cancelled(self, inp: ChildCancelled) -> None:
        turn = self.s.turn
        if turn is None or turn.parent != {
            "session_id": inp.parent_session,
            "call_id": inp.call_id,
        }:
            self.ignore("no turn of this session runs for that call")
            return
        self.fail_turn({"message": "the parent's turn ended", "code": "internal"})
