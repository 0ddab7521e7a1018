"""The Slack bot in process for tests: the real engine and Bots against a FakeSlack."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from bot.app import Bots, start_bots
from bot.slack.governor import TIERS, RateGovernor
from bot.slack.indicator import SET_STATUS
from bot.turns.routing import session_id_for
from engine.client import Client
from engine.config import Project, slack_env_suffix
from engine.runtime.engine import Engine
from tests.engine_helpers import ENV
from tests.fakes.llm_vendor import FakeVendor
from tests.fakes.slack import FakeSlack, Limit, Message

AGENT = "ops_anthropic"
# Fast pacing so a test streams in milliseconds; the pacing itself is tested elsewhere.
FAST = {
    **TIERS,
    "chat.update": 6000,
    "chat.postMessage": 6000,
    "chat.startStream": 6000,
    "chat.stopStream": 6000,
    "chat.appendStream": 6000,
    "conversations.replies": 6000,
    "users.info": 6000,
    "bots.info": 6000,
    "files.download": 6000,
    "files.getUploadURLExternal": 6000,
    "files.completeUploadExternal": 6000,
    "usergroups.users.list": 6000,
    SET_STATUS: 6000,
}


@dataclass
class World:
    fake: FakeSlack
    vendor: FakeVendor
    client: Client
    bots: Bots
    url: str
    agent: str = AGENT
    project: Project | None = None
    env: dict[str, str] = field(default_factory=dict)

    @asynccontextmanager
    async def successor(self, **kw: Any) -> AsyncIterator[Bots]:
        """A second bot process's worth of apps on the same engine and Slack, started (so
        resuming what is open), closed afterwards."""
        assert self.project is not None
        bots = start_bots(
            self.project,
            self.client,
            self.client.store.redis,
            self.env,
            governor=RateGovernor(FAST),
            **kw,
        )
        await bots.start()
        await bots.connected()
        try:
            yield bots
        finally:
            await bots.aclose()

    async def reply_to(self, msg: Message, nth: int = 1) -> Message:
        """The bot's `nth` reply in the thread of `msg`, once its turn has ended."""
        thread_ts = msg.thread_ts or msg.ts

        def found() -> Message | None:
            mine = [m for m in self.fake.thread(msg.channel, thread_ts) if self.fake.by_app(m)]
            return mine[nth - 1] if len(mine) >= nth else None

        reply = await self.fake.until(found, timeout=10)
        await self.bots.idle()
        return reply

    async def turns(self, channel: str, thread_ts: str) -> list[dict[str, Any]]:
        events = await self.client.events(session_id_for(self.agent, channel, thread_ts))
        return [e for e in events if e["payload"]["type"] == "turn.started"]


@asynccontextmanager
async def serve_bots(
    redis,
    vendor: FakeVendor,
    project: Project,
    agent: str,
    *,
    socket: bool = False,
    engine_env: dict[str, str] | None = None,
    slack_limits: Mapping[str, Limit | None] | None = None,
    tiers: Mapping[str, float] = FAST,
    slack_env: Callable[[FakeSlack], dict[str, str]] | None = None,
) -> AsyncIterator[World]:
    """The engine (its environment: `engine_env`, default the suite's vendor keys), a
    FakeSlack and the bots of `project` (only `agent` has a Slack block), over HTTP or,
    with `socket`, over Socket Mode. `slack_limits` overrides the fake's rate limits, `tiers`
    the bots' pacing; `slack_env` adds to the bots' environment what it makes of the
    started fake (a watched channel's id, say)."""
    engine = Engine(project, redis, env=ENV if engine_env is None else engine_env, lease_ms=3000)
    await engine.start()
    suffix = slack_env_suffix(agent)
    async with FakeSlack(limits=slack_limits) as fake:
        env = {f"SLACK_BOT_TOKEN_{suffix}": fake.bot_token, "SLACK_API_URL": fake.url}
        env |= slack_env(fake) if slack_env is not None else {}
        if socket:
            env[f"SLACK_APP_TOKEN_{suffix}"] = fake.app_token
        else:
            env[f"SLACK_SIGNING_SECRET_{suffix}"] = fake.signing_secret
        client = Client(engine.store)
        governor = RateGovernor(tiers)
        spans = None if engine.tracing is None else engine.tracing.emit
        bots = start_bots(project, client, client.store.redis, env, governor=governor, spans=spans)
        assert list(bots.bots) == [agent]  # no other agent has a Slack block
        await bots.start()
        await bots.connected()
        app = web.Application()
        app.add_routes(bots.routes())
        assert len(bots.routes()) == (0 if socket else 1)
        runner = web.AppRunner(app, shutdown_timeout=1)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}/slack/{agent}/events"
        try:
            yield World(fake, vendor, client, bots, url, agent, project, env)
        finally:
            await runner.cleanup()
            await bots.aclose()
            await engine.stop()
