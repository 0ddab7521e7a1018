"""What monitoring integrations post into Slack, in their own shapes, as Slack keeps them.

Each payload is what the integration sends (`chat.postMessage` or its incoming webhook),
with text as Slack stores it (`&`, `<`, `>` escaped as entities outside `<…>` forms). Post one
with `FakeSlack.post_as_integration(app, channel, payload)`; `app` decides whether it arrives
as `subtype: bot_message` (an incoming webhook or classic app) or as a modern app's message
(`bot_id`, `bot_profile`, no subtype). Sources are named next to each payload; their
summaries are in notes/oncall-facts.md §1.
"""

from __future__ import annotations

from typing import Any

AM_URL = "http://alertmanager.example.com:9093"
GRAFANA_URL = "https://grafana.example.com"
SENTRY_URL = "https://acme.sentry.io"

# Alertmanager's Slack notifier with its default templates (prometheus/alertmanager
# notify/slack/types.go and slack.go: one attachment; template/default.tmpl: title
# `[FIRING:<n>] <group labels> (<other common labels>)`, title_link `<ExternalURL>/#/alerts
# ?receiver=<receiver>`, fallback `<title> | <title_link>`; config/notifiers.go: username
# "Alertmanager", color danger when firing, good when resolved; text, pretext, footer and
# callback_id always sent, empty by default).
_AM_FIRING_TITLE = "[FIRING:2] HighErrorRate (api production)"
_AM_LINK = f"{AM_URL}/#/alerts?receiver=oncall-slack"
ALERTMANAGER_FIRING: dict[str, Any] = {
    "username": "Alertmanager",
    "text": "",
    "attachments": [
        {
            "title": _AM_FIRING_TITLE,
            "title_link": _AM_LINK,
            "pretext": "",
            "text": "",
            "fallback": f"{_AM_FIRING_TITLE} | {_AM_LINK}",
            "callback_id": "",
            "footer": "",
            "color": "danger",
            "mrkdwn_in": ["fallback", "pretext", "text"],
        }
    ],
}
# The same group once resolved (`send_resolved = true`; the count is shown only when firing).
ALERTMANAGER_RESOLVED: dict[str, Any] = {
    "username": "Alertmanager",
    "text": "",
    "attachments": [
        {
            **ALERTMANAGER_FIRING["attachments"][0],
            "title": "[RESOLVED] HighErrorRate (api production)",
            "fallback": f"[RESOLVED] HighErrorRate (api production) | {_AM_LINK}",
            "color": "good",
        }
    ],
}
# Alertmanager with a templated `text`, `fields` and runbook/silence buttons, the common
# custom pattern (ministryofjustice/cloud-platform-terraform-monitoring
# templates/alertmanager_receivers.tpl: `actions` of `type: button` with a url).
ALERTMANAGER_TEMPLATED: dict[str, Any] = {
    "username": "Alertmanager",
    "text": "",
    "attachments": [
        {
            "title": _AM_FIRING_TITLE,
            "title_link": _AM_LINK,
            "pretext": "",
            "text": (
                "*Alert:* API 5xx ratio above 5% - `critical`\n"
                "*Description:* 7.2% of requests to api failed in the last 10 minutes.\n"
                "*Labels:* alertname=HighErrorRate, service=api, env=production"
            ),
            "fallback": f"{_AM_FIRING_TITLE} | {_AM_LINK}",
            "callback_id": "",
            "footer": "",
            "color": "danger",
            "fields": [
                {"title": "severity", "value": "critical", "short": True},
                {"title": "error ratio", "value": "7.2%", "short": True},
            ],
            "actions": [
                {
                    "type": "button",
                    "text": "Runbook :green_book:",
                    "url": "https://runbooks.example.com/api/high-error-rate",
                },
                {
                    "type": "button",
                    "text": "Silence :no_bell:",
                    "url": f"{AM_URL}/#/silences/new",
                },
            ],
            "mrkdwn_in": ["fallback", "pretext", "text"],
        }
    ],
}

# Grafana alerting's Slack contact point (grafana/alerting receivers/slack/v1/slack.go
# createSlackMessage: one attachment with color, title, fallback = title, text, footer,
# footer_icon, ts, title_link; no top-level text; templates/default_template.go: the title
# `[FIRING:<n>] …`, the `default.message` text with **Firing** / **Resolved** sections,
# colors #D63232 / #36a64f, footer `Grafana v<version>`).
_GRAFANA_TEXT = """**Firing**

Value: A=97.5, C=1
Labels:
 - alertname = HighCPU
 - grafana_folder = Infra
 - instance = node-1
 - severity = critical
Annotations:
 - summary = CPU above 95% for 5 minutes
Source: https://grafana.example.com/alerting/grafana/ddq2k1/view?orgId=1
Silence: https://grafana.example.com/alerting/silence/new?alertmanager=grafana&amp;matcher=alertname%3DHighCPU
Dashboard: https://grafana.example.com/d/node-exporter?orgId=1
Panel: https://grafana.example.com/d/node-exporter?orgId=1&amp;viewPanel=3
"""
GRAFANA_FIRING: dict[str, Any] = {
    "username": "Grafana",
    "attachments": [
        {
            "color": "#D63232",
            "title": "[FIRING:1] HighCPU Infra (node-1 critical)",
            "title_link": f"{GRAFANA_URL}/alerting/grafana/ddq2k1/view?orgId=1",
            "fallback": "[FIRING:1] HighCPU Infra (node-1 critical)",
            "text": _GRAFANA_TEXT,
            "footer": "Grafana v11.3.0",
            "footer_icon": "https://grafana.com/static/assets/img/fav32.png",
            "ts": 1733221234,
        }
    ],
}
GRAFANA_RESOLVED: dict[str, Any] = {
    "username": "Grafana",
    "attachments": [
        {
            **GRAFANA_FIRING["attachments"][0],
            "color": "#36a64f",
            "title": "[RESOLVED] HighCPU Infra (node-1 critical)",
            "fallback": "[RESOLVED] HighCPU Infra (node-1 critical)",
            "text": _GRAFANA_TEXT.replace("**Firing**", "**Resolved**").replace("97.5", "41.2"),
        }
    ],
}
# With a bot token Grafana uploads each panel image as a reply in the alert's thread
# (slack.go: files.getUploadURLExternal + completeUploadExternal with thread_ts; its
# initialCommentForImage reads `*Firing*: <alertname>, *Labels*: k=v, …`). The message a
# thread shows for it: the comment as text, the file in `files` (oncall-facts §2.2 file
# object); `upload: true` as Slack marks an app's upload (unverified).
GRAFANA_PANEL_IMAGE: dict[str, Any] = {
    "username": "Grafana",
    "text": "*Firing*: HighCPU, *Labels*: alertname=HighCPU, instance=node-1, severity=critical",
    "upload": True,
    "files": [
        {
            "id": "F0GRAFANA1",
            "name": "panel-3.png",
            "title": "panel-3.png",
            "mimetype": "image/png",
            "filetype": "png",
            "pretty_type": "PNG",
            "size": 48213,
            "mode": "hosted",
            "is_external": False,
            "url_private": "https://files.slack.com/files-pri/T0-F0GRAFANA1/panel-3.png",
            "url_private_download": (
                "https://files.slack.com/files-pri/T0-F0GRAFANA1/download/panel-3.png"
            ),
        }
    ],
}

# Sentry's issue alert (getsentry/sentry src/sentry/integrations/slack/message_builder/
# issues.py `build`, base/block.py `_build_blocks`): Block Kit with a top-level `text`
# fallback `[<project>] <title>`; blocks: the title section (level emoji + `<link|*title*>`,
# its block_id the JSON `{"issue": …, "rule": …}`), the culprit as context, the error text
# quoted as code, the tags section (`key: \`value\``), a context line (events, users, state,
# first seen), Resolve/Archive buttons and an assignee select, the footer context
# (Project / Alert / Short ID), a divider.
SENTRY_ISSUE: dict[str, Any] = {
    "text": "[backend] ZeroDivisionError: division by zero",
    "blocks": [
        {
            "type": "section",
            "block_id": '{"issue":4242,"rule":7}',
            "text": {
                "type": "mrkdwn",
                "text": (
                    f":red_circle: <{SENTRY_URL}/issues/4242/?referrer=slack&amp;alert_rule_id=7"
                    "|*ZeroDivisionError: division by zero*>"
                ),
            },
        },
        {
            "type": "context",
            "elements": [{"type": "mrkdwn", "text": "billing.invoice in compute_total"}],
        },
        {
            "type": "section",
            "text": {"type": "mrkdwn", "text": "```ZeroDivisionError: division by zero```"},
        },
        {
            "type": "section",
            "text": {
                "type": "mrkdwn",
                "text": "environment: `production`\nlevel: `error`\nrelease: `backend@2.14.0`",
            },
        },
        {
            "type": "context",
            "elements": [
                {
                    "type": "mrkdwn",
                    "text": "Events: *12*   Users Affected: *3*   State: *New*   First Seen: *5m*",
                }
            ],
        },
        {
            "type": "actions",
            "elements": [
                {
                    "type": "button",
                    "action_id": "resolve_dialog",
                    "text": {"type": "plain_text", "text": "Resolve"},
                    "value": "resolve_dialog",
                },
                {
                    "type": "button",
                    "action_id": "archive_dialog",
                    "text": {"type": "plain_text", "text": "Archive"},
                    "value": "archive_dialog",
                },
                {
                    "type": "external_select",
                    "action_id": "assign",
                    "placeholder": {"type": "plain_text", "text": "Select Assignee..."},
                },
            ],
        },
        {
            "type": "context",
            "elements": [
                {
                    "type": "mrkdwn",
                    "text": (
                        f"Project: <{SENTRY_URL}/projects/backend/|backend>    "
                        "Alert: Billing errors    Short ID: BACKEND-1X"
                    ),
                }
            ],
        },
        {"type": "divider"},
    ],
}

# An incoming webhook posting Block Kit only, no `text` (api.slack.com/messaging/webhooks:
# a webhook takes the same `blocks` as chat.postMessage; python-slack-sdk issue #229: its
# posts are `bot_message`s without a user). A disk-space check paging the on-call group.
WEBHOOK_BLOCKS: dict[str, Any] = {
    "username": "disk-check",
    "text": "",
    "blocks": [
        {"type": "header", "text": {"type": "plain_text", "text": "Disk almost full on db-1"}},
        {
            "type": "section",
            "fields": [
                {"type": "mrkdwn", "text": "*Host:*\ndb-1.prod"},
                {"type": "mrkdwn", "text": "*Usage:*\n93% of /var/lib/postgresql"},
            ],
        },
        {
            "type": "section",
            "text": {
                "type": "mrkdwn",
                "text": "Grows 2%/hour. <https://wiki.example.com/runbooks/disk|Runbook>",
            },
            "accessory": {
                "type": "button",
                "text": {"type": "plain_text", "text": "Open dashboard"},
                "url": "https://grafana.example.com/d/disk",
            },
        },
        {
            "type": "context",
            "elements": [
                {"type": "mrkdwn", "text": "Paging <!subteam^S0ONCALL|@db-oncall>"},
                {"type": "image", "image_url": "https://example.com/d.png", "alt_text": "disk"},
            ],
        },
    ],
}
