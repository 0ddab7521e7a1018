"""Alertmanager's webhook notifications (payload version 4), as its webhook notifier sends
them to `POST /api/hooks/alertmanager`.

The shape is Alertmanager's documented one: prometheus.io/docs/alerting/latest/configuration/
#webhook_config ("The Alertmanager will send HTTP POST requests in the following JSON format":
version "4", groupKey, truncatedAlerts, status, receiver, groupLabels, commonLabels,
commonAnnotations, externalURL, alerts[] of status, labels, annotations, startsAt, endsAt,
generatorURL, fingerprint); in the source, prometheus/alertmanager notify/webhook/webhook.go
(`Message`, version "4") over template/template.go (`Data`, `Alert`). A group key reads as
Alertmanager writes one: the route's matchers, then the group's labels.
"""

from __future__ import annotations

import hashlib
from typing import Any

EXTERNAL_URL = "http://alertmanager.example:9093"
ENDS_AT_UNSET = "0001-01-01T00:00:00Z"  # a firing alert's endsAt, as Go's zero time


def alert(
    name: str, instance: str, *, status: str = "firing", severity: str = "critical"
) -> dict[str, Any]:
    """One alert of a group."""
    return {
        "status": status,
        "labels": {
            "alertname": name,
            "instance": instance,
            "job": "node",
            "severity": severity,
        },
        "annotations": {
            "summary": f"{name} on {instance}",
            "runbook_url": f"https://runbooks.example/{name.lower()}",
        },
        "startsAt": "2026-12-06T02:14:00.000Z",
        "endsAt": ENDS_AT_UNSET if status == "firing" else "2026-12-06T02:40:00.000Z",
        "generatorURL": f"http://prometheus.example:9090/graph?g0.expr=up%7Binstance%3D%22{instance}%22%7D",
        "fingerprint": hashlib.sha256(f"{name} {instance}".encode()).hexdigest()[:16],
    }


def notification(name: str, alerts: list[dict[str, Any]]) -> dict[str, Any]:
    """A notification of the group `alertname=<name>` with these alerts."""
    firing = any(a["status"] == "firing" for a in alerts)
    common = {
        k: v for k, v in alerts[0]["labels"].items() if all(a["labels"].get(k) == v for a in alerts)
    }
    return {
        "version": "4",
        "groupKey": f'{{}}/{{severity="critical"}}:{{alertname="{name}"}}',
        "truncatedAlerts": 0,
        "status": "firing" if firing else "resolved",
        "receiver": "subs-triage",
        "groupLabels": {"alertname": name},
        "commonLabels": common,
        "commonAnnotations": {},
        "externalURL": EXTERNAL_URL,
        "alerts": alerts,
    }
