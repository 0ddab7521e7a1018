"""How the fake keeps messages and shows them: each stored with every visible version (a
stream shows one per step), an app's reply clearing its thread's status, and a message
rendered as the Web API and events show it."""

from __future__ import annotations

import json
import time
from typing import Any

from tests.fakes.slack.model import Message, Version


class MessageStore:
    """The methods of `FakeSlack` that store and render messages (mixed into it)."""

    def _store(self, msg: Message) -> None:
        self._messages[msg.channel][msg.ts] = msg
        self._touch(msg)
        if msg.bot_id and msg.bot_id == self.teams[msg.team].bot_id and msg.thread_ts:
            for status in self._statuses.get((msg.channel, msg.thread_ts), []):
                status.cleared = True  # a reply from the app clears the thread status

    def _touch(self, msg: Message) -> None:
        version = Version(
            msg.text,
            json.loads(json.dumps(msg.blocks)),
            [dict(t) for t in msg.tasks.values()],
            time.time(),
        )
        if not msg.versions or msg.versions[-1] != version:
            msg.versions.append(version)

    def _thread(self, channel: str, ts: str) -> list[Message]:
        messages = self._messages[channel]
        root = messages.get(ts)
        if root is not None and root.is_reply and root.thread_ts is not None:
            root = messages.get(root.thread_ts, root)
        if root is None:
            return []
        replies = [m for m in messages.values() if m.thread_ts == root.ts and m is not root]
        return [root, *sorted(replies, key=lambda m: m.ts)]

    def render(self, msg: Message, *, metadata: bool = True) -> dict[str, Any]:
        """A message as the Web API and events show it."""
        out: dict[str, Any] = {"type": "message", **msg.extra}
        if msg.user:  # an incoming webhook's or classic app's post has no user
            out["user"] = msg.user
        out["text"] = msg.text
        other = self.integrations.get(msg.bot_id or "")
        if other is not None:
            out["bot_id"] = msg.bot_id
            if not other.classic:
                out["app_id"] = msg.app_id
                out["bot_profile"] = {
                    "id": msg.bot_id,
                    "app_id": msg.app_id,
                    "name": other.name,
                    "deleted": False,
                    "team_id": other.team,
                }
        elif msg.bot_id:
            team = self.teams[msg.team]
            out["bot_id"] = msg.bot_id
            out["app_id"] = msg.app_id
            out["bot_profile"] = {
                "id": msg.bot_id,
                "app_id": msg.app_id,
                "name": self.users[team.bot_user].name,
                "deleted": False,
                "team_id": team.id,
            }
        elif msg.client_msg_id:
            out["client_msg_id"] = msg.client_msg_id
        out["ts"] = msg.ts
        out["team"] = msg.team
        author = self.users.get(msg.user) if msg.user else None
        if author is not None and author.team != msg.team:
            # A Slack Connect guest: events in shared channels name the poster's own team
            # (`user_team`) and where the message came from (`source_team`), as Slack's
            # Slack Connect event docs describe (docs.slack.dev/apis/slack-connect).
            out["user_team"] = author.team
            out["source_team"] = author.team
        if msg.blocks:
            out["blocks"] = msg.blocks
        if msg.attachments:
            out["attachments"] = msg.attachments
        if msg.edited_ts:
            out["edited"] = {"user": msg.user, "ts": msg.edited_ts}
        replies = self.thread(msg.channel, msg.ts)[1:] if not msg.is_reply else []
        if msg.is_reply and msg.thread_ts is not None:
            out["thread_ts"] = msg.thread_ts
            parent = self._messages[msg.channel].get(msg.thread_ts)
            if parent is not None and parent.user:
                out["parent_user_id"] = parent.user
        elif replies:
            users = list(dict.fromkeys(m.user for m in replies if m.user))
            out.update(
                thread_ts=msg.ts,
                reply_count=len(replies),
                reply_users_count=len(users),
                latest_reply=replies[-1].ts,
                reply_users=users,
                is_locked=False,
                subscribed=False,
            )
        if msg.reactions:
            out["reactions"] = [
                {"name": name, "users": users, "count": len(users)}
                for name, users in msg.reactions.items()
            ]
        if metadata and msg.metadata:
            out["metadata"] = msg.metadata
        return out
