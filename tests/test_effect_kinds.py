"""A new call kind plugs in from its own module: here, from this test alone.

The toy "echo" kind is a `CallKind` (its machine rules, engine/machine/kinds.py) and a
runner (engine/effects/runner.py). The test builds its own table of kinds (the
default one and echo) and hands it, with the runner, to the pure machine and to the
real engine, which runs a turn with it on real Redis and the fake vendor: no engine
file edited for it, and nothing of the engine's patched or registered into.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest

from engine.client import Client
from engine.config import ConfigError, parse_project
from engine.effects.runner import Done, EffectRunner, Tasks
from engine.machine import (
    CallAnswered,
    CallDeadline,
    CallKind,
    CallLost,
    CallSettled,
    Input,
    Kinds,
    LlmCallSettled,
    MachineError,
    RunCall,
    RunLlmCall,
    SessionState,
    StartTimer,
    default_kinds,
    kinds,
)
from engine.runtime.engine import Engine
from engine.runtime.inflight import lost_work
from tests.engine_helpers import (
    ENV,
    assert_consistent,
    payloads,
    project_toml,
    turn_ended,
    wait_for_event,
)
from tests.fakes.llm_vendor import Text, ToolCalls
from tests.machine_helpers import Session, text_reply, tool_reply

# -- the toy kind: everything a new kind writes ---------------------------------


@dataclass(frozen=True)
class RunEcho(RunCall):
    """Echo a call's arguments back (the machine asks; the runner below does it)."""


ECHO = CallKind(
    kind="tool",
    handler="echo",
    retry="echo",
    runnable=kinds.always,
    effect=RunEcho,
    deadline=kinds.backstop(kinds.BACKSTOP_GRACE_MS),
    in_flight=True,
    retry_defaults={"run_timeout_secs": 5, "total_timeout_secs": 60, "max_attempts": 2},
    agent_retry="tool",
)


def run_echo(
    runner: EffectRunner, state: SessionState, effect: RunEcho, done: Done, tasks: Tasks
) -> None:
    """Answers at once; its first attempt fails (retryably), to show the kind's policy."""
    arguments = state.calls[effect.call_id].arguments

    async def echo() -> Input:
        if effect.attempt == 1:
            error = {"message": "echo is warming up", "code": "provider_error"}
            return CallAnswered(effect.call_id, effect.attempt, error=error, retryable=True)
        return CallAnswered(effect.call_id, effect.attempt, result=f"echo: {arguments}")

    def failed(error: dict, retryable: bool) -> Input:
        return CallAnswered(effect.call_id, effect.attempt, error=error, retryable=retryable)

    runner.run(state.session_id, f"echo {effect.call_id}", lambda: echo, failed, done, tasks)


# The table this test runs by: the engine's default kinds and echo.
WITH_ECHO = default_kinds().adding(ECHO)

# -- the test ------------------------------------------------------------------------


def test_the_machine_runs_a_kind_of_its_table_by_its_rules():
    s = Session(kinds=WITH_ECHO)
    s.agent["tools"].append({"name": "shout", "handler": "echo"})
    [run] = [e for e in s.say("shout").effects if isinstance(e, RunLlmCall)]
    t = s.apply(LlmCallSettled(run.call_id, 1, response=tool_reply(("c1", "shout", "{}"))))
    [echo] = [e for e in t.effects if isinstance(e, RunEcho)]
    # Its deadline timer: the run deadline (its own policy: 5 s) and the backstop's grace.
    assert echo.deadline == s.now + 5000
    assert StartTimer(echo.deadline + 1000, CallDeadline("c1", 1)) in t.effects
    assert lost_work(s.state, WITH_ECHO) == [CallLost("c1", 1)]  # a dead engine's is resent
    with pytest.raises(MachineError, match="being run by the echo"):
        s.apply(CallSettled("c1", 1, result="from outside"))
    assert s.apply(CallAnswered("c1", 2, result="late")).ignored  # no such attempt
    t = s.apply(CallAnswered("c1", 1, result="SHOUT"))
    assert "tool.call.completed" in s.types(t)
    [run] = [e for e in t.effects if isinstance(e, RunLlmCall)]  # the model is asked again
    s.apply(LlmCallSettled(run.call_id, 1, response=text_reply("done")))
    assert s.types()[-1] == "turn.completed"


def test_a_kind_is_only_in_the_tables_built_with_it():
    """The default table is not changed by a table built from it: no kind leaks."""
    assert default_kinds().of("tool", "echo") is None
    assert "echo" not in default_kinds().tool_handlers()
    assert "echo" in WITH_ECHO.tool_handlers()
    assert WITH_ECHO.policy("echo", None)["max_attempts"] == 2
    with pytest.raises(KeyError):
        default_kinds().policy("echo", None)


def test_an_unregistered_handler_cannot_run():
    s = Session()
    s.agent["tools"].append({"name": "shout", "handler": "nobody"})
    [run] = [e for e in s.say("shout").effects if isinstance(e, RunLlmCall)]
    t = s.apply(LlmCallSettled(run.call_id, 1, response=tool_reply(("c1", "shout", "{}"))))
    assert not [e for e in t.effects if isinstance(e, RunCall) and e.call_id == "c1"]
    [errored] = [e["payload"] for e in t.events if e["payload"]["type"] == "tool.call.errored"]
    assert "no handler 'nobody' runs 'shout'" in errored["error"]["message"]


def test_a_kind_is_in_a_table_once():
    client = default_kinds().of("tool", "client")
    assert client is not None
    assert default_kinds().adding(client).of("tool", "client") == client  # the same: harmless
    with pytest.raises(ValueError, match="already registered"):
        default_kinds().adding(dataclasses.replace(client, in_flight=True))
    with pytest.raises(ValueError, match="already defined differently"):
        Kinds(
            [ECHO, dataclasses.replace(ECHO, handler="echo2", retry_defaults={"max_attempts": 9})]
        )


@pytest.mark.parametrize(
    ("given", "says"),
    [({}, "has no max_attempts"), ({"max_attempts": 2, "max_atempts": 3}, "names max_atempts")],
)
def test_a_kinds_own_policy_is_whole_when_the_table_is_built(given, says):
    """A policy a kind brings is checked when the table is built, not at its first failure."""
    with pytest.raises(ValueError, match=says):
        Kinds([dataclasses.replace(ECHO, retry="echo_own", retry_defaults=given)])


def test_config_takes_the_tool_handlers_of_the_table_it_is_given(vendor, tmp_path):
    toml = project_toml(vendor.url).replace('handler = "client"', 'handler = "echo"')
    with pytest.raises(ConfigError, match="handler"):
        parse_project(toml, str(tmp_path / "subs.toml"), env={})
    handlers = WITH_ECHO.tool_handlers()
    parse_project(toml, str(tmp_path / "subs.toml"), env={}, tool_handlers=handlers)


@pytest.fixture
async def engine(redis, vendor, tmp_path):
    toml = project_toml(vendor.url, retry="retry = { tool = { backoff_base_secs = 0 } }")
    # The agents' tool, run by the new kind (config takes any tool handler of the table).
    toml = toml.replace('handler = "client"', 'handler = "echo"')
    handlers = WITH_ECHO.tool_handlers()
    project = parse_project(toml, str(tmp_path / "subs.toml"), env={}, tool_handlers=handlers)
    eng = Engine(
        project, redis, env=ENV, lease_ms=3000, kinds=WITH_ECHO, runners={RunEcho: run_echo}
    )
    await eng.start()
    yield eng
    await eng.stop()


async def test_a_kind_registered_outside_the_engine_runs_a_turn(engine, vendor):
    vendor.push(
        ToolCalls([("confirm", {"question": "hello?"})], text="Echoing."),
        Text("It echoed."),
    )
    client = Client(engine.store)
    reply = await client.submit(
        {
            "type": "client.message",
            "agent_id": "ops_openai",
            "message": {"role": "user", "content": "echo something"},
        },
        identity={"issuer": "cli"},
    )
    sid, turn_id = reply["session_id"], reply["turn_id"]
    end = await wait_for_event(client, sid, turn_ended(turn_id))
    assert end["payload"]["type"] == "turn.completed"

    events = await assert_consistent(engine.store, sid)
    [requested] = payloads(events, "tool.call.requested")
    assert requested["handler"] == "echo"
    assert requested["retry"]["max_attempts"] == 2  # the kind's own policy
    assert requested["retry"]["backoff_base_secs"] == 0  # under the agent's retry.tool
    assert [p["attempt"] for p in payloads(events, "tool.call.dispatched")] == [1, 2]
    [errored] = payloads(events, "tool.call.errored")
    assert (errored["attempt"], errored["final"]) == (1, False)
    [completed] = payloads(events, "tool.call.completed")
    echoed = f"echo: {requested['arguments']}"
    assert completed["result"]["content"][0]["text"] == echoed
    messages = [p["message"] for p in payloads(events, "message.new")]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert messages[2]["content"] == echoed
    assert "echo: " in str(vendor.requests[1].body)  # the result went back to the model


def run_echo_that_breaks_first(
    runner: EffectRunner, state: SessionState, effect: RunEcho, done: Done, tasks: Tasks
) -> None:
    """A runner with a bug: its first start raises before it makes a task."""
    if effect.attempt == 1:
        raise KeyError("a runner's own bug")
    run_echo(runner, state, effect, done, tasks)


async def test_a_runner_that_raises_starting_an_effect_fails_that_attempt_not_the_partition(
    redis, vendor, tmp_path, caplog
):
    """The partition's processor starts each committed effect: a runner raising there
    would end the processor, and every session of the partition would stop being applied.
    The attempt fails instead (retryable, logged once with its traceback) and the next one
    runs; the turn ends."""
    toml = project_toml(vendor.url, retry="retry = { tool = { backoff_base_secs = 0 } }")
    toml = toml.replace('handler = "client"', 'handler = "echo"')
    handlers = WITH_ECHO.tool_handlers()
    project = parse_project(toml, str(tmp_path / "subs.toml"), env={}, tool_handlers=handlers)
    eng = Engine(
        project,
        redis,
        env=ENV,
        lease_ms=3000,
        kinds=WITH_ECHO,
        runners={RunEcho: run_echo_that_breaks_first},
    )
    vendor.push(ToolCalls([("confirm", {"question": "hello?"})]), Text("It echoed."))
    await eng.start()
    try:
        client = Client(eng.store)
        body = {
            "type": "client.message",
            "agent_id": "ops_openai",
            "message": {"role": "user", "content": "echo something"},
        }
        reply = await client.submit(body)
        sid = reply["session_id"]
        end = await wait_for_event(client, sid, turn_ended(reply["turn_id"]))
        assert end["payload"]["type"] == "turn.completed"
        events = await assert_consistent(eng.store, sid)
        # The same partition goes on applying: a second turn in the session runs too.
        vendor.push(Text("Still here."))
        again = await client.submit(body, session_id=sid)
        end = await wait_for_event(client, sid, turn_ended(again["turn_id"]))
        assert end["payload"]["type"] == "turn.completed"
    finally:
        await eng.stop()
    [errored] = payloads(events, "tool.call.errored")
    assert errored["attempt"] == 1 and errored["error"]["code"] == "internal"
    assert "could not start it: KeyError" in errored["error"]["message"]
    assert [p["attempt"] for p in payloads(events, "tool.call.dispatched")] == [1, 2]
    said = [r for r in caplog.records if "could not start" in r.getMessage()]
    assert len(said) == 1 and said[0].exc_info is not None
