"""The conversations.* methods: a thread's replies and a channel's history (paged by cursor
as Slack pages them) and a channel's info."""

from __future__ import annotations

from base64 import b64decode, b64encode
from collections.abc import Mapping
from typing import Any

from tests.fakes.slack.checks import flag, required
from tests.fakes.slack.model import Ctx, Message
from tests.fakes.slack.rules import SlackError


class ConversationMethods:
    """The conversations.* methods of `FakeSlack` (mixed into it)."""

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
