"""A tool call's end as the model reads it (SPEC §6): its `tool` message, and a re-prompt.

However a tool call ends (its result, a child's answer, or an error once it failed
for good), the model reads one `tool` message under the call's id, and the decision
that follows is asked with `tool.finished` (or the kind's own trigger: a child's
`subagent.finished`). A new model call is proposed only once no other call of the turn
is open and no interrupt pauses the branch, so parallel calls' results reach it together.
"""

from __future__ import annotations

from typing import Any

from .asking import decide
from .core import Step
from .shapes import Answer, ErrorInfo, ToolFinished, Trigger
from .state import Call
from .tools import result_text


def tool_finished(
    st: Step,
    call: Call,
    result: dict[str, Any] | None,
    error: ErrorInfo | None,
    *,
    trigger: Trigger | None = None,
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
        finished: ToolFinished = {
            "type": "tool.finished",
            "id": call.id,
            "ok": error is None,
            "name": call.name,
        }
        if result is not None:
            finished["result"] = result
        if error is not None:
            finished["error"] = error
        trigger = finished
    proposed = reprompt_or_nothing(st)
    proposed["messages"] = [message]
    decide(st, trigger, proposed)


def reprompt_or_nothing(st: Step) -> Answer:
    """Re-prompt only once nothing else is open and the branch is not paused."""
    s = st.s
    if s.interrupts or any(c.turn_id == (s.turn.id if s.turn else None) for c in s.calls.values()):
        return {}
    return {"actions": [{"type": "llm.call"}]}
