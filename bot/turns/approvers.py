"""Who may answer an interrupt's prompt in Slack (the engine keeps who started the turn).

In order, the first that names anyone: the worker's own list for this interrupt (its
payload's `metadata.approvers`, Slack user and user-group ids), the agent's `approvers`
(`[agent.<id>]`), then the person whose Slack message started the turn (the interrupt's
`by.subject`, recorded by the engine). Nobody otherwise: a turn started over the API with
no approvers configured is answered over the API. Pure: groups are resolved by the caller.
"""

from __future__ import annotations

from typing import Any

__all__ = ["approvers_of", "named"]


def approvers_of(interrupt: dict[str, Any], configured: tuple[str, ...]) -> list[str]:
    """Slack ids (users `U…`/`W…`, groups `S…`) that may answer `interrupt`."""
    payload = interrupt.get("payload")
    metadata = payload.get("metadata") if isinstance(payload, dict) else None
    listed = metadata.get("approvers") if isinstance(metadata, dict) else None
    if isinstance(listed, list):
        ids = [i for i in listed if isinstance(i, str) and i[:1] in ("U", "W", "S")]
        if ids:
            return ids
    if configured:
        return list(configured)
    subject = (interrupt.get("by") or {}).get("subject") or {}
    if subject.get("issuer") == "slack" and isinstance(subject.get("id"), str):
        return [subject["id"]]
    return []


def named(ids: list[str]) -> str:
    """`<@U1>, <!subteam^S1> or <@U2>`: Slack shows each as the person's or group's name."""
    shown = [f"<!subteam^{i}>" if i.startswith("S") else f"<@{i}>" for i in ids]
    if len(shown) <= 1:
        return "".join(shown)
    return ", ".join(shown[:-1]) + " or " + shown[-1]
