"""Who is who: auth.test (the token's own workspace and bot), users.info,
usergroups.users.list and bots.info."""

from __future__ import annotations

from typing import Any

from tests.fakes.slack.model import Ctx
from tests.fakes.slack.rules import SlackError


class UserMethods:
    """The methods of `FakeSlack` that say who a token, a user, a group or a bot is (mixed into
    it)."""

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
