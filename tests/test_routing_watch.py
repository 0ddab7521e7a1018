"""`route` and `Watch` (pure): what a Slack message event asks of the app, read from
payloads shaped as Slack sends them (oncall-facts §1.0: a classic app's post is
`subtype: bot_message` with `bot_id`, `username` and no `user`; a modern app's has no
subtype but `user`, `bot_id`, `bot_profile`; edits are `message_changed` with the message
inside; slack-facts §3.3 for mentions and thread replies)."""

from __future__ import annotations

from typing import Any

import pytest

from bot.turns.routing import route
from bot.turns.watch import Watch, poster_names
from tests.fakes.slack import alerts

BOT, BOT_ID = "UBOT", "BBOT"
ALERTS = "C0ALERTS"
WATCHES = (Watch.of(ALERTS, ["Alertmanager", "B0GRAF", "A0SENTRY"], "FIRING|level: `error`"),)


def _msg(**kw: Any) -> dict[str, Any]:
    return {
        "type": "message",
        "channel": "C1",
        "channel_type": "channel",
        "user": "U1",
        "text": "hi",
        "ts": "2.000001",
        **kw,
    }


def _classic(payload: dict[str, Any], **kw: Any) -> dict[str, Any]:
    fields = {"channel": ALERTS, "subtype": "bot_message", "bot_id": "B0AM"}
    event = _msg(**{**fields, **payload, **kw})
    del event["user"]
    return event


def _modern(payload: dict[str, Any], name: str, **kw: Any) -> dict[str, Any]:
    profile = {"id": "B0GRAF", "app_id": "A0GRAF", "name": name}
    fields = {"channel": ALERTS, "user": "U0GRAF", "bot_id": "B0GRAF", "bot_profile": profile}
    return _msg(**{**fields, **payload, **kw})


REPLY = {"thread_ts": "1.000001", "parent_user_id": "U1"}
AM_FIRING = {"username": "Alertmanager", **alerts.ALERTMANAGER_FIRING}
AM_RESOLVED = {"username": "Alertmanager", **alerts.ALERTMANAGER_RESOLVED}

CASES: list[tuple[str, dict[str, Any], str | None]] = [
    ("alertmanager firing, classic", _classic(AM_FIRING), "alert"),
    ("alertmanager by app id", _classic(AM_FIRING, username="am-prod", app_id="A0SENTRY"), "alert"),
    ("grafana by bot id, modern", _modern(alerts.GRAFANA_FIRING, "Grafana"), "alert"),
    (
        "sentry blocks, text fallback",
        _classic(alerts.SENTRY_ISSUE, username="sentry", app_id="A0SENTRY"),
        "alert",
    ),
    ("resolved: match fails", _classic(AM_RESOLVED), None),
    ("unlisted poster", _classic({**AM_FIRING, "username": "Deploybot"}, bot_id="B0DEP"), None),
    ("a person is not listed", _msg(channel=ALERTS, text="FIRING?"), None),
    ("unwatched channel", _classic(AM_FIRING, channel="C1"), None),
    ("thread reply by the poster", _classic(AM_FIRING, **REPLY), None),
    ("edit", _msg(channel=ALERTS, subtype="message_changed", message=_classic(AM_FIRING)), None),
    ("edited copy", _classic(AM_FIRING, edited={"user": "U1", "ts": "3.0"}), None),
    (
        "deletion",
        {"type": "message", "subtype": "message_deleted", "channel": ALERTS, "ts": "3.1"},
        None,
    ),
    ("join notice", _msg(channel=ALERTS, subtype="channel_join", text="<@U1> has joined"), None),
    ("own post", _msg(channel=ALERTS, user=BOT, bot_id=BOT_ID, text="FIRING"), None),
    ("mention, message twin", _msg(text=f"<@{BOT}> help"), "mention"),
    ("mention, app_mention", _msg(type="app_mention", text=f"<@{BOT}> help"), "mention"),
    ("mention in a thread", _msg(text=f"<@{BOT}> and now?", **REPLY), "mention"),
    ("dm", _msg(channel="D1", channel_type="im"), "dm"),
    ("dm reply", _msg(channel="D1", channel_type="im", **REPLY), "dm"),
    ("follow-up", _msg(text="and now?", **REPLY), "reply"),
    ("follow-up with a file", _msg(subtype="file_share", text="log", **REPLY), "reply"),
    ("aside to a person", _msg(text="<@U2> can you look?", **REPLY), None),
    ("aside to a group", _msg(text="<!subteam^S1|@db> look", **REPLY), None),
    ("aside that names the app too", _msg(text=f"<@U2> ask <@{BOT}>", **REPLY), "mention"),
    ("an app's reply", _modern({"text": "panel", **REPLY}, "Grafana", channel="C1"), None),
    ("own reply", _msg(user=BOT, bot_id=BOT_ID, text="done", **REPLY), None),
    ("top-level chatter", _msg(text="lunch?"), None),
]


@pytest.mark.parametrize(("event", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_route(event: dict[str, Any], expected: str | None) -> None:
    assert route(event, "both", BOT, BOT_ID, follow=True, watches=WATCHES) == expected


def test_answers_and_follow_narrow_what_is_routed() -> None:
    follow_up, mention = _msg(text="and now?", **REPLY), _msg(text=f"<@{BOT}> help")
    alert = _classic(AM_FIRING)
    assert route(follow_up, "both", BOT, BOT_ID, follow=False, watches=WATCHES) is None
    assert route(follow_up, "dm", BOT, BOT_ID, follow=True, watches=WATCHES) is None
    assert route(mention, "dm", BOT, BOT_ID, follow=True, watches=WATCHES) is None
    assert route(alert, "dm", BOT, BOT_ID, follow=False, watches=WATCHES) == "alert"
    assert route(alert, "both", BOT, BOT_ID) is None  # nothing watched


def test_a_watch_entry_without_from_or_match_takes_every_new_post() -> None:
    anyone = (Watch.of(ALERTS, [], None),)
    for event in (_classic(AM_RESOLVED), _msg(channel=ALERTS, text="")):
        assert route(event, "both", BOT, BOT_ID, watches=anyone) == "alert"


def test_poster_names_are_every_name_slack_gives() -> None:
    modern = _modern({}, "Grafana")
    assert poster_names(modern) == {"u0graf", "b0graf", "a0graf", "grafana"}
    assert poster_names(_classic({"username": " Alertmanager "})) == {"b0am", "alertmanager"}
