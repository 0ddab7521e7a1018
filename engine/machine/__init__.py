"""The pure core: session state + input -> (events, effects). No I/O, clock or randomness."""

from .core import Ids, MachineError, Transition, iso
from .effects import Effect, RunDecision, RunExecute, RunLlmCall, SendMessage, StartTimer
from .evolve import EVENT_TYPES, Event, evolve, fold
from .inputs import (
    CallDeadline,
    CallLost,
    CallSettled,
    ClientSubmitted,
    DecisionAnswered,
    DecisionFailed,
    DecisionTimerFired,
    ExecuteAnswered,
    ExecuteFailed,
    Input,
    InterruptRequested,
    LlmCallSettled,
    MessageDelivered,
    TimerFired,
    input_from_json,
    input_to_json,
)
from .request import LlmCallPlan, build_llm_request
from .state import Call, SessionState, state_from_json, state_to_json
from .step import step

__all__ = [
    "EVENT_TYPES",
    "Call",
    "CallDeadline",
    "CallLost",
    "CallSettled",
    "ClientSubmitted",
    "DecisionAnswered",
    "DecisionFailed",
    "DecisionTimerFired",
    "Effect",
    "Event",
    "ExecuteAnswered",
    "ExecuteFailed",
    "Ids",
    "Input",
    "InterruptRequested",
    "LlmCallPlan",
    "LlmCallSettled",
    "MachineError",
    "MessageDelivered",
    "RunDecision",
    "RunExecute",
    "RunLlmCall",
    "SendMessage",
    "SessionState",
    "StartTimer",
    "TimerFired",
    "Transition",
    "build_llm_request",
    "evolve",
    "fold",
    "input_from_json",
    "input_to_json",
    "iso",
    "state_from_json",
    "state_to_json",
    "step",
]
