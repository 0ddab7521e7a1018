"""An agent's Slack app manifest (SPEC §14): exactly the scopes and events the bot uses.

What the bot calls and why each grant is there:
- `chat:write`: chat.postMessage / chat.update / chat.postEphemeral, the native
  chat.startStream / appendStream / stopStream, and assistant.threads.setStatus (its scope is
  `chat:write`), so no `assistant:write`.
- `reactions:write`: where Slack refuses a thread status, the working indicator is a reaction
  on the triggering message (reactions.add / reactions.remove).
- `users:read`: the names of the people and apps in a thread (users.info / bots.info), so the
  model reads `Name: text`; without it the ids stand in.
- `files:read` and `files:write` when the agent reads files (`files = true`, the default):
  the files on a thread's messages are downloaded with the bot token (`url_private_download`),
  and the images the agent's tools make are uploaded into the thread (`files_upload_v2`).
- channels: `app_mention` with `app_mentions:read`, plus `channels:history` /
  `groups:history` for conversations.replies in public / private channels.
- channel messages (`message.channels` / `message.groups`, same history scopes) when the app
  follows up in threads it answered (`follow`, answering in channels) or watches alert
  channels (`watch`): neither arrives as a mention. A mention then arrives twice (as
  `app_mention` and as `message`); the bot answers it once.
- DMs (`message.im`): `im:history`, which also covers conversations.replies in a DM thread.
- `commands` only when the agent declares slash commands, with `channels:history` /
  `groups:history` (if not there already): a bot resuming a command's turn after a crash looks
  for the root message it may have posted (conversations.history).
- `usergroups:read` only when the agent's `approvers` name a user group (`S…`): who may answer
  a prompt is checked against the group's members (usergroups.users.list).
Socket Mode's `connections:write` belongs to the app-level token, not the bot, so it is not here.

`to_yaml` writes JSON: YAML 1.2 is a superset of JSON, so the text is a valid YAML manifest
and any JSON parser reads it back; no YAML library is needed.
"""

from __future__ import annotations

import json
import re
from typing import Any

from engine.config import AgentDecl

__all__ = ["events_path", "manifest", "to_yaml"]

# Outside YAML's printable set (YAML 1.2 §5.1) but left raw by json.dumps(ensure_ascii=False).
_NON_PRINTABLE = re.compile("[\x7f-\x84\x86-\x9f\ufffe\uffff]")


def events_path(agent_id: str) -> str:
    """Where `subs serve` takes this agent's events, slash commands and interactivity."""
    return f"/slack/{agent_id}/events"


def manifest(agent: AgentDecl, *, socket_mode: bool, request_url: str | None) -> dict[str, Any]:
    """The manifest for `agent`; `request_url` is required without Socket Mode, unused with it."""
    slack = agent.slack
    if slack is None:
        raise ValueError(f"agent {agent.id!r} has no slack block")
    if not socket_mode and not request_url:
        raise ValueError("request_url is required when not in Socket Mode")
    url = {} if socket_mode else {"request_url": request_url}
    dm = slack.answers in ("dm", "both")
    channels = slack.answers in ("channels", "both")

    scopes = ["chat:write", "reactions:write", "users:read"]
    if slack.files:
        scopes += ["files:read", "files:write"]
    events: list[str] = []
    if channels:
        scopes += ["app_mentions:read", "channels:history", "groups:history"]
        events.append("app_mention")
    if dm:
        scopes.append("im:history")
        events.append("message.im")
    if slack.watch or (channels and slack.follow):
        scopes += [s for s in ("channels:history", "groups:history") if s not in scopes]
        events += ["message.channels", "message.groups"]
    if slack.commands:
        scopes.append("commands")
        scopes += [s for s in ("channels:history", "groups:history") if s not in scopes]
    if any(a.startswith("S") for a in agent.approvers):
        scopes.append("usergroups:read")

    display: dict[str, Any] = {"name": slack.name}
    if slack.description:
        display["description"] = slack.description
    features: dict[str, Any] = {
        "app_home": {
            "home_tab_enabled": False,
            "messages_tab_enabled": dm,
            "messages_tab_read_only_enabled": False,
        },
        "bot_user": {"display_name": slack.name, "always_online": True},
    }
    if slack.commands:
        features["slash_commands"] = [
            {
                "command": command,
                **({} if socket_mode else {"url": request_url}),
                "description": slack.description or f"Ask {slack.name}",
                "usage_hint": "[request]",
                "should_escape": False,
            }
            for command in slack.commands
        ]
    return {
        "display_information": display,
        "features": features,
        "oauth_config": {"scopes": {"bot": scopes}},
        "settings": {
            "event_subscriptions": {**url, "bot_events": events},
            "interactivity": {"is_enabled": True, **url},  # approval buttons
            "org_deploy_enabled": False,
            "socket_mode_enabled": socket_mode,
            "token_rotation_enabled": False,
        },
    }


def to_yaml(d: dict[str, Any]) -> str:
    """`d` as YAML text (JSON, indented), ending in a newline."""
    text = json.dumps(d, indent=2, ensure_ascii=False)
    return _NON_PRINTABLE.sub(lambda m: f"\\u{ord(m.group()):04x}", text) + "\n"
