"""`POST /api/hooks/alertmanager`: Prometheus Alertmanager's webhook (payload version 4)
made a triage turn in Slack, one thread per alert group.

Alertmanager sends the bearer token of its `http_config` (`authorization.credentials`):
a full-access key here, since the turn lands in Slack (engine/api/slack_landing.py). Each
group key (`groupKey`) is one session whose id derives from it, so the group's first
notification posts a root message in `[hooks.alertmanager] channel` and every later one
(a re-fire, a repeat, its resolution) continues that thread. The payload's fields are
Alertmanager's documented ones (prometheus.io/docs/alerting/latest/configuration/
#webhook_config; `notify/webhook/webhook.go` `Message`); fields it adds later are kept
out of the prompt, not refused.
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal

import orjson
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from engine.api.errors import ApiError
from engine.api.parsing import json_body, validate
from engine.api.slack_landing import land_if_slack
from engine.api.state import API, principal_of
from engine.jsonedge import compact_json
from engine.landing import CHANNEL_KEY

MAX_ALERTS_SHOWN = 20  # a storm's prompt names the first alerts and counts the rest


class _Alert(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    status: Literal["firing", "resolved"]
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    startsAt: str = ""  # Alertmanager's names, as it sends them
    endsAt: str = ""
    generatorURL: str = ""
    fingerprint: str = ""


class AlertmanagerBody(BaseModel):
    """Alertmanager's webhook payload, version 4."""

    model_config = ConfigDict(extra="allow")

    version: Literal["4"]
    groupKey: str = Field(min_length=1, max_length=4096)
    truncatedAlerts: int = Field(default=0, ge=0)
    status: Literal["firing", "resolved"]
    receiver: str = ""
    groupLabels: dict[str, str] = Field(default_factory=dict)
    commonLabels: dict[str, str] = Field(default_factory=dict)
    commonAnnotations: dict[str, str] = Field(default_factory=dict)
    externalURL: str = ""
    alerts: list[_Alert] = Field(min_length=1, max_length=10_000)


def group_session_id(agent: str, group_key: str) -> str:
    """The session of one alert group: the same group key, the same session and thread."""
    digest = hashlib.sha256(group_key.encode()).hexdigest()[:32]
    return f"alertmanager:{agent}:{digest}"


def notification_turn_id(agent: str, raw: Any) -> str:
    """The turn a notification starts, named by its content: Alertmanager resends the very
    same notification when it retries one whose answer it did not get (notify/notify.go
    `RetryStage.exec` calls the integration's `Notify` again with the same alerts until it
    succeeds or the context ends; notify/webhook/webhook.go `Notify` builds the `Message`
    from them afresh, so the body is the same), and a retry after a lost 202 must be that
    turn, not a second triage. A re-fire (the group changed: an alert more, a new
    `startsAt`, a resolution) is other content, so another turn in the same thread; a
    repeat of an unchanged group after `repeat_interval` is the same content, answered as
    the turn it already had."""
    canonical = orjson.dumps(raw, option=orjson.OPT_SORT_KEYS)
    return "am_" + hashlib.sha256(agent.encode() + b"\n" + canonical).hexdigest()[:32]


def title_of(body: AlertmanagerBody) -> str:
    """The root message: as Alertmanager's own Slack title reads, `[FIRING:2] <group>`."""
    firing = sum(1 for a in body.alerts if a.status == "firing") + body.truncatedAlerts
    status = f"FIRING:{firing}" if body.status == "firing" else "RESOLVED"
    group = " ".join(body.groupLabels.values()) or body.receiver or "alerts"
    return f"[{status}] {group}"


def prompt_of(body: AlertmanagerBody) -> str:
    """What the agent reads: the group's status, its labels and annotations, then each
    alert (the first `MAX_ALERTS_SHOWN`) with its own labels, annotations and links."""
    lines = [f"Alertmanager: {title_of(body)}: triage this alert group."]
    if body.commonLabels:
        lines.append("Common labels: " + _pairs(body.commonLabels))
    lines += [f"{k}: {v}" for k, v in body.commonAnnotations.items()]
    for n, alert in enumerate(body.alerts[:MAX_ALERTS_SHOWN], 1):
        lines.append(f"Alert {n} ({alert.status}, since {alert.startsAt or '?'}):")
        extra = {k: v for k, v in alert.labels.items() if body.commonLabels.get(k) != v}
        if extra:
            lines.append("  labels: " + _pairs(extra))
        lines += [
            f"  {k}: {v}"
            for k, v in alert.annotations.items()
            if body.commonAnnotations.get(k) != v
        ]
        if alert.generatorURL:
            lines.append(f"  source: {alert.generatorURL}")
    hidden = len(body.alerts) - MAX_ALERTS_SHOWN + body.truncatedAlerts
    if hidden > 0:
        lines.append(f"(and {hidden} more alerts in this group)")
    if body.externalURL:
        lines.append(f"Alertmanager: {body.externalURL}")
    return "\n".join(lines)


def _pairs(labels: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in labels.items())


async def post_alertmanager(request: web.Request) -> web.Response:
    """One notification: a turn in its group's thread (202 with the session, turn and
    thread), or a 4xx naming what was wrong."""
    api = request.app[API]
    hook = api.alertmanager
    if hook is None:
        raise ApiError(
            "no Alertmanager hook here: configure [hooks.alertmanager] agent and channel",
            status=404,
            code="not_found",
        )
    principal = principal_of(request)
    if not principal.full:
        raise ApiError(
            "POST /api/hooks/alertmanager: only a full-access key may send alerts into "
            "Slack (put it in Alertmanager's http_config authorization)",
            status=403,
            code="forbidden",
        )
    raw = await json_body(request)
    body: AlertmanagerBody = validate(AlertmanagerBody, raw)
    text = prompt_of(body)
    payload: dict[str, Any] = {
        "type": "client.append",
        "agent_id": hook.agent,
        "turn_id": notification_turn_id(hook.agent, raw),
        "queue": True,  # a re-fire mid-triage waits for the turn ahead of it
        "messages": [{"role": "user", "content": text}],
        "client": {"forwarded_props": {"alertmanager": {"groupKey": body.groupKey}}},
    }
    identity = {
        **principal.identity(),
        "metadata": {CHANNEL_KEY: hook.channel, "alertmanager_group_key": body.groupKey},
    }
    landed = await land_if_slack(
        api,
        payload,
        session_id=group_session_id(hook.agent, body.groupKey),
        identity=identity,
        full=True,
        title=title_of(body),
    )
    assert landed is not None  # the identity names a channel
    return web.json_response(landed, status=202, dumps=compact_json)
