"""A submitted turn, streamed into its Slack reply until the reply is whole.

The turn's events and deltas fold into its view (bot/rendering/turn_view.py), which the
reply (bot/slack/reply.py) shows as it grows; prompts are posted as the engine opens them
and rewritten when it expires them; the images the tools returned are uploaded once the
answer is in. The turn's slot is given back as soon as nothing more runs for it, and the
intake span (tracing on) ends at the first words posted.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from typing import Any

from bot.rendering.files import tool_images
from bot.rendering.mrkdwn import escape
from bot.rendering.prompts import expired_prompt, prompt_for
from bot.rendering.turn_view import TurnView
from bot.slack.agent_app import Bot
from bot.slack.files import upload
from bot.slack.governor import Paced
from bot.slack.indicator import Indicator
from bot.slack.reply import Reply
from bot.slack.webapi import call, governed
from bot.turns.checkpoint import Checkpoint
from bot.turns.slots import Slot
from bot.turns.store import Checkpoints
from engine.client import Client
from engine.telemetry.live import LIVE, now_ms
from engine.telemetry.spans import Attributes, SpanRecord

__all__ = ["Streamer"]

log = logging.getLogger(__name__)


class Streamer:
    """Streams submitted turns into their replies, for every agent's app in `bots`."""

    def __init__(
        self, client: Client, paced: Paced, checkpoints: Checkpoints, bots: Mapping[str, Bot]
    ) -> None:
        self.client = client
        self.paced = paced
        self.checkpoints = checkpoints
        self.bots = bots

    async def stream(
        self, cp: Checkpoint, view: TurnView, reply: Reply, working: Indicator, slot: Slot
    ) -> None:
        """Fold the turn's events and deltas into its Slack message until the reply is whole.

        The slot is given back as the engine's turn ends, before the final edits (paced by
        Slack's tiers) land: the next turn's model call need not wait for them. A turn that
        waits for a person's decision gives it back then: a few open approvals must not
        stop the app; what runs after the click is not counted (people click, not storms)."""
        follow = self.client.follow(cp.session_id, cp.after, delta_cursor=cp.cursor)
        first = "reply" not in cp.posted  # the intake span ends at this follower's first reply
        images: list[tuple[str, bytes]] = []  # the tools' images, uploaded once it is done
        prompts: dict[str, dict[str, Any]] = {}  # by interrupt id, as posted
        async for kind, item in follow:
            if kind == "delta":
                view.apply_delta(item)
            elif item.get("turn_id") != cp.turn_id:
                continue
            else:
                try:
                    view.apply_event(item)
                except ValueError as err:  # a newer engine's event: show the rest anyway
                    log.warning("slack turn %s: %s", cp.turn_id, err)
                    continue
                payload = item["payload"]
                if payload["type"] == "session.interrupted":
                    await slot.release()  # a person decides now, for minutes or days
                    prompt = prompt_for(payload)
                    if prompt is not None:
                        prompts[payload["interrupt_id"]] = prompt
                        await reply.post(f"prompt-{payload['interrupt_id']}", prompt)
                elif payload["type"] == "session.interrupt_resumed" and payload.get("expired"):
                    await self._expired(cp, prompts.get(payload["interrupt_id"]), payload)
                await reply.show_channel()
                if payload["type"] == "tool.call.completed":
                    images += tool_images(payload.get("result"), f"image-{len(images) + 1}")
            if view.done:
                await slot.release()
                await reply.finish(view.render())
                if first:  # nothing was shown before the end: intake lasted the turn
                    first = self._intake(cp)
                await self._upload(cp, images)
                return
            had_reply = reply.ts is not None
            await reply.show()
            if reply.ts is not None and not had_reply:
                working.replied()
                if first:
                    first = self._intake(cp)
            working.show(view.status or "")

    def _intake(self, cp: Checkpoint) -> bool:
        """End the turn's intake span, from the Slack message to its first words posted
        (tracing on). Returns False: it is ended."""
        live = LIVE.get()
        if live is not None:
            started = float(cp.trigger or cp.since or 0) * 1000 or now_ms()
            attributes: Attributes = {
                "gen_ai.agent.name": cp.agent,
                "gen_ai.conversation.id": cp.session_id,
                "subs.turn.id": cp.turn_id,
                "slack.team": cp.team,
                "slack.channel": cp.channel,
                "slack.thread_ts": cp.thread_ts,
            }
            name, start, end = f"slack intake {cp.agent}", int(started), now_ms()
            live.emit([SpanRecord(name, live.parent, None, "server", start, end, attributes)])
        return False

    async def _upload(self, cp: Checkpoint, images: list[tuple[str, bytes]]) -> None:
        """The images the agent's tools returned, uploaded into the thread after its reply,
        each once (a resumed follower skips those it finds in `cp.posted`). One Slack refuses
        is a note in the thread: the reply's text is there already."""
        bot = self.bots[cp.agent]
        for n, (name, data) in enumerate(images):
            part = f"file-{n}"
            if part in cp.posted:
                continue
            why = "files = false" if not bot.files else None
            if why is None:
                governor = self.paced.governor
                why = await upload(bot.web, governor, cp.team, cp.channel, cp.thread_ts, name, data)
            if why is not None:
                log.warning("slack turn %s: could not upload %s: %s", cp.turn_id, name, why)
                text = f":warning: The agent made an image ({escape(name)}) that could not be "
                text += f"uploaded: {escape(why)}"
                args = {"channel": cp.channel, "thread_ts": cp.thread_ts, "text": text}
                await governed(self.paced.governor, cp.team, bot.web, "chat.postMessage", args)
            cp.posted[part] = "uploaded" if why is None else "noted"
            await self.checkpoints.save(cp)

    async def _expired(
        self, cp: Checkpoint, prompt: dict[str, Any] | None, payload: dict[str, Any]
    ) -> None:
        """The engine resolved a prompt as expired: rewrite it to say so (buttons gone)."""
        ts = cp.posted.get(f"prompt-{payload['interrupt_id']}")
        if prompt is None or ts is None:
            return
        bot = self.bots[cp.agent]
        args = {"channel": cp.channel, "ts": ts, **expired_prompt(prompt)}
        send = functools.partial(call, bot.web, "chat.update", args)
        await self.paced.submit(cp.team, "chat.update", (cp.channel, ts), send)
