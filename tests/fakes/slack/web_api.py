"""The Web API methods the fake serves, each a handler of one call's context."""

from __future__ import annotations

import json
import re
import time
import uuid
from base64 import b64decode, b64encode
from collections.abc import Mapping
from typing import Any

from tests.fakes.slack.checks import check_blocks, check_chunks, check_metadata, flag, required
from tests.fakes.slack.model import Channel, Ctx, Ephemeral, Message, Status, Version
from tests.fakes.slack.rules import (
    LOADING_MESSAGES_MAX,
    MARKDOWN_MAX,
    POST_TEXT_MAX,
    UPDATE_TEXT_MAX,
    SlackError,
)


class WebApiMethods:
    """The methods of `FakeSlack` that answer Web API calls (mixed into it)."""

    # --- helpers shared by methods -----------------------------------------------------

    def _channel(self, ctx: Ctx, ref: Any, *, member: bool = True) -> Channel:
        """Resolves an id, a #name or a user id (their DM); checks the bot may use it."""
        assert ctx.team is not None
        ref = str(ref or "")
        channel = self.channels.get(ref)
        if channel is None:
            for ch in self.channels.values():
                if ch.team == ctx.team.id and (
                    (not ch.is_im and ch.name == ref.lstrip("#")) or (ch.is_im and ch.user == ref)
                ):
                    channel = ch
        if channel is None or channel.team != ctx.team.id:
            raise SlackError("channel_not_found")
        if member and ctx.team.bot_user not in channel.members:
            raise SlackError("not_in_channel")
        return channel

    def _find(self, channel: Channel, ts: Any, error: str = "message_not_found") -> Message:
        msg = self._messages[channel.id].get(str(ts or ""))
        if msg is None or msg.deleted:
            raise SlackError(error)
        return msg

    def _own(self, ctx: Ctx, msg: Message) -> bool:
        assert ctx.team is not None
        return msg.app_id == self.app_id and msg.bot_id == ctx.team.bot_id

    def _stream_state(self, msg: Message) -> str | None:
        limit = self.stream_lifetime * self.time_scale
        if msg.stream == "streaming" and self._now() - msg.stream_started > limit:
            msg.stream = "expired"
        return msg.stream

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

    def _bot_message(self, ctx: Ctx, channel: Channel, thread_ts: Any) -> Message:
        assert ctx.team is not None
        return Message(
            channel=channel.id,
            team=channel.team,
            ts=self._next_ts(),
            user=ctx.team.bot_user,
            bot_id=ctx.team.bot_id,
            app_id=self.app_id,
            thread_ts=str(thread_ts) if thread_ts else None,
        )

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

    def _content(self, args: Mapping[str, Any], *, text_max: int, truncate: bool) -> dict[str, Any]:
        """text / markdown_text / blocks / attachments of a post or an update, checked."""
        text, md = args.get("text"), args.get("markdown_text")
        blocks, attachments = args.get("blocks"), args.get("attachments")
        if md is not None and (text or blocks):
            raise SlackError("markdown_text_conflict")
        if md is not None:
            if len(str(md)) > MARKDOWN_MAX:
                raise SlackError("msg_too_long")
            return {"text": str(md), "markdown": True, "blocks": []}
        if not text and not blocks and not attachments:
            raise SlackError("no_text")
        out: dict[str, Any] = {}
        if blocks is not None:
            out["blocks"] = check_blocks(blocks)
        if attachments is not None:
            out["attachments"] = attachments
        if text is not None:
            text = str(text)
            if len(text) > text_max:
                if not truncate:
                    raise SlackError("msg_too_long")
                text = text[:text_max]
                out["warning"] = "message_truncated"
            out["text"], out["markdown"] = text, False
        return out

    @staticmethod
    def _apply(msg: Message, content: Mapping[str, Any]) -> dict[str, Any]:
        for name in ("text", "markdown", "blocks", "attachments"):
            if name in content:
                setattr(msg, name, content[name])
        if "warning" in content:
            return {
                "warning": content["warning"],
                "response_metadata": {"warnings": [content["warning"]]},
            }
        return {}

    # --- methods -----------------------------------------------------------------------

    def _auth_test(self, ctx: Ctx) -> dict[str, Any]:
        team = ctx.team
        assert team is not None
        return {
            "url": f"https://{team.domain}.slack.com/",
            "team": team.name,
            "user": self.users[team.bot_user].name,
            "team_id": team.id,
            "user_id": team.bot_user,
            "bot_id": team.bot_id,
            "is_enterprise_install": False,
        }

    def _post_message(self, ctx: Ctx) -> dict[str, Any]:
        channel = self._channel(ctx, ctx.args.get("channel"))
        content = self._content(ctx.args, text_max=POST_TEXT_MAX, truncate=True)
        metadata = check_metadata(ctx.args["metadata"]) if "metadata" in ctx.args else None
        msg = self._bot_message(ctx, channel, ctx.args.get("thread_ts"))
        extra = self._apply(msg, content)
        msg.metadata = metadata
        self._store(msg)
        return {"channel": channel.id, "ts": msg.ts, "message": self.render(msg), **extra}

    def _update(self, ctx: Ctx) -> dict[str, Any]:
        channel = self._channel(ctx, ctx.args.get("channel"))
        msg = self._find(channel, ctx.args.get("ts"))
        if not self._own(ctx, msg):
            raise SlackError("cant_update_message")
        if self._stream_state(msg) == "streaming":
            raise SlackError("streaming_state_conflict")
        content = self._content(ctx.args, text_max=UPDATE_TEXT_MAX, truncate=False)
        metadata = check_metadata(ctx.args["metadata"]) if "metadata" in ctx.args else msg.metadata
        self._apply(msg, content)
        msg.metadata = metadata  # kept unless sent; {} removes it
        msg.edited_ts = self._next_ts()
        self._touch(msg)
        return {"channel": channel.id, "ts": msg.ts, "text": msg.text, "message": self.render(msg)}

    def _delete(self, ctx: Ctx) -> dict[str, Any]:
        channel = self._channel(ctx, ctx.args.get("channel"))
        msg = self._find(channel, ctx.args.get("ts"))
        if not self._own(ctx, msg):
            raise SlackError("cant_delete_message")
        msg.deleted = True
        return {"channel": channel.id, "ts": msg.ts}

    def _post_ephemeral(self, ctx: Ctx) -> dict[str, Any]:
        channel = self._channel(ctx, ctx.args.get("channel"))
        user = str(ctx.args.get("user") or "")
        if user not in channel.members:
            raise SlackError("user_not_in_channel")
        content = self._content(ctx.args, text_max=POST_TEXT_MAX, truncate=True)
        ts = self._next_ts()
        thread_ts = ctx.args.get("thread_ts")
        self.ephemerals.append(
            Ephemeral(
                channel.id,
                user,
                ts,
                content.get("text", ""),
                content.get("blocks", []),
                str(thread_ts) if thread_ts else None,
            )
        )
        return {"message_ts": ts}

    def _start_stream(self, ctx: Ctx) -> dict[str, Any]:
        channel = self._channel(ctx, ctx.args.get("channel"))
        thread_ts = required(ctx.args, "thread_ts")
        if not channel.is_im:
            if not ctx.args.get("recipient_user_id"):
                raise SlackError("missing_recipient_user_id")
            if not ctx.args.get("recipient_team_id"):
                raise SlackError("missing_recipient_team_id")
        msg = self._bot_message(ctx, channel, thread_ts)
        msg.markdown, msg.stream, msg.stream_started = True, "streaming", self._now()
        self._stream_in(msg, ctx.args)
        self._store(msg)
        return {"channel": channel.id, "ts": msg.ts}

    def _streaming(self, ctx: Ctx) -> tuple[Channel, Message]:
        channel = self._channel(ctx, ctx.args.get("channel"))
        msg = self._find(channel, required(ctx.args, "ts"))
        if msg.app_id != self.app_id:
            raise SlackError("message_not_owned_by_app")
        state = self._stream_state(msg)
        if state == "stopped_by_user":
            raise SlackError("stopped_by_user")
        if state != "streaming":
            raise SlackError("message_not_in_streaming_state")
        return channel, msg

    def _stream_in(self, msg: Message, args: Mapping[str, Any]) -> None:
        """Appends markdown_text and chunks to a streaming message."""
        md = args.get("markdown_text")
        if md is not None and len(str(md)) > MARKDOWN_MAX:
            raise SlackError("msg_too_long")
        chunks = check_chunks(args["chunks"]) if "chunks" in args else []
        if md is not None:
            msg.text += str(md)
        for chunk in chunks:
            if chunk["type"] == "markdown_text":
                msg.text += chunk["text"]
            elif chunk["type"] == "plan_update":
                msg.plan_title = chunk["title"]
            elif chunk["type"] == "task_update":
                msg.tasks[chunk["id"]] = {**msg.tasks.get(chunk["id"], {}), **chunk}
            else:
                msg.blocks = [*msg.blocks, *chunk["blocks"]]

    def _append_stream(self, ctx: Ctx) -> dict[str, Any]:
        channel, msg = self._streaming(ctx)
        if ctx.args.get("markdown_text") is None and not ctx.args.get("chunks"):
            raise SlackError("no_text")
        self._stream_in(msg, ctx.args)
        self._touch(msg)
        return {"channel": channel.id, "ts": msg.ts}

    def _stop_stream(self, ctx: Ctx) -> dict[str, Any]:
        channel, msg = self._streaming(ctx)
        self._stream_in(msg, ctx.args)
        if ctx.args.get("blocks") is not None:
            msg.blocks = [*msg.blocks, *check_blocks(ctx.args["blocks"])]
        if "metadata" in ctx.args:
            msg.metadata = check_metadata(ctx.args["metadata"])
        msg.stream = "stopped"
        self._touch(msg)
        return {"channel": channel.id, "ts": msg.ts, "message": self.render(msg)}

    def _page(
        self,
        messages: list[Message],
        args: Mapping[str, Any],
        default_limit: int,
        parent: Message | None = None,
    ) -> tuple[list[Message], dict[str, Any]]:
        """oldest/latest/inclusive, the parent first, then cursor + limit.

        A cursor is base64 'next_ts:<ts>' of the first message of the next page.
        """
        inclusive = flag(args.get("inclusive"))
        oldest, latest = args.get("oldest"), args.get("latest")
        if oldest:
            messages = [m for m in messages if m.ts > oldest or (inclusive and m.ts == oldest)]
        if latest:
            messages = [m for m in messages if m.ts < latest or (inclusive and m.ts == latest)]
        if parent is not None:
            messages = [parent, *messages]
        cursor = args.get("cursor")
        if cursor:
            try:
                start = b64decode(str(cursor)).decode().removeprefix("next_ts:")
            except ValueError:
                raise SlackError("invalid_cursor") from None
            index = next((i for i, m in enumerate(messages) if m.ts == start), None)
            if index is None:
                raise SlackError("invalid_cursor")
            messages = messages[index:]
        limit = int(args.get("limit") or default_limit)
        page, rest = messages[:limit], messages[limit:]
        next_cursor = b64encode(f"next_ts:{rest[0].ts}".encode()).decode() if rest else ""
        return page, {"has_more": bool(rest), "response_metadata": {"next_cursor": next_cursor}}

    def _replies(self, ctx: Ctx) -> dict[str, Any]:
        channel = self._channel(ctx, ctx.args.get("channel"))
        thread = self.thread(channel.id, required(ctx.args, "ts"))
        if not thread:
            raise SlackError("thread_not_found")
        page, more = self._page(thread[1:], ctx.args, 1000, parent=thread[0])
        with_metadata = flag(ctx.args.get("include_all_metadata"))
        return {"messages": [self.render(m, metadata=with_metadata) for m in page], **more}

    def _history(self, ctx: Ctx) -> dict[str, Any]:
        channel = self._channel(ctx, ctx.args.get("channel"))
        newest_first = list(reversed(self.history(channel.id)))
        page, more = self._page(newest_first, ctx.args, 100)
        with_metadata = flag(ctx.args.get("include_all_metadata"))
        return {"messages": [self.render(m, metadata=with_metadata) for m in page], **more}

    def _info(self, ctx: Ctx) -> dict[str, Any]:
        ch = self._channel(ctx, ctx.args.get("channel"), member=False)
        assert ctx.team is not None
        if ch.is_im:
            body: dict[str, Any] = {
                "id": ch.id,
                "created": ch.created,
                "is_im": True,
                "is_org_shared": False,
                "user": ch.user,
                "is_open": True,
                "context_team_id": ch.team,
            }
        else:
            body = {
                "id": ch.id,
                "name": ch.name,
                "is_channel": True,
                "is_group": False,
                "is_im": False,
                "is_mpim": False,
                "is_private": False,
                "created": ch.created,
                "is_archived": False,
                "is_general": ch.name == "general",
                "name_normalized": ch.name,
                "is_member": ctx.team.bot_user in ch.members,
                "context_team_id": ch.team,
            }
        if flag(ctx.args.get("include_num_members")):
            body["num_members"] = len(ch.members)
        return {"channel": body}

    def _reaction_target(self, ctx: Ctx) -> tuple[Message, str]:
        if not ctx.args.get("channel") or not ctx.args.get("timestamp"):
            raise SlackError("no_item_specified")
        channel = self._channel(ctx, ctx.args.get("channel"))
        name = str(ctx.args.get("name") or "").strip(":")
        if not re.fullmatch(r"[a-z0-9_+\-']+(::skin-tone-[2-6])?", name):
            raise SlackError("invalid_name")
        return self._find(channel, ctx.args["timestamp"]), name

    def _react(self, ctx: Ctx) -> dict[str, Any]:
        assert ctx.team is not None
        msg, name = self._reaction_target(ctx)
        users = msg.reactions.setdefault(name, [])
        if ctx.team.bot_user in users:
            raise SlackError("already_reacted")
        users.append(ctx.team.bot_user)
        return {}

    def _unreact(self, ctx: Ctx) -> dict[str, Any]:
        assert ctx.team is not None
        msg, name = self._reaction_target(ctx)
        users = msg.reactions.get(name, [])
        if ctx.team.bot_user not in users:
            raise SlackError("no_reaction")
        users.remove(ctx.team.bot_user)
        if not users:
            del msg.reactions[name]
        return {}

    def _set_status(self, ctx: Ctx) -> dict[str, Any]:
        channel = self._channel(ctx, ctx.args.get("channel_id"))
        thread_ts = str(ctx.args.get("thread_ts") or "")
        self._find(channel, thread_ts, "invalid_thread_ts")
        if "status" not in ctx.args:  # "" is allowed: it clears the status
            raise SlackError("invalid_arguments")
        loading = ctx.args.get("loading_messages") or []
        if not isinstance(loading, list) or len(loading) > LOADING_MESSAGES_MAX:
            raise SlackError("invalid_arguments")
        status = Status(channel.id, thread_ts, str(ctx.args["status"]), loading, self._now())
        self._statuses.setdefault((channel.id, thread_ts), []).append(status)
        return {}

    def _needs(self, scope: str) -> None:
        """Slack's answer to a token without `scope`: `missing_scope`, naming it."""
        if scope not in self.scopes.split(","):
            raise SlackError("missing_scope", needed=scope, provided=self.scopes)

    def _user_info(self, ctx: Ctx) -> dict[str, Any]:
        self._needs("users:read")  # docs.slack.dev/reference/methods/users.info: scope, errors
        user = self.users.get(str(ctx.args.get("user") or ""))
        if user is None:
            raise SlackError("user_not_found")
        real_name = user.real_name or user.name
        profile: dict[str, Any] = {
            "real_name": real_name,
            "real_name_normalized": real_name,
            "display_name": user.display_name,
            "display_name_normalized": user.display_name,
        }
        if user.bot_id:
            profile["bot_id"] = user.bot_id
        return {
            "user": {
                "id": user.id,
                "team_id": user.team,
                "name": user.name,
                "deleted": False,
                "real_name": real_name,
                "tz": "Europe/London",
                "is_bot": user.is_bot,
                "is_app_user": False,
                "profile": profile,
            }
        }

    def _usergroup_users(self, ctx: Ctx) -> dict[str, Any]:
        """usergroups.users.list: scope `usergroups:read`, `usergroup` required, error
        `no_such_subteam`; answers `{users: [ids]}` (docs.slack.dev/reference/methods/
        usergroups.users.list)."""
        self._needs("usergroups:read")
        group = str(ctx.args.get("usergroup") or "")
        if not group:
            raise SlackError("invalid_arguments")
        members = self.usergroups.get(group)
        if members is None:
            raise SlackError("no_such_subteam")
        return {"users": list(members)}

    def _bot_info(self, ctx: Ctx) -> dict[str, Any]:
        """bots.info (users:read; `bot_not_found`): the shape of @slack/web-api's
        BotsInfoResponse (id, deleted, name, updated, app_id, user_id, icons)."""
        self._needs("users:read")
        assert ctx.team is not None
        bot_id = str(ctx.args.get("bot") or "")
        other = self.integrations.get(bot_id)
        if other is not None:
            name, app_id, user = other.name, other.app_id, other.bot_user
        elif bot_id == ctx.team.bot_id:
            name, app_id, user = self.users[ctx.team.bot_user].name, self.app_id, ctx.team.bot_user
        else:
            raise SlackError("bot_not_found")
        bot: dict[str, Any] = {"id": bot_id, "deleted": False, "name": name, "updated": 0}
        bot |= {"app_id": app_id, "icons": {"image_48": f"https://example.invalid/{bot_id}.png"}}
        return {"bot": bot | ({"user_id": user} if user else {})}

    def _connections_open(self, ctx: Ctx) -> dict[str, Any]:
        ticket = uuid.uuid4().hex
        self._tickets.add(ticket)
        host = self.base.removeprefix("http://")
        return {"url": f"ws://{host}/link/?ticket={ticket}&app_id={self.app_id}"}
