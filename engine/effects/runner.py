"""Effects: what a committed transition asks for, run so that each one always reports back.

A model call runs against its vendor, a decision or a call's execute goes to the
agent's worker. Whatever happens — an answer, garbage, an exception of any class —
comes back to the engine as exactly one input (`done`), the effect's result or a
recorded failed attempt. An effect the engine loses on the way (a crash, a lease
moved) is ended by its deadline timer instead, which the commit that started it set.

Which code runs an effect is looked up by its type in the runner's table (`runners`),
built by whoever composes the engine (engine/runtime/engine.py): the built-in runners
(`engine/effects/builtin.py`: the model call's in `llm_call.py`, a worker's effects' in
`worker_effects.py`), each call kind's from its own module (MCP's in
`engine/effects/mcp/runners.py`), and any a caller adds. Each is handed this runner:
its shared HTTP session, clock, store and metrics, and `run`, which sees that the
effect reports back.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from engine.config import Project, project_secrets
from engine.effects.deltas import Deltas, DeltaWriter
from engine.effects.http_pool import new_session
from engine.effects.llm.prompts import EncodedMessages
from engine.effects.worker import CheckedMessages, WorkerTarget
from engine.errors import ErrorInfo, SubsError, describe
from engine.machine import CallAnswered, Input, RunCall, SessionState
from engine.machine.retry import Fault
from engine.metrics import Metrics
from engine.redact import Redactor, env_secrets, scrubbed
from engine.store.store import Store
from engine.telemetry.logs import CURRENT
from engine.telemetry.spans import effect_context

log = logging.getLogger("subs.engine")

Done = Callable[[Input, Deltas], None]  # the effect's result, and the call's last token deltas
Tasks = set[asyncio.Task[None]]

# Runs one effect of its type; it must report back through `done` exactly once
# (`EffectRunner.run` sees to that).
Runner = Callable[["EffectRunner", SessionState, Any, Done, Tasks], None]
Runners = Mapping[type, Runner]


class EngineConfigError(SubsError):
    """The project cannot run as configured (found at start, before any work)."""


def worker_targets(project: Project, env: Mapping[str, str]) -> dict[str, WorkerTarget]:
    """Each worker agent's URL and signing secret; a named but empty secret is an error."""
    targets = {}
    for agent in project.agents.values():
        if agent.worker is None:
            continue
        secret = None
        if agent.signing_secret_env:
            secret = env.get(agent.signing_secret_env) or None
            if secret is None:
                raise EngineConfigError(
                    f"agent.{agent.id}.signing_secret_env names {agent.signing_secret_env}, "
                    "which is not set (or empty) in the environment"
                )
        targets[agent.id] = WorkerTarget(agent.worker, secret)
    return targets


@dataclass
class EffectRunner:
    """Starts effects as tasks; `tasks` is the owner's set, so it can cancel them.

    Owns the engine's one HTTP session (`http_pool`): every model call and worker
    delivery shares its pool of kept-alive connections. Made in the running loop
    (the engine's `start`), closed by `aclose`.
    """

    project: Project
    store: Store
    env: Mapping[str, str]
    workers: dict[str, WorkerTarget]
    metrics: Metrics
    clock: Callable[[], float]
    runners: Runners  # by effect type
    sampled: bool = False  # tracing is on: worker requests say their span is recorded

    def __post_init__(self) -> None:
        self.http: aiohttp.ClientSession = new_session()
        # What a vendor, a worker or an MCP server says in an error may echo a secret it
        # was sent (a key in a 401's body, a token in a server's stderr): scrubbed before
        # it is recorded, since the log is read by the API, the console and Slack.
        self.redactor = Redactor([*env_secrets(self.env), *project_secrets(self.project, self.env)])
        # Kept across effects: the vendor form of messages already encoded (model calls,
        # llm_call.py) and the messages already checked before a worker was sent them.
        self.prompts = EncodedMessages()
        self.checked = CheckedMessages()

    async def aclose(self) -> None:
        """Close the shared HTTP session."""
        await self.http.close()

    def now_ms(self) -> int:
        """The clock effects read, in ms; injected so tests can move it."""
        return int(self.clock() * 1000)

    def runs(self, effect: object) -> bool:
        """Whether this runner starts `effect` (the others are the commit's own)."""
        return type(effect) in self.runners

    def start(self, state: SessionState, effect: object, done: Done, tasks: Tasks) -> None:
        """Start `effect` by its type's runner; its end comes back through `done` (in its
        span's context when tracing is on, so what it logs names the span)."""
        runner = self.runners[type(effect)]
        span = effect_context(state, effect) if self.sampled else None
        try:
            if span is None:
                runner(self, state, effect, done, tasks)
                return

            def in_span() -> None:  # the effect's tasks copy this context: their logs name it
                CURRENT.set(span)
                runner(self, state, effect, done, tasks)

            contextvars.copy_context().run(in_span)
        except Exception as err:  # a runner's own bug, before its task: not the partition's
            self._not_started(state, effect, err, done)

    def _not_started(self, state: SessionState, effect: object, err: Exception, done: Done) -> None:
        """A runner raised starting `effect`: logged once with its traceback; a call's
        attempt fails at once (retryable, as a lost one), anything else ends at its
        recorded deadline. The partition's processor, which started it, goes on."""
        log.error(
            "%s of session %s could not start: %s",
            type(effect).__name__,
            state.session_id,
            describe(err),
            exc_info=err,
        )
        if isinstance(effect, RunCall):
            why = Fault.LOST.error(f"the engine could not start it: {describe(err)}")
            done(CallAnswered(effect.call_id, effect.attempt, error=why, retryable=True), ())

    def run(
        self,
        sid: str,
        what: str,
        prepare: Callable[[], Callable[[], Awaitable[Input]]],
        failed: Callable[[ErrorInfo, bool], Input],
        done: Done,
        tasks: set[asyncio.Task[None]],
        deltas: DeltaWriter | None = None,
    ) -> None:
        """Run one effect so that it always reports back: whatever it raises is a failed
        attempt with a reason, never a task that dies with nothing recorded.

        `prepare` builds the request from the committed state, before any await (so a
        later transition cannot change what is sent); a failure there is deterministic,
        so it is not retried. `deltas` is the writer the effect streams tokens into:
        what it still holds at the end is handed to `done`, to go out with the commit.
        """

        def report(result: Input, deltas_left: Deltas) -> None:
            done(self.scrubbed(result), deltas_left)

        try:
            run = prepare()
        except Exception as err:
            code = err.info()["code"] if isinstance(err, SubsError) else "internal"
            if code == "internal":  # not a failure the protocol names: a bug
                log.exception("preparing the %s of %s failed", what, sid)
            error: ErrorInfo = {
                "message": f"the {what} could not be prepared: {describe(err)}",
                "code": code,
            }
            report(failed(error, False), ())
            return

        async def guarded() -> None:
            try:
                result = await run()
            except asyncio.CancelledError:
                if deltas is not None:
                    deltas.abandon()
                raise
            except Exception as err:
                log.exception("the %s of %s failed inside the engine", what, sid)
                error: ErrorInfo = {
                    "message": f"the {what} failed inside the engine: {describe(err)}",
                    "code": "internal",
                }
                result = failed(error, True)
            report(result, () if deltas is None else await deltas.end())

        task = asyncio.create_task(guarded())
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    def scrubbed(self, result: Input) -> Input:
        """`result` with the known secrets masked wherever outside text says something went
        wrong: its ErrorInfo `error`, an MCP result marked `isError`, and the `error` of a
        worker's actions (`tool.error`, `fail`). The one place every attempt of an effect
        passes before it is recorded; results that went well are left as they are."""
        scrub = self.redactor.scrub
        changes: dict[str, Any] = {}
        error = getattr(result, "error", None)
        if error:
            changes["error"] = scrubbed(error, scrub)
        answer = getattr(result, "result", None)
        if isinstance(answer, dict) and answer.get("isError"):
            changes["result"] = scrubbed(answer, scrub)
        response = getattr(result, "response", None)
        actions = response.get("actions") if isinstance(response, dict) else None
        if isinstance(actions, list) and any(isinstance(a, dict) and "error" in a for a in actions):
            assert isinstance(response, dict)
            said = [
                {**a, "error": scrubbed(a["error"], scrub)}
                if isinstance(a, dict) and "error" in a
                else a
                for a in actions
            ]
            changes["response"] = {**response, "actions": said}
        return dataclasses.replace(result, **changes) if changes else result
