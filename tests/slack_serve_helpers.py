"""`subs serve` as a real process talking to a FakeSlack: the harness for end-to-end Slack tests.

`slack_serve(...)` writes a subs.toml with a `[agent.<id>.slack]` block, starts a FakeSlack
and `subs serve` with the Slack environment for one transport (`http`: signing secret, events
at `POST /slack/<agent>/events`; `socket`: app token, Socket Mode through the fake), waits
until Slack could reach the app, and yields a `SlackServe`. Events, commands and clicks go
through `SlackServe.send_*`, so one test body runs over either transport. The process can be
killed (SIGKILL) and restarted on the same Redis, config, environment and FakeSlack.

The serve process paces Slack calls with Slack's real tiers (one `chat.update` per 1.2 s per
workspace), so a test that wants several visible steps streams its answer for a few seconds.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.client import Client
from engine.config import slack_env_suffix
from engine.store.store import Store, connect
from tests.engine_helpers import EngineProcess, project_toml
from tests.fakes.slack import FakeSlack, Message

__all__ = [
    "AGENT",
    "TRANSPORTS",
    "Sent",
    "SlackServe",
    "slack_serve",
    "slack_toml",
]

AGENT = "ops_anthropic"  # one of project_toml's agents: the engine decides, the model answers
TRANSPORTS = ("http", "socket")
TURN_ENDS = frozenset({"turn.completed", "turn.failed"})
READY_TIMEOUT = 20.0
REPLY_TIMEOUT = 20.0

Events = list[dict[str, Any]]


def slack_toml(
    vendor_url: str,
    *,
    agent: str = AGENT,
    worker: str | None = None,
    answers: str = "both",
    commands: Sequence[str] = ("/oncall",),
    stream: str = "edit",
    extra: str = "",
) -> str:
    """project_toml's two agents, plus a Slack block for `agent` (`extra`: more of its
    keys and tables, e.g. `[[agent.<id>.slack.watch]]`).

    With `worker`, `agent` is a further agent (not one of project_toml's) whose worker decides.
    """
    text = project_toml(vendor_url, retry="retry = { llm = { backoff_base_secs = 0 } }")
    if worker is not None:
        if f"[agent.{agent}]" in text:
            raise ValueError(f"agent {agent!r} exists already; name the worker's agent anew")
        text += (
            f'\n[agent.{agent}]\nllm = "anthropic"\nmodel = "claude-haiku-4-5"\n'
            f'system = "You help."\nworker = "{worker}"\n'
        )
    listed = ", ".join(f'"{c}"' for c in commands)
    return text + (
        f'\n[agent.{agent}.slack]\nanswers = "{answers}"\ncommands = [{listed}]\n'
        f'stream = "{stream}"\n{extra}'
    )


@dataclass
class Sent:
    """What the app answered to one delivery, whichever the transport.

    Over Socket Mode `status` is 200 once the app acked the envelope, `elapsed` the time to
    that ack.
    """

    status: int
    elapsed: float
    payload: Any  # what was delivered: an Events API envelope, a command's fields, an action
    text: str = ""


class SlackServe:
    """One `subs serve` process with its FakeSlack, Redis and config; see the module doc."""

    def __init__(
        self,
        fake: FakeSlack,
        config: Path,
        redis_url: str,
        env: dict[str, str],
        transport: str,
        agent: str,
    ) -> None:
        if transport not in TRANSPORTS:
            raise ValueError(f"transport is one of {TRANSPORTS}, not {transport!r}")
        self.fake = fake
        self.config = config
        self.redis_url = redis_url
        self.env = env
        self.transport = transport
        self.agent = agent
        self.serve: EngineProcess | None = None
        self.events_url = ""  # POST /slack/<agent>/events on the current process (HTTP only)
        self.stderr: list[str] = []  # everything every serve process wrote after its start line
        self.redis = connect(redis_url)  # the serve process's Redis, for reading sessions
        self._client: Client | None = None

    @property
    def client(self) -> Client:
        """The engine's client API straight on Redis (events, sessions, follow)."""
        assert self._client is not None, "start() first"
        return self._client

    # -- the process ----------------------------------------------------------------------

    async def start(self) -> None:
        """Start `subs serve` and return once Slack can reach the app."""
        connected = self.fake.connections
        # aclose stops it; its log goes on from the last process's in `self.stderr`
        self.serve = EngineProcess(self.config, self.redis_url, self.env, sink=self.stderr)
        await self.serve.start()
        self.events_url = f"{self.serve.api}/slack/{self.agent}/events"
        if self._client is None:
            self._client = Client(await Store.open(self.redis))
        if self.transport == "socket":

            def reconnected() -> bool | None:
                fake = self.fake
                return True if fake.connections > connected and fake.open_sockets else None

            await self.fake.until(reconnected, READY_TIMEOUT)
        else:
            await self._http_ready()

    async def _http_ready(self) -> None:
        """A signed url_verification answered with its challenge, as Slack checks a URL.

        `subs serve` prints its start line once its port takes requests, so one try tells."""
        challenge = uuid.uuid4().hex
        check = {"type": "url_verification", "token": "fake-verification-token"}
        answer = await self.fake.send_event(self.events_url, {**check, "challenge": challenge})
        if answer.status != 200 or challenge not in answer.text:
            raise AssertionError(
                f"{self.events_url} failed Slack's URL check: {answer.status} {answer.text[:200]}"
            )

    async def kill(self) -> None:
        """SIGKILL the serve process (no cleanup of any kind) and reap it."""
        assert self.serve is not None and self.serve.proc is not None
        self.serve.kill()
        await self.serve.proc.wait()
        await self._stop_draining()
        if self.transport == "socket":  # the fake must not send to the dead connection
            await self.fake.until(lambda: self.fake.open_sockets == 0 or None, READY_TIMEOUT)

    async def restart(self) -> None:
        """A new serve process on the same Redis, config, environment and FakeSlack."""
        assert self.serve is not None and self.serve.proc is not None
        if self.serve.proc.returncode is None:
            raise AssertionError("the serve process is still running: kill() it first")
        await self.start()

    async def aclose(self) -> None:
        proc = self.serve.proc if self.serve is not None else None
        if proc is not None:
            try:
                if proc.returncode is None:
                    proc.terminate()
                async with asyncio.timeout(15):
                    await proc.wait()
            finally:
                if proc.returncode is None:  # SIGTERM was not enough
                    proc.kill()
                    await proc.wait()
        await self._stop_draining()
        await self.redis.aclose()

    async def _stop_draining(self) -> None:
        if self.serve is not None:
            await self.serve.drained()

    @property
    def alive(self) -> bool:
        return (
            self.serve is not None
            and self.serve.proc is not None
            and self.serve.proc.returncode is None
        )

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.stderr[-lines:])

    # -- delivering to the app ------------------------------------------------------------

    async def send_event(
        self, payload: dict[str, Any], *, retry_num: int | None = None, **http: Any
    ) -> Sent:
        """An event (or a whole envelope); `retry_num` marks Slack's retry of the same
        event_id. `http` (signing_secret, ts) only exists over HTTP."""
        if self.transport == "http":
            delivery = await self.fake.send_event(
                self.events_url, payload, retry_num=retry_num, **http
            )
            return Sent(delivery.status, delivery.elapsed, delivery.payload, delivery.text)
        if http:
            raise TypeError(f"not over Socket Mode: {sorted(http)}")
        retry = {"retry_attempt": retry_num, "retry_reason": "timeout"} if retry_num else {}
        return await self._socket("events_api", payload, **retry)

    async def send_command(self, command: str, text: str = "", **who: Any) -> Sent:
        """A slash command (`who`: user, channel)."""
        if self.transport == "http":
            delivery = await self.fake.send_command(self.events_url, command, text, **who)
            return Sent(delivery.status, delivery.elapsed, delivery.payload, delivery.text)
        return await self._socket("slash_commands", self.fake.command_payload(command, text, **who))

    async def send_action(self, payload: dict[str, Any]) -> Sent:
        """An interactivity payload, e.g. `fake.block_action(...)`."""
        if self.transport == "http":
            delivery = await self.fake.send_action(self.events_url, payload)
            return Sent(delivery.status, delivery.elapsed, delivery.payload, delivery.text)
        return await self._socket("interactive", payload)

    async def _socket(self, kind: str, payload: dict[str, Any], **extra: Any) -> Sent:
        started = time.monotonic()
        envelope_id = await self.fake.socket_send(kind, payload, **extra)
        await self.fake.wait_ack(envelope_id)
        [sent] = [e for e in self.fake.envelopes if e["envelope_id"] == envelope_id]
        return Sent(200, time.monotonic() - started, sent["payload"])

    # -- reading the session and the thread ----------------------------------------------

    def session_id(self, channel: str, thread_ts: str) -> str:
        """SPEC §14: a thread is the session `slack:{agent}:{channel}:{thread_ts}`."""
        return f"slack:{self.agent}:{channel}:{thread_ts}"

    def session_of(self, msg: Message) -> str:
        return self.session_id(msg.channel, msg.thread_ts or msg.ts)

    async def events(self, msg: Message) -> Events:
        """Every event of the session of `msg`'s thread."""
        return await self.client.events(self.session_of(msg))

    async def wait_log(
        self, msg: Message, done: Callable[[Events], bool], timeout: float = REPLY_TIMEOUT
    ) -> Events:
        """The log of `msg`'s session once `done(log)` holds; checked again on each new event."""
        sid = self.session_of(msg)
        try:
            async with asyncio.timeout(timeout):
                while True:
                    events = await self.client.events(sid)
                    if done(events):
                        return events
                    after = events[-1]["seq"] if events else 0
                    async with aclosing(self.client.follow(sid, after, block_ms=1000)) as new:
                        await anext(new)  # something new: look at the whole log again
        except TimeoutError:
            kinds = [e["payload"]["type"] for e in await self.client.events(sid)]
            raise AssertionError(
                f"session {sid}: condition not met after {timeout} s; log: {kinds}\n"
                f"serve stderr:\n{self.log_tail()}"
            ) from None

    async def turns_ended(self, msg: Message, count: int = 1, timeout: float = REPLY_TIMEOUT):
        """The log once `count` turns of `msg`'s session have completed or failed."""
        return await self.wait_log(msg, lambda log: len(ended(log)) >= count, timeout)

    def bot_messages(self, msg: Message) -> list[Message]:
        """The app's messages in `msg`'s thread, as shown now."""
        thread = self.fake.thread(msg.channel, msg.thread_ts or msg.ts)
        return [m for m in thread if self.fake.by_app(m)]

    async def reply(
        self,
        msg: Message,
        nth: int = 1,
        *,
        turns: int = 1,
        text: str | None = None,
        timeout: float = REPLY_TIMEOUT,
    ) -> Message:
        """The app's `nth` message in `msg`'s thread, once `turns` turns of the session ended
        and, with `text`, once the message shows exactly that text."""
        found: list[Message] = []

        def nth_shown() -> Message | None:
            mine = self.bot_messages(msg)
            return mine[nth - 1] if len(mine) >= nth else None

        try:
            found.append(await self.fake.until(nth_shown, timeout))
        except TimeoutError:
            raise AssertionError(
                f"no bot message #{nth} in thread {msg.thread_ts or msg.ts} after {timeout} s; "
                f"thread: {[(m.user, m.text[:60]) for m in self.fake.thread(msg.channel, msg.ts)]}"
                f"\nserve stderr:\n{self.log_tail()}"
            ) from None
        await self.turns_ended(msg, turns, timeout)
        reply = found[0]
        if text is not None:
            try:
                await self.fake.until(lambda: True if reply.text == text else None, timeout)
            except TimeoutError:
                steps = [v.text for v in self.fake.edits(reply.channel, reply.ts)]
                raise AssertionError(
                    f"reply {reply.ts} never showed {text!r}; it shows {reply.text!r}; "
                    f"steps: {steps}\nserve stderr:\n{self.log_tail()}"
                ) from None
        return reply


def ended(events: Events) -> Events:
    """The turn.completed / turn.failed events of a log."""
    return [e for e in events if e["payload"]["type"] in TURN_ENDS]


def of_type(events: Events, kind: str) -> list[dict[str, Any]]:
    """The payloads of one event type."""
    return [e["payload"] for e in events if e["payload"]["type"] == kind]


@asynccontextmanager
async def slack_serve(
    tmp_path: Path,
    redis_url: str,
    vendor_url: str,
    *,
    transport: str = "http",
    agent: str = AGENT,
    worker: str | None = None,
    answers: str = "both",
    commands: Sequence[str] = ("/oncall",),
    stream: str = "edit",
    fake: FakeSlack | None = None,
    extra: str = "",
    env: dict[str, str] | None = None,
) -> AsyncIterator[SlackServe]:
    """A FakeSlack (default limits) and `subs serve` with a Slack app for `agent` over
    `transport`; everything stopped afterwards. Pass `fake` to use a started one of your own,
    `env` for more of serve's environment (e.g. `SUBS_API_KEYS`)."""
    config = tmp_path / "subs.toml"
    config.write_text(
        slack_toml(
            vendor_url,
            agent=agent,
            worker=worker,
            answers=answers,
            commands=commands,
            stream=stream,
            extra=extra,
        )
    )
    async with _fake(fake) as slack:
        suffix = slack_env_suffix(agent)
        environ = {f"SLACK_BOT_TOKEN_{suffix}": slack.bot_token, "SLACK_API_URL": slack.url}
        if transport == "socket":
            environ[f"SLACK_APP_TOKEN_{suffix}"] = slack.app_token
        else:
            environ[f"SLACK_SIGNING_SECRET_{suffix}"] = slack.signing_secret
        environ.update(env or {})
        served = SlackServe(slack, config, redis_url, environ, transport, agent)
        try:
            await served.start()
            yield served
        finally:
            await served.aclose()


@asynccontextmanager
async def _fake(fake: FakeSlack | None) -> AsyncIterator[FakeSlack]:
    if fake is not None:
        yield fake
        return
    async with FakeSlack() as started:
        yield started
