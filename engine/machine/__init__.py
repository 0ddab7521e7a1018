"""The pure core: session state + input -> (events, effects). No I/O, clock or randomness."""

from .effects import Effect, RunLlmCall, StartTimer
from .evolve import EVENT_TYPES, Event, evolve, fold
from .inputs import (
    CallLost,
    ClientSubmitted,
    Input,
    LlmCallSettled,
    TimerFired,
    input_from_json,
    input_to_json,
)
from .request import LlmCallPlan, build_llm_request
from .state import Call, SessionState, state_from_json, state_to_json
from .step import Ids, MachineError, Transition, iso, step

__all__ = [
    "EVENT_TYPES",
    "Call",
    "CallLost",
    "ClientSubmitted",
    "Effect",
    "Event",
    "Ids",
    "Input",
    "LlmCallPlan",
    "LlmCallSettled",
    "MachineError",
    "RunLlmCall",
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
