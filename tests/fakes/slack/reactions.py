"""The reactions.* methods: the app adds and removes its own reactions on a message."""

from __future__ import annotations

import re
from typing import Any

from tests.fakes.slack.model import Ctx, Message
from tests.fakes.slack.rules import SlackError


class ReactionMethods:
    """The reactions.* methods of `FakeSlack` (mixed into it)."""

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
