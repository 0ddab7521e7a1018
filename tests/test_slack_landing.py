"""Sessions that land in Slack (docs/slack.md "Sessions that start outside Slack"): a full
key's submit whose identity names `slack_channel` posts a root message there, its reply
streams into the thread, and a mention in that thread continues the same session; a SIGKILL
mid-reply leaves one complete reply; Alertmanager's webhook triages each alert group in a
thread of its own, a re-fire continuing it. All through `subs serve`, real HTTP and Bolt,
against the fake Slack.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine.api import ApiKeys, make_app
from engine.client import Client
from engine.runtime.engine import Engine
from tests.api_helpers import ALICE, INPUT, ROOT, auth, serve
from tests.engine_helpers import ENV, make_project, poll_until
from tests.fakes import alertmanager
from tests.fakes.llm_vendor import FakeVendor, Text
from tests.fakes.slack import FakeSlack, Message
from tests.slack_serve_helpers import AGENT, SlackServe, of_type, slack_serve

KEY = "landing-full-key"
SCOPED = "landing-scoped-key"
KEYS = {"SUBS_API_KEYS": f"{KEY},{SCOPED}:own"}
AUTH = {"Authorization": f"Bearer {KEY}"}


def _shown(msg: Message) -> str:
    """The answer a message shows: its markdown block (edits) or its streamed text."""
    blocks = [b["text"] for b in msg.blocks if b.get("type") == "markdown"]
    return blocks[0] if blocks else msg.text


def _ask(text: str, channel: str, **more: Any) -> dict[str, Any]:
    message = {"role": "user", "content": text}
    body: dict[str, Any] = {
        "input": {"type": "client.append", "agent_id": AGENT, "messages": [message]},
        "identity": {"metadata": {"slack_channel": channel, **more}},
    }
    return body


async def _post(app: SlackServe, path: str, body: Any, headers: dict[str, str]) -> httpx.Response:
    assert app.serve is not None
    async with httpx.AsyncClient(base_url=app.serve.api, timeout=30) as http:
        return await http.post(path, json=body, headers=headers)


def _roots(app: SlackServe, channel: str) -> list[Message]:
    return [m for m in app.fake.history(channel) if app.fake.by_app(m)]


async def _turns_done(app: SlackServe, sid: str, count: int) -> list[dict[str, Any]]:
    async def done() -> list[dict[str, Any]] | None:
        log = await app.client.events(sid)
        return log if len(of_type(log, "turn.completed")) >= count else None

    return await poll_until(done, timeout=30, what=f"{count} turns of {sid} to complete")


async def test_a_submit_naming_a_channel_lands_there_and_a_mention_continues_it(
    tmp_path: Path, redis_url: str, vendor: FakeVendor
) -> None:
    vendor.push(Text("Disk on db-1 is at 71%: fine for now."))
    vendor.push(Text("db-2 is at 93%: clean up /var/log."))
    vendor.push(Text("Backups ran at 01:00: all green."))
    async with slack_serve(tmp_path, redis_url, vendor.url, env=KEYS) as app:
        fake, general = app.fake, app.fake.general.id
        refused = await _post(
            app,
            "/api/client/sessions/input",
            _ask("hi", general),
            {"Authorization": f"Bearer {SCOPED}"},
        )
        assert refused.status_code == 403  # a scoped key sets no identity, so no thread
        bad = await _post(app, "/api/client/sessions/input", _ask("hi", "#general"), AUTH)
        assert bad.status_code == 422 and "slack_channel" in bad.json()["error"]
        assert not _roots(app, general)

        answer = await _post(
            app, "/api/client/sessions/input", _ask("Check the disk on db-1", general), AUTH
        )
        assert answer.status_code == 202, answer.text
        landed = answer.json()
        sid, turn_id = landed["session_id"], landed["turn_id"]
        assert not sid.startswith("slack:") and landed["slack"]["channel"] == general

        [root] = await fake.until(lambda: _roots(app, general) or None, timeout=20)
        assert root.text == "Check the disk on db-1"
        log = await _turns_done(app, sid, 1)
        assert [p["turn_id"] for p in of_type(log, "turn.completed")] == [turn_id]
        await fake.until(
            lambda: (
                (
                    len(app.bot_messages(root)) == 2
                    and _shown(app.bot_messages(root)[1]) == "Disk on db-1 is at 71%: fine for now."
                )
                or None
            ),
            timeout=20,
        )
        [created] = of_type(log, "session.created")
        identity = created["identity"]  # the caller's, with the thread it landed in
        assert identity["subject"]["issuer"] == "api"
        assert identity["metadata"]["slack_channel"] == general
        assert identity["metadata"]["slack_thread_ts"] == root.ts
        assert identity["metadata"]["slack_team"] == fake.team.id  # the app's (auth.test)

        asked = fake.post_as_user(general, fake.mention("and db-2?"), thread_ts=root.ts)
        assert (await app.send_event(fake.event_for(asked, kind="app_mention"))).status == 200
        log = await _turns_done(app, sid, 2)
        said = [p["message"]["content"] for p in of_type(log, "message.new")]
        assert any("and db-2?" in str(c) for c in said)
        await fake.until(
            lambda: (
                (
                    len(app.bot_messages(root)) == 3
                    and _shown(app.bot_messages(root)[2]) == "db-2 is at 93%: clean up /var/log."
                )
                or None
            ),
            timeout=20,
        )
        assert not await app.client.last_seq(app.session_id(general, root.ts))  # no 2nd session

        # The API's next input to the session lands in its thread too (no identity needed).
        more = {"session_id": sid, "input": _ask("And the backups?", general)["input"]}
        again = await _post(app, "/api/client/sessions/input", more, AUTH)
        assert again.status_code == 202, again.text
        assert again.json()["slack"]["thread_ts"] == root.ts
        await _turns_done(app, sid, 3)
        await fake.until(
            lambda: (
                (
                    len(app.bot_messages(root)) == 4
                    and _shown(app.bot_messages(root)[3]) == "Backups ran at 01:00: all green."
                )
                or None
            ),
            timeout=20,
        )
        assert len(_roots(app, general)) == 1


ANSWER = (
    "The **primary** database is back.\n\n"
    "1. `db-1` took over at 02:14\n"
    "2. replication caught up at 02:16\n\n"
    "Nothing else to do; the runbook has the details."
)


async def test_a_landed_turn_killed_mid_reply_leaves_one_root_and_one_complete_reply(
    tmp_path: Path, redis_url: str, vendor: FakeVendor
) -> None:
    vendor.push(Text(ANSWER, chunks=40, chunk_delay=0.15))  # cut by the kill
    vendor.push(Text(ANSWER, chunks=8, chunk_delay=0.05))  # the engine's second attempt
    async with slack_serve(tmp_path, redis_url, vendor.url, env=KEYS) as app:
        fake, general = app.fake, app.fake.general.id
        answer = await _post(
            app, "/api/client/sessions/input", _ask("Is the db back?", general), AUTH
        )
        assert answer.status_code == 202, answer.text
        sid = answer.json()["session_id"]
        [root] = await fake.until(lambda: _roots(app, general) or None, timeout=20)

        def partly_shown() -> Message | None:
            mine = app.bot_messages(root)[1:]
            return mine[0] if mine and 0 < len(_shown(mine[0])) < len(ANSWER) else None

        first = await fake.until(partly_shown, timeout=20)
        await app.kill()
        assert _shown(first) != ANSWER
        await app.restart()

        log = await _turns_done(app, sid, 1)
        await fake.until(lambda: _shown(first) == ANSWER or None, timeout=40)
        assert [m.ts for m in app.bot_messages(root)] == [root.ts, first.ts]
        assert [m.ts for m in _roots(app, general)] == [root.ts]
        assert len(of_type(log, "turn.started")) == 1
        assert [p["attempt"] for p in of_type(log, "llm.call.dispatched")] == [1, 2]
        assert not [c for c in fake.requests if c.error and c.status != 429]


async def test_alertmanager_posts_one_triage_thread_per_group_and_a_refire_continues_it(
    tmp_path: Path, redis_url: str, vendor: FakeVendor
) -> None:
    vendor.push(Text("Disk full on db-1 and db-2: rotate logs."))
    vendor.push(Text("Now db-3 too: same cause."))
    vendor.push(Text("API latency is from the deploy at 02:10."))
    async with FakeSlack() as fake:
        alerts = fake.add_channel("alerts")
        hook = f'\n[hooks.alertmanager]\nagent = "{AGENT}"\nchannel = "{alerts.id}"\n'
        async with slack_serve(
            tmp_path, redis_url, vendor.url, fake=fake, extra=hook, env=KEYS
        ) as app:
            path = "/api/hooks/alertmanager"
            disk = alertmanager.notification(
                "DiskFull",
                [alertmanager.alert("DiskFull", "db-1"), alertmanager.alert("DiskFull", "db-2")],
            )
            assert (await _post(app, path, disk, {})).status_code == 401
            scoped = {"Authorization": f"Bearer {SCOPED}"}
            assert (await _post(app, path, disk, scoped)).status_code == 403
            old = await _post(app, path, {**disk, "version": "3"}, AUTH)
            assert old.status_code == 422 and old.json()["param"] == "version"

            first = await _post(app, path, disk, AUTH)
            assert first.status_code == 202, first.text
            sid, turn = first.json()["session_id"], first.json()["turn_id"]
            [root] = await fake.until(lambda: _roots(app, alerts.id) or None, timeout=20)
            assert root.text == "[FIRING:2] DiskFull"
            # Alertmanager retries a notification whose 202 it lost with the same body
            # (notify.go RetryStage): the same turn, answered again, triaged once. (One
            # sent while the root is being posted is a 503 "try again", which it retries.)
            retry = await _post(app, path, disk, AUTH)
            assert retry.status_code == 202, retry.text
            assert (retry.json()["session_id"], retry.json()["turn_id"]) == (sid, turn)
            log = await _turns_done(app, sid, 1)
            [asked] = [p for p in of_type(log, "message.new") if p["message"]["role"] == "user"]
            assert "db-2" in str(asked["message"]["content"])

            refire = alertmanager.notification(
                "DiskFull", [*disk["alerts"], alertmanager.alert("DiskFull", "db-3")]
            )
            again = await _post(app, path, refire, AUTH)
            assert again.status_code == 202 and again.json()["session_id"] == sid
            assert again.json()["slack"]["thread_ts"] == root.ts
            assert again.json()["turn_id"] != turn
            await _turns_done(app, sid, 2)
            # The first notification once more, after the bot's hour of dedupe keys has
            # passed (deleted here): the session's own state knows the turn id.
            async for key in app.redis.scan_iter(match="*seen:land:*"):
                await app.redis.delete(key)
            late = await _post(app, path, disk, AUTH)
            assert late.status_code == 202, late.text
            assert (late.json()["turn_id"], late.json()["existing"]) == (turn, True)
            assert late.json()["slack"]["thread_ts"] == root.ts

            latency = alertmanager.notification(
                "ApiLatency", [alertmanager.alert("ApiLatency", "api-1", severity="warning")]
            )
            other = await _post(app, path, latency, AUTH)
            assert other.status_code == 202 and other.json()["session_id"] != sid
            await _turns_done(app, other.json()["session_id"], 1)

            roots = await fake.until(
                lambda: (len(_roots(app, alerts.id)) == 2 and _roots(app, alerts.id)) or None,
                timeout=20,
            )
            assert roots[0].ts == root.ts and roots[1].text == "[FIRING:1] ApiLatency"
            await fake.until(
                lambda: (
                    [_shown(m) for m in app.bot_messages(root)][1:]
                    == ["Disk full on db-1 and db-2: rotate logs.", "Now db-3 too: same cause."]
                    or None
                ),
                timeout=20,
            )
            assert len(of_type(await app.client.events(sid), "turn.started")) == 2
            assert len(vendor.requests) == 3  # one model call a triage, none twice
            await fake.until(
                lambda: (
                    [_shown(m) for m in app.bot_messages(roots[1])][1:]
                    == ["API latency is from the deploy at 02:10."]
                    or None
                ),
                timeout=20,
            )


# -- the edge, without a Slack app: every refusal names what was wrong ----------------------


@pytest.fixture
async def engine(redis: Any, vendor: FakeVendor, tmp_path: Path) -> AsyncIterator[Engine]:
    eng = Engine(make_project(tmp_path, vendor.url), redis, env=ENV, lease_ms=3000)
    await eng.start()
    yield eng
    await eng.stop()


async def test_a_landing_that_cannot_land_is_refused_naming_why(
    engine: Engine, vendor: FakeVendor
) -> None:
    vendor.default = Text("ok")
    app = make_app(Client(engine.store), engine.store, keys=ApiKeys.parse(f"{ROOT},{ALICE}:own"))
    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=10) as http:
        message = {"role": "user", "content": "hi"}
        say = {"type": "client.message", "agent_id": "ops_openai", "message": message}

        async def send(metadata: dict[str, Any], sid: str | None = None) -> httpx.Response:
            body: dict[str, Any] = {"input": say, "identity": {"metadata": metadata}}
            if sid is not None:
                body["session_id"] = sid
            return await http.post(INPUT, json=body, headers=auth(ROOT))

        alone = await send({"slack_thread_ts": "1700000000.000100"})
        assert alone.status_code == 422, alone.text
        assert alone.json()["param"] == "identity.metadata.slack_thread_ts"
        bad_ts = await send({"slack_channel": "C0ALERTS", "slack_thread_ts": "yesterday"})
        assert bad_ts.status_code == 422 and "yesterday" in bad_ts.json()["error"]
        nobody = await send({"slack_channel": "C0ALERTS"})
        assert nobody.status_code == 409 and nobody.json()["code"] == "slack_unavailable"
        made = await http.post(
            INPUT, json={"session_id": "plain-1", "input": say}, headers=auth(ROOT)
        )
        assert made.status_code == 202, made.text
        late = await send({"slack_channel": "C0ALERTS"}, sid="plain-1")
        assert late.status_code == 409 and late.json()["code"] == "conflict", late.text
        hook = await http.post(
            "/api/hooks/alertmanager",
            json=alertmanager.notification("X", [alertmanager.alert("X", "a")]),
            headers=auth(ROOT),
        )
        assert hook.status_code == 404 and "[hooks.alertmanager]" in hook.json()["error"]
        assert [
            r["session_id"]
            for r in (await http.get("/api/admin/sessions", headers=auth(ROOT))).json()["items"]
        ] == ["plain-1"]  # nothing else was created
