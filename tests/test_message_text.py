"""What the model reads of a Slack message (bot/rendering/message_text.py), pure: every alert
shape of tests/fakes/slack/alerts.py, rich_text, every mention and link form, the poster,
and messages with fields missing or of the wrong type."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.rendering.message_text import attributed, message_text, poster, readable, wanted_ids
from tests.fakes.slack import alerts

NAMES = {"U1": "alice", "U2": "Bob Smith", "C1": "incidents", "S1": "db-oncall", "BHOOK": "Hooky"}
CLASSIC = {"subtype": "bot_message", "bot_id": "BAPP"}  # an incoming webhook's post
MODERN = {"bot_id": "BAPP", "user": "UAPP", "bot_profile": {"id": "BAPP", "name": "Sentry"}}

AM_LINK = "http://alertmanager.example.com:9093/#/alerts?receiver=oncall-slack"
GRAFANA_FIRING = """Grafana: [FIRING:1] HighCPU Infra (node-1 critical) \
(https://grafana.example.com/alerting/grafana/ddq2k1/view?orgId=1)
**Firing**

Value: A=97.5, C=1
Labels:
 - alertname = HighCPU
 - grafana_folder = Infra
 - instance = node-1
 - severity = critical
Annotations:
 - summary = CPU above 95% for 5 minutes
Source: https://grafana.example.com/alerting/grafana/ddq2k1/view?orgId=1
Silence: https://grafana.example.com/alerting/silence/new?alertmanager=grafana&matcher=alertname%3DHighCPU
Dashboard: https://grafana.example.com/d/node-exporter?orgId=1
Panel: https://grafana.example.com/d/node-exporter?orgId=1&viewPanel=3
Grafana v11.3.0"""
SENTRY = """Sentry: :red_circle: *ZeroDivisionError: division by zero* \
(https://acme.sentry.io/issues/4242/?referrer=slack&alert_rule_id=7)
billing.invoice in compute_total
```ZeroDivisionError: division by zero```
environment: `production`
level: `error`
release: `backend@2.14.0`
Events: *12*   Users Affected: *3*   State: *New*   First Seen: *5m*
[Resolve] [Archive]
Project: backend (https://acme.sentry.io/projects/backend/)    Alert: Billing errors    \
Short ID: BACKEND-1X"""


@pytest.mark.parametrize(
    ("payload", "shape", "expected"),
    [
        (
            alerts.ALERTMANAGER_FIRING,
            CLASSIC,
            f"Alertmanager: [FIRING:2] HighErrorRate (api production) ({AM_LINK})",
        ),
        (
            alerts.ALERTMANAGER_RESOLVED,
            MODERN,
            f"Alertmanager: [RESOLVED] HighErrorRate (api production) ({AM_LINK})",
        ),
        (
            alerts.ALERTMANAGER_TEMPLATED,
            CLASSIC,
            f"Alertmanager: [FIRING:2] HighErrorRate (api production) ({AM_LINK})\n"
            "*Alert:* API 5xx ratio above 5% - `critical`\n"
            "*Description:* 7.2% of requests to api failed in the last 10 minutes.\n"
            "*Labels:* alertname=HighErrorRate, service=api, env=production\n"
            "severity: critical\n"
            "error ratio: 7.2%\n"
            "[Runbook :green_book:] (https://runbooks.example.com/api/high-error-rate) "
            "[Silence :no_bell:] (http://alertmanager.example.com:9093/#/silences/new)",
        ),
        (alerts.GRAFANA_FIRING, CLASSIC, GRAFANA_FIRING),
        (
            alerts.GRAFANA_RESOLVED,
            MODERN,
            GRAFANA_FIRING.replace("FIRING:1", "RESOLVED")
            .replace("**Firing**", "**Resolved**")
            .replace("97.5", "41.2"),
        ),
        (
            alerts.GRAFANA_PANEL_IMAGE,
            MODERN,
            "Grafana: *Firing*: HighCPU, *Labels*: alertname=HighCPU, instance=node-1, "
            "severity=critical",
        ),
        (alerts.SENTRY_ISSUE, MODERN, SENTRY),  # blocks win: the `text` fallback is not repeated
        (
            alerts.WEBHOOK_BLOCKS,
            CLASSIC,
            "disk-check: Disk almost full on db-1\n"
            "*Host:*\ndb-1.prod\n"
            "*Usage:*\n93% of /var/lib/postgresql\n"
            "Grows 2%/hour. Runbook (https://wiki.example.com/runbooks/disk)\n"
            "[Open dashboard] (https://grafana.example.com/d/disk)\n"
            "Paging @db-oncall",
        ),
    ],
    ids=["am-firing", "am-resolved", "am-templated", "grafana", "grafana-resolved",
         "grafana-image", "sentry", "webhook-blocks"],
)  # fmt: skip
def test_each_alert_shape_reads_as_in_the_channel(
    payload: dict[str, Any], shape: dict[str, Any], expected: str
) -> None:
    assert attributed({**payload, **shape, "ts": "1.000001"}, NAMES) == expected


def _rich(*elements: dict[str, Any]) -> dict[str, Any]:
    return {"text": "the fallback", "blocks": [{"type": "rich_text", "elements": list(elements)}]}


def _section(*inline: dict[str, Any]) -> dict[str, Any]:
    return {"type": "rich_text_section", "elements": list(inline)}


def _t(text: str, **style: bool) -> dict[str, Any]:
    return {"type": "text", "text": text, **({"style": style} if style else {})}


@pytest.mark.parametrize(
    ("msg", "expected"),
    [
        (_rich(_section(_t("plain "), _t("bold", bold=True), _t(" and "),
                        _t("code", code=True), _t(" "), _t("both ", italic=True, strike=True))),
         "plain *bold* and `code` ~_both_~"),
        (_rich(_section(_t("steps:\n")),
               {"type": "rich_text_list", "style": "ordered", "elements": [
                   _section(_t("drain")), _section(_t("restart"))]},
               {"type": "rich_text_list", "style": "bullet", "indent": 1, "elements": [
                   _section(_t("db-1"))]},
               {"type": "rich_text_list", "style": "ordered", "offset": 2, "elements": [
                   _section(_t("verify"))]}),
         "steps:\n1. drain\n2. restart\n  - db-1\n3. verify"),
        (_rich({"type": "rich_text_quote", "elements": [_t("it was fine\nyesterday")]}),
         "> it was fine\n> yesterday"),
        (_rich({"type": "rich_text_preformatted", "elements": [
            _t("$ df -h\n/dev/sda1 93%", code=True)]}),
         "```\n$ df -h\n/dev/sda1 93%\n```"),
        (_rich(_section({"type": "link", "url": "https://status.example.com", "text": "status"},
                        _t(" and "), {"type": "link", "url": "https://x.example.com"})),
         "status (https://status.example.com) and https://x.example.com"),
        (_rich(_section({"type": "emoji", "name": "fire", "unicode": "1f525"},
                        {"type": "emoji", "name": "partyparrot"},
                        {"type": "emoji", "name": "flag-gb", "unicode": "1f1ec-1f1e7"})),
         "🔥:partyparrot:🇬🇧"),
        (_rich(_section({"type": "user", "user_id": "U2"}, _t(" "),
                        {"type": "user", "user_id": "U9"}, _t(" in "),
                        {"type": "channel", "channel_id": "C1"}, _t(" "),
                        {"type": "usergroup", "usergroup_id": "S1"}, _t(" "),
                        {"type": "broadcast", "range": "here"}, _t(" "),
                        {"type": "color", "value": "#ff0000"}, _t(" "),
                        {"type": "team", "team_id": "T1"})),
         "@Bob Smith @U9 in #incidents @db-oncall @here #ff0000 T1"),
        (_rich(_section({"type": "date", "timestamp": 1733221234, "format": "{date_short}",
                         "fallback": "Dec 3, 2024"}, _t(" / "),
                        {"type": "date", "timestamp": 1733221234, "format": "{time}"})),
         "Dec 3, 2024 / 2024-12-03 10:20 UTC"),
        (_rich(_section({"type": "canvas_mention", "text": "Q4 plan"},
                        {"type": "rocket_ship"})),
         "Q4 plan"),  # inline kinds newer than the renderer: their text, or nothing
    ],
    ids=["styles", "lists", "quote", "preformatted", "links", "emoji", "mentions", "dates",
         "unknown"],
)  # fmt: skip
def test_rich_text_reads_as_in_the_channel(msg: dict[str, Any], expected: str) -> None:
    assert message_text(msg, NAMES) == expected


@pytest.mark.parametrize(
    ("mrkdwn", "expected"),
    [
        ("<@U1> look", "@alice look"),
        ("<@U1|old-name> look", "@alice look"),  # the directory's name is the current one
        ("<@U9|carol> and <@U8>", "@carol and @U8"),  # unknown: the label, else the id
        ("in <#C1>, <#C2|general> and <#C3>", "in #incidents, #general and #C3"),
        ("<!subteam^S1|@db-oncall> <!subteam^S2|@web> <!subteam^S3>", "@db-oncall @web @S3"),
        ("<!here> <!channel> <!everyone> <!here|here>", "@here @channel @everyone @here"),
        ("<!date^1392734382^{date_short}|Feb 18, 2014>", "Feb 18, 2014"),
        ("see <https://grafana.example.com/d/1|the dashboard>",
         "see the dashboard (https://grafana.example.com/d/1)"),
        ("<https://example.com/a?b=1&amp;c=2>", "https://example.com/a?b=1&c=2"),
        ("<https://example.com|example.com> <mailto:ops@example.com|ops@example.com>",
         "https://example.com ops@example.com"),
        ("5 &lt; 7 &amp;&amp; 7 &gt; 5", "5 < 7 && 7 > 5"),
        ("a <b without a close", "a <b without a close"),
    ],
)  # fmt: skip
def test_every_mention_and_link_form_reads_plainly(mrkdwn: str, expected: str) -> None:
    assert readable(mrkdwn, NAMES) == expected


@pytest.mark.parametrize(
    ("msg", "expected"),
    [
        ({"user": "U1", "text": "hi"}, "alice"),
        ({"user": "U9", "text": "hi"}, "U9"),  # no name known (Slack refused): the id
        ({**CLASSIC, "username": "Alertmanager"}, "Alertmanager"),
        ({**MODERN, "username": "Deploy bot"}, "Deploy bot"),  # posted under another name
        (MODERN, "Sentry"),
        ({"subtype": "bot_message", "bot_id": "BHOOK"}, "Hooky"),  # bots.info's name
        ({"subtype": "bot_message", "bot_id": "BNONE"}, "BNONE"),
        ({"bot_id": "BX", "user": "U2", "bot_profile": "garbage"}, "Bob Smith"),
        ({"text": "orphan"}, "someone"),
    ],
)
def test_the_poster_is_named_as_slack_shows_them(msg: dict[str, Any], expected: str) -> None:
    assert poster(msg, NAMES) == expected


def test_text_is_read_only_where_the_blocks_give_nothing() -> None:
    section = {"type": "section", "text": {"type": "mrkdwn", "text": "from the blocks"}}
    assert message_text({"text": "fallback", "blocks": [section]}, NAMES) == "from the blocks"
    assert message_text({"text": "fallback", "blocks": [{"type": "divider"}]}, NAMES) == "fallback"
    both = {"text": "text <@U1>", "attachments": [{"title": "attached"}]}
    assert message_text(both, NAMES) == "text @alice\nattached"  # Slack shows both
    assert message_text({"attachments": [{"fallback": "only this", "color": "good"}]}, NAMES) == (
        "only this"
    )
    assert attributed({"user": "U1", "text": ""}, NAMES) == "alice: (no text)"


def test_a_leading_mention_of_the_app_is_left_out() -> None:
    text = "<@UBOT> what is <@UBOT>?"
    msg = {"user": "U1", "text": text, "blocks": _rich(
        _section({"type": "user", "user_id": "UBOT"}, _t(" what is "),
                 {"type": "user", "user_id": "UBOT"}, _t("?")))["blocks"]}  # fmt: skip
    names = {**NAMES, "UBOT": "subs"}
    assert attributed(msg, names, addressed_to="UBOT") == "alice: what is @subs?"
    assert attributed({"user": "U1", "text": text}, names, addressed_to="UBOT") == (
        "alice: what is @subs?"
    )
    assert message_text(msg, names) == "@subs what is @subs?"  # not addressed: kept


def test_wanted_ids_are_the_ones_the_rendering_looks_up() -> None:
    thread = [
        {"user": "U1", "text": "<@U2> see <#C1|incidents>"},
        {**CLASSIC, "username": "Alertmanager", "text": "<!subteam^S1>"},
        {"subtype": "bot_message", "bot_id": "BHOOK", "text": "nameless"},
        {"user": "U3", "blocks": [{"type": "rich_text", "elements": [
            _section({"type": "user", "user_id": "U4"})]}]},
    ]  # fmt: skip
    assert wanted_ids(thread) == {"U1", "U2", "C1", "S1", "BHOOK", "U3", "U4"}


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=20,
)
KEYS = ["text", "blocks", "attachments", "user", "bot_id", "username", "bot_profile", "subtype"]
TYPES = st.sampled_from(
    [
        "section",
        "rich_text",
        "rich_text_section",
        "rich_text_list",
        "rich_text_quote",
        "rich_text_preformatted",
        "context",
        "actions",
        "header",
        "button",
        "text",
        "user",
        "link",
        "emoji",
        "date",
        "image",
        "mrkdwn",
        "plain_text",
    ]
)
NODE = st.recursive(
    JSON,
    lambda inner: (
        st.fixed_dictionaries(
            {"type": TYPES},
            optional={k: inner for k in ("elements", "text", "fields", "accessory", "style")},
        )
        | st.lists(inner, max_size=4)
    ),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(KEYS), NODE))
def test_any_message_shape_renders_without_raising(msg: dict[str, Any]) -> None:
    assert isinstance(attributed(msg, NAMES, addressed_to="UBOT"), str)
    assert isinstance(wanted_ids([msg]), set)
