"""Settling a call's attempt (SPEC §5-§6, §13): its answer, from whoever answers it.

An attempt is settled by a kind's runner (`CallAnswered`: the kind's own `settle`, or
`answered` by default), by a worker's `tool.result`/`tool.error` (decisions.py), by a
client for its own tool calls, or by the settle API for an async (waiting) call. A
tool's output is checked against its `output` schema first (a mismatch fails it, not
retried); an error is a failed attempt under the call's retry policy (calls.py). An
answer for an attempt a retry replaced is ignored (a runner's) or refused (a client's
or the API's, when it names the attempt).
"""

from __future__ import annotations

from typing import Any

from . import events as ev
from .calls import call_failed, llm_completed, unanswered_call
from .core import MachineError, Step
from .inputs import CallAnswered, CallSettled
from .retry import Fault
from .shapes import ErrorInfo, ToolError, ToolErrorInput, ToolResult, ToolResultInput
from .state import Call
from .tool_messages import tool_finished
from .tools import check_output, find_tool, tool_result_of


def call_answered(st: Step, inp: CallAnswered) -> None:
    """A kind's runner ended an attempt: the kind settles it (kinds.py)."""
    call = unanswered_call(st, inp.call_id, inp.attempt)
    if call is None:
        return
    kind = st.kinds.of(call.kind, call.handler)
    settle = kind.settle if kind is not None and kind.settle is not None else answered
    settle(st, call, inp)


def answered(st: Step, call: Call, inp: CallAnswered) -> None:
    """How an answer settles by default: a model reply, or a tool's result."""
    if inp.error is not None:
        call_failed(st, call, inp.error, inp.retryable, inp.retry_after)
    elif call.kind == "llm":
        llm_completed(st, call, inp.result)
    else:
        settle_tool(st, call, tool_result_of(inp.result), None, False)


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
    error_info: ErrorInfo = {"message": error, "code": "handler_error"}
    call_failed(st, call, error_info, retryable, None, message_id=message_id)


def client_settles_tool(st: Step, body: ToolResultInput | ToolErrorInput) -> None:
    """A client's `tool.result` / `tool.error` for one of its own tool calls."""
    call = settleable(st, body["id"], body.get("attempt"), client_input=True)
    settle_tool_as_said(st, call, body)


def settle_tool_as_said(
    st: Step, call: Call, said: ToolResultInput | ToolErrorInput | ToolResult | ToolError
) -> None:
    """A tool call settled by what a client's input or a worker's action says: its result
    (as an MCP result has it: content, structured content, `is_error`), or its error."""
    if said["type"] == "tool.result":
        result = tool_result_of(
            said.get("result"),
            said.get("content"),
            said.get("structured_content"),
            bool(said.get("is_error")),
        )
        settle_tool(st, call, result, None, False)
    else:
        settle_tool(st, call, None, said["error"], bool(said.get("retryable")))
    st.out.reply = {"session_id": st.session_id, "turn_id": call.turn_id, "queued": False}


def api_settles_call(st: Step, inp: CallSettled) -> None:
    """The settle API: ends an async (waiting) worker call or a client call."""
    call = settleable(st, inp.call_id, inp.attempt, client_input=False)
    if inp.client_only and call.handler != "client":
        raise MachineError(
            f"tool call {call.id!r} runs on the {call.handler}, not the client: only a "
            "full-access key may settle it (a KEY:own key answers its client tools)",
            code="forbidden",
            status=403,
        )
    if inp.message_id is not None and inp.message_id in st.s.nodes:
        raise MachineError(
            f"message {inp.message_id!r} is already recorded", code="duplicate_message_id"
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


def settleable(st: Step, call_id: str, attempt: int | None, *, client_input: bool) -> Call:
    """The open call a settle names, or a MachineError that says why not."""
    call = st.state.calls.get(call_id) if st.state is not None else None
    if call is None or call.kind != "tool" or call.status not in ("running", "waiting"):
        raise MachineError(f"tool call {call_id!r} is not open", code="call_not_open", status=409)
    if client_input and call.handler != "client":
        raise MachineError(
            f"tool call {call.id!r} runs on the {call.handler}, not the client",
            code="call_not_open",
        )
    kind = st.kinds.of(call.kind, call.handler)
    if not client_input and call.status != "waiting" and not (kind and kind.outside_settles):
        raise MachineError(
            f"tool call {call.id!r} is being run by the {call.handler}; only an async call "
            "(answered with an empty decision) can be settled",
            code="call_not_open",
        )
    if attempt is not None and attempt != call.attempt:
        raise MachineError(
            f"tool call {call.id!r} is at attempt {call.attempt}, not {attempt}",
            code="stale_attempt",
        )
    return call
