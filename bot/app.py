"""The Slack bot: one Bolt app per agent, over Socket Mode or the HTTP Events API.

SPEC §14. `start_bots` builds a `Bots` for every agent with a `[agent.<id>.slack]` block whose
bot token is in the environment, with either an app token (Socket Mode: no public URL needed;
`Bots.start()` connects) or a signing secret (`Bots.routes()` serves it at
`POST /slack/<agent>/events` on any aiohttp app; `subs serve` shares its own). Bolt checks
signatures and acks; the turn runs in a task of ours afterwards, so Slack never waits on it.

A turn is one Slack message: posted with the first visible text, then edited through one
`Paced` (shared by every thread of the process) until the final render, which is awaited.
While it runs the thread shows a working status (`assistant.threads.setStatus`); where Slack
refuses that, a reaction on the triggering message instead, removed at the end.

A slash command posts a root message and runs as a `client.action` in that message's thread.
An interrupt posts a prompt with one button per option; a click resumes with the option the
engine recorded (read from the session snapshot, so a click cannot inject a value).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response, to_bolt_request
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.async_app import AsyncApp, AsyncBoltContext
from slack_bolt.context.ack.async_ack import AsyncAck
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from engine.client import Client, ClientError
from engine.config import Project, slack_env_suffix

from .governor import Paced, RateGovernor, RateLimited, scope
from .mrkdwn import escape
from .render import (
    ACTION_PREFIX,
    TurnView,
    interrupt_prompt,
    parse_interrupt_action,
    resolved_prompt,
)
from .threads import (
    missed_messages,
    session_id_for,
    strip_mention,
    thread_ts_of,
    wants_turn,
)

__all__ = ["Bot", "Bots", "start_bots"]

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
DEDUPE_SECONDS = 3600  # Slack retries within minutes; an hour covers replays too
POST_ATTEMPTS = 5
ANSWERED = "This prompt was already answered."
COMMAND_ARGS = ("text", "user_id", "channel_id", "team_id", "response_url", "trigger_id")
SET_STATUS = "assistant.threads.setStatus"
WORKING_REACTION = "hourglass_flowing_sand"


@dataclass
class Bot:
    """One agent's Slack app."""

    agent: str
    answers: str
    app: AsyncApp
    web: AsyncWebClient
    app_token: str | None = None  # set: Socket Mode; else the HTTP Events API


@dataclass
class _Reply:
    """Where one turn's message is in Slack."""

    bot: Bot
    team: str
    channel: str
    thread_ts: str
    ts: str | None = None
    shown: dict[str, Any] = field(default_factory=dict)
    landed: asyncio.Future[None] | None = None  # the latest chat.update sent or waiting
    trigger: str = ""  # the message a working reaction goes on
    status: str = ""  # the thread status as we last set it (or Slack cleared it)
    status_sent: asyncio.Future[None] | None = None  # the latest setStatus sent or waiting
    reaction: asyncio.Future[None] | None = None  # reactions.add, once setStatus was refused


class Bots:
    """Every agent's Slack app in this process, the shared pacing, and the running turns."""

    def __init__(self, client: Client, governor: RateGovernor | None = None) -> None:
        self.client = client
        governor = governor or RateGovernor()
        self.paced = Paced(governor, self._send)
        self.bots: dict[str, Bot] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._sockets: list[AsyncSocketModeHandler] = []

    def add(
        self,
        agent: str,
        answers: str,
        token: str,
        signing_secret: str | None,
        api_url: str | None,
        commands: Sequence[str] = (),
        *,
        app_token: str | None = None,
    ) -> None:
        """One agent's app: Socket Mode with `app_token`, else HTTP with `signing_secret`."""
        web_client = AsyncWebClient(token=token, **({"base_url": api_url} if api_url else {}))
        app = AsyncApp(
            client=web_client,
            signing_secret=signing_secret or "",
            request_verification_enabled=app_token is None,  # Socket Mode has no signatures
        )
        bot = Bot(agent=agent, answers=answers, app=app, web=web_client, app_token=app_token)

        async def on_event(body: dict[str, Any], context: AsyncBoltContext) -> None:
            await self._on_event(bot, body, context)

        async def on_command(ack: AsyncAck, body: dict[str, Any]) -> None:
            await ack()
            self._spawn(self._command(bot, body))

        async def on_click(ack: AsyncAck, body: dict[str, Any]) -> None:
            await ack()
            self._spawn(self._click(bot, body))

        app.event(re.compile(".*"))(on_event)
        for command in commands:
            app.command(command)(on_command)
        app.action(re.compile(rf"^{ACTION_PREFIX}:"))(on_click)
        self.bots[agent] = bot

    def routes(self) -> list[web.RouteDef]:
        """`POST /slack/<agent>/events` for every bot over HTTP (those without an app token)."""
        return [
            web.post(f"/slack/{a}/events", self._handler(bot))
            for a, bot in self.bots.items()
            if bot.app_token is None
        ]

    async def start(self) -> None:
        """Connect every Socket Mode bot (its Web API client also opens the connection)."""
        for bot in self.bots.values():
            if bot.app_token is None:
                continue
            handler = AsyncSocketModeHandler(bot.app, bot.app_token, web_client=bot.web)
            self._sockets.append(handler)
            await handler.connect_async()

    async def idle(self) -> None:
        """Wait until every turn started so far (and since) has ended."""
        while self._tasks:
            await asyncio.wait(list(self._tasks))

    async def aclose(self) -> None:
        """Stop receiving, following turns (the engine keeps running them) and the pacing."""
        sockets, self._sockets = self._sockets, []
        for handler in sockets:
            await handler.close_async()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.paced.aclose()

    # -- receiving ----------------------------------------------------------------------

    def _handler(self, bot: Bot) -> Handler:
        async def events(request: web.Request) -> web.StreamResponse:
            try:
                bolt_request = await to_bolt_request(request)
            except ValueError:  # not JSON: nothing Bolt (or we) can read
                return web.Response(status=400, text="malformed body")
            if not _readable(bolt_request.body):
                return web.Response(status=400, text="malformed body")
            return await to_aiohttp_response(await bot.app.async_dispatch(bolt_request))

        return events

    async def _on_event(self, bot: Bot, body: dict[str, Any], context: AsyncBoltContext) -> None:
        """Runs after Bolt verified the signature and acked."""
        event = body.get("event")
        if not isinstance(event, dict):
            return
        bot_user, bot_id = context.bot_user_id, context.bot_id
        if not wants_turn(event, bot.answers, bot_user, bot_id):
            return
        event_id = body.get("event_id")
        if not isinstance(event_id, str) or not event_id:
            return
        fresh = await self.client.redis.set(
            f"subs:slack:event:{event_id}", 1, nx=True, ex=DEDUPE_SECONDS
        )
        if not fresh:
            return  # a retry or a replay: its turn started already
        team = body.get("team_id") or context.team_id or ""
        self._spawn(self._turn(bot, str(team), event, bot_user, bot_id))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("slack turn failed", exc_info=task.exception())

    # -- one turn -----------------------------------------------------------------------

    async def _turn(
        self, bot: Bot, team: str, event: dict[str, Any], bot_user: str | None, bot_id: str | None
    ) -> None:
        channel, ts, user = event["channel"], event["ts"], event["user"]
        thread_ts = thread_ts_of(event)
        assert thread_ts is not None  # wants_turn checked
        messages: list[dict[str, Any]] = []
        if thread_ts != ts:
            replies = await bot.web.conversations_replies(channel=channel, ts=thread_ts)
            for msg in missed_messages(replies.get("messages") or [], ts, bot_user, bot_id):
                text = f"<@{msg['user']}>: {msg.get('text') or ''}"
                messages.append({"id": f"slack:{msg['ts']}", "role": "user", "content": text})
        text = strip_mention(event["text"], bot_user)
        messages.append({"id": f"slack:{ts}", "role": "user", "content": text})
        payload = {
            "type": "client.append",
            "agent_id": bot.agent,
            "messages": messages,
            "queue": True,
        }
        await self._run(_Reply(bot, team, channel, thread_ts, trigger=ts), user, payload)

    async def _command(self, bot: Bot, body: dict[str, Any]) -> None:
        """A slash command: a root message saying who ran what, its thread the session."""
        args = {key: str(body.get(key) or "") for key in COMMAND_ARGS}
        command = str(body.get("command") or "")
        if not (command and args["channel_id"] and args["user_id"]):
            return
        team, channel, user = args["team_id"], args["channel_id"], args["user_id"]
        ran = escape(f"{command} {args['text']}".strip())
        root = _Reply(bot, team, channel, "")
        root.thread_ts = await self._post(root, {"text": f"<@{user}> ran `{ran}`"})
        root.trigger = root.thread_ts
        payload = {
            "type": "client.action",
            "agent_id": bot.agent,
            "name": command.removeprefix("/"),
            "args": args,
        }
        await self._run(root, user, payload)

    async def _run(self, out: _Reply, user: str, payload: dict[str, Any]) -> None:
        """Submit a turn-starting input for the thread's session and stream its turn.

        While a prompt is open the engine refuses new input; the open question is posted again.
        """
        sid = session_id_for(out.bot.agent, out.channel, out.thread_ts)
        events = await self.client.events(sid)
        after = events[-1]["seq"] if events else 0
        cursor = await self.client.delta_cursor(sid)
        metadata = {
            "slack_channel": out.channel,
            "slack_thread_ts": out.thread_ts,
            "slack_team": out.team,
        }
        identity = {"subject": {"issuer": "slack", "id": user}, "metadata": metadata}
        try:
            reply = await self.client.submit(payload, session_id=sid, identity=identity)
        except ClientError as err:
            if err.code != "session_interrupted":
                raise
            for interrupt in (await self._open_interrupts(sid)).values():
                await self._ask(out, interrupt)
            return
        turn_id = reply.get("turn_id")
        if turn_id is None:
            return  # every message was known already: nothing to answer
        await self._stream(out, sid, turn_id, after, cursor)

    async def _stream(self, out: _Reply, sid: str, turn_id: str, after: int, cursor: str) -> None:
        """Follow the turn into one Slack message, then take the working indicator down."""
        try:
            await self._follow(out, sid, turn_id, after, cursor)
        finally:
            task = asyncio.current_task()
            if task is None or not task.cancelling():  # shutting down: Slack times it out
                await self._unindicate(out)

    async def _follow(self, out: _Reply, sid: str, turn_id: str, after: int, cursor: str) -> None:
        """Follow the turn into one Slack message until its final render has landed."""
        view = TurnView(turn_id)
        async for kind, item in self.client.follow(sid, after, delta_cursor=cursor):
            if kind == "delta":
                view.apply_delta(item)
            elif item.get("turn_id") != turn_id:
                continue
            else:
                try:
                    view.apply_event(item)
                except ValueError as err:  # a newer engine's event: show the rest anyway
                    log.warning("slack turn %s: %s", turn_id, err)
                    continue
                if item["payload"]["type"] == "session.interrupted":
                    await self._ask(out, item["payload"])
            rendered = view.render()
            content = {"text": rendered.text, "blocks": rendered.blocks}
            if rendered.blocks and content != out.shown:
                out.shown = content
                if out.ts is None:
                    out.ts = await self._post(out, content)
                    out.status = ""  # Slack clears the thread status when the app replies
                else:
                    args = {"channel": out.channel, "ts": out.ts, **content}
                    key = (out.channel, out.ts)
                    out.landed = self.paced.submit(
                        out.team, "chat.update", key, (out.bot.web, args)
                    )
            if not rendered.done:
                self._indicate(out, rendered.status or "")
            if rendered.done:
                if out.landed is not None:
                    await out.landed  # the final version, or a newer one of the same key
                for more in rendered.continuations:
                    await self._post(out, {"markdown_text": more})
                return

    # -- working indicator --------------------------------------------------------------

    def _indicate(self, out: _Reply, status: str) -> None:
        """Show `status` on the thread ("" clears it), unless Slack refused a status there."""
        if out.reaction is not None or status == out.status:
            return
        out.status = status
        out.status_sent = self._set_status(out, status)
        out.status_sent.add_done_callback(lambda sent: self._refused(out, sent))

    def _set_status(self, out: _Reply, status: str) -> asyncio.Future[None]:
        args = {"channel_id": out.channel, "thread_ts": out.thread_ts, "status": status}
        key = (out.channel, out.thread_ts)
        return self.paced.submit(out.team, SET_STATUS, key, (out.bot.web, args))

    def _refused(self, out: _Reply, sent: asyncio.Future[None]) -> None:
        """Slack refused setStatus (not an assistant thread, say): react to the trigger."""
        if sent.cancelled() or not isinstance(sent.exception(), SlackApiError):
            return
        if out.reaction is not None or not out.trigger:
            return
        out.reaction = self._reaction(out, "reactions.add")

    def _reaction(self, out: _Reply, method: str) -> asyncio.Future[None]:
        args = {"channel": out.channel, "timestamp": out.trigger, "name": WORKING_REACTION}
        return self.paced.submit(out.team, method, (out.channel, out.trigger), (out.bot.web, args))

    async def _unindicate(self, out: _Reply) -> None:
        """Clear the status, or remove the reaction, once the turn's message has landed."""
        if out.status_sent is None:
            return  # nothing was shown
        await asyncio.gather(out.status_sent, return_exceptions=True)  # settles `reaction`
        if out.reaction is None:
            shown = self._set_status(out, "")
        else:
            [added] = await asyncio.gather(out.reaction, return_exceptions=True)
            if added is not None:
                return  # no reaction to remove
            shown = self._reaction(out, "reactions.remove")
        await asyncio.gather(shown, return_exceptions=True)  # Paced logged a failure

    # -- interrupts ---------------------------------------------------------------------

    async def _open_interrupts(self, sid: str) -> dict[str, dict[str, Any]]:
        """The session's open interrupts as the engine recorded them, by id."""
        _, state = await self.client.store.load_snapshot(sid)
        interrupts = (state or {}).get("interrupts")
        return interrupts if isinstance(interrupts, dict) else {}

    async def _ask(self, out: _Reply, interrupt: dict[str, Any]) -> None:
        """Post the prompt for one interrupt into the thread."""
        prompt = _prompt(interrupt)
        if prompt is not None:
            await self._post(out, prompt)

    async def _click(self, bot: Bot, body: dict[str, Any]) -> None:
        """A prompt button: resume with the recorded option, then show who answered."""
        actions = body.get("actions")
        action = actions[0] if isinstance(actions, list) and actions else None
        parsed = parse_interrupt_action(action) if isinstance(action, dict) else None
        container = body.get("container") or {}
        channel = (body.get("channel") or {}).get("id") or container.get("channel_id")
        message_ts = container.get("message_ts")
        user = (body.get("user") or {}).get("id")
        team = str((body.get("team") or {}).get("id") or "")
        if parsed is None or not all(isinstance(v, str) for v in (channel, message_ts, user)):
            return
        interrupt_id, index = parsed
        thread_ts = container.get("thread_ts") or message_ts
        sid = session_id_for(bot.agent, channel, thread_ts)
        interrupt = (await self._open_interrupts(sid)).get(interrupt_id)
        option = _option(interrupt, index)
        resumed = False
        if interrupt is not None and option is not None:
            responder = {"channel": "slack", "user": user}
            responder |= {k: option[k] for k in ("label", "style") if option.get(k) is not None}
            resume = {
                "type": "interrupt.resume",
                "interrupt_id": interrupt_id,
                "payload": {"value": option.get("value"), "responder": responder},
            }
            try:
                reply = await self.client.submit(resume, session_id=sid)
            except ClientError as err:
                log.warning("slack prompt %s: %s", interrupt_id, err)
            else:
                resumed = reply.get("resumed") is True
        if not resumed or interrupt is None or option is None:
            ephemeral = {"channel": channel, "user": user, "thread_ts": thread_ts, "text": ANSWERED}
            await _call(bot.web, "chat.postEphemeral", ephemeral)
            return
        prompt = _prompt(interrupt) or {}
        label = str(option.get("label") or "") or None
        answered = resolved_prompt(prompt, label, user, option.get("style") != "danger")
        args = {"channel": channel, "ts": message_ts, **answered}
        await self.paced.submit(team, "chat.update", (channel, message_ts), (bot.web, args))

    # -- posting ------------------------------------------------------------------------

    async def _post(self, out: _Reply, content: Mapping[str, Any]) -> str:
        """chat.postMessage into the thread (or as a root message when `out` has no thread
        yet), waiting out 429s."""
        budget = scope(out.team, "chat.postMessage", out.channel)
        governor = self.paced.governor
        loop = asyncio.get_running_loop()
        for attempt in range(POST_ATTEMPTS):
            slot = governor.next_slot(budget, "chat.postMessage", loop.time())
            if slot > loop.time():
                await asyncio.sleep(slot - loop.time())
            governor.record(budget, "chat.postMessage", loop.time())
            try:
                return await _sent_ts(out, content)
            except RateLimited as limited:
                if attempt == POST_ATTEMPTS - 1:
                    raise
                governor.penalise(budget, "chat.postMessage", limited.retry_after, loop.time())
        raise AssertionError("unreachable")

    async def _send(self, team: str, method: str, payload: tuple[AsyncWebClient, dict]) -> None:
        web_client, args = payload
        await _call(web_client, method, args)


def _prompt(interrupt: dict[str, Any]) -> dict[str, Any] | None:
    """The prompt message for a recorded interrupt; None when Slack cannot carry its id."""
    payload = interrupt.get("payload")
    try:
        return interrupt_prompt(
            str(interrupt["interrupt_id"]),
            payload if isinstance(payload, dict) else None,
            str(interrupt.get("reason") or ""),
        )
    except ValueError as err:
        log.warning("slack prompt not shown: %s", err)
        return None


def _option(interrupt: dict[str, Any] | None, index: int) -> dict[str, Any] | None:
    """Option `index` of an interrupt's `metadata.options`, when there is such a dict."""
    payload = (interrupt or {}).get("payload")
    metadata = payload.get("metadata") if isinstance(payload, dict) else None
    options = metadata.get("options") if isinstance(metadata, dict) else None
    if not isinstance(options, list) or index >= len(options):
        return None
    option = options[index]
    return option if isinstance(option, dict) else None


def _readable(body: Any) -> bool:
    """A body Bolt's own middleware can read without raising (it would answer 500)."""
    return isinstance(body, dict) and isinstance(body.get("event", {}), dict)


async def _sent_ts(out: _Reply, content: Mapping[str, Any]) -> str:
    args = {"channel": out.channel, **content}
    if out.thread_ts:
        args["thread_ts"] = out.thread_ts
    response = await _call(out.bot.web, "chat.postMessage", args)
    return str(response["ts"])


async def _call(web_client: AsyncWebClient, method: str, args: dict[str, Any]) -> Any:
    """One Web API call; a 429 becomes `RateLimited` for the governor."""
    try:
        return await web_client.api_call(method, json=args)
    except SlackApiError as err:
        if err.response.status_code == 429:
            headers = {k.lower(): v for k, v in (err.response.headers or {}).items()}
            retry_after = headers.get("retry-after")
            if isinstance(retry_after, list):
                retry_after = retry_after[0] if retry_after else None
            raise RateLimited(float(retry_after or 1)) from err
        raise


def start_bots(
    project: Project,
    client: Client,
    env: Mapping[str, str],
    api_url: str | None = None,
    *,
    governor: RateGovernor | None = None,
) -> Bots:
    """A bot for each agent with a Slack block whose bot token is set, and an app token
    (Socket Mode) or a signing secret (HTTP). Call `Bots.start()` to connect Socket Mode.

    `api_url` (else `SLACK_API_URL`) is the Web API base, for a fake Slack in tests.
    """
    bots = Bots(client, governor)
    api_url = api_url or env.get("SLACK_API_URL") or None
    for agent in project.agents.values():
        if agent.slack is None:
            continue
        suffix = slack_env_suffix(agent.id)
        token = env.get(f"SLACK_BOT_TOKEN_{suffix}")
        secret = env.get(f"SLACK_SIGNING_SECRET_{suffix}") or None
        app_token = env.get(f"SLACK_APP_TOKEN_{suffix}") or None
        if not token or not (app_token or secret):
            log.info("agent %s: no Slack bot token, or no app token or signing secret", agent.id)
            continue
        bots.add(
            agent.id,
            agent.slack.answers,
            token,
            secret,
            api_url,
            agent.slack.commands,
            app_token=app_token,
        )
    return bots
