"""People's and apps' names by Slack id, for the text the model reads.

`users.info` (a person, or an app's bot user) and `bots.info` (an app's bot id, when its post
carries no name of its own): each in the workspace's governor like every Web API call, each
answer kept for `ttl` seconds, so a busy thread costs one call per poster per TTL, not one per
message. Lookups of one id at the same time share one call. When Slack refuses (`missing_scope`
without `users:read`, `user_not_found`, …) the id stands in for the name, and that refusal is
kept as long; when Slack cannot be reached, the id stands in for this turn only. At most
`max_names` answers are kept, the least recently used going first, so a process that runs
for months in a large workspace does not keep every name it ever saw.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from bot.slack.governor import RateGovernor
from bot.slack.webapi import governed, slack_error
from engine.errors import describe

__all__ = ["GROUPS_TTL", "MAX_NAMES", "NAMES_TTL", "Directory", "display_name"]

log = logging.getLogger(__name__)

NAMES_TTL = 600.0  # seconds: a renamed person shows under the new name within ten minutes
GROUPS_TTL = 300.0  # seconds: someone taken out of an approvers' group loses it within five
MAX_NAMES = 10_000  # names kept per app: the posters of a busy workspace's active threads


def display_name(user: Any) -> str | None:
    """What Slack shows for a person: the profile's display name, else the full name, else
    the handle (display names are often left empty)."""
    if not isinstance(user, dict):
        return None
    profile = user.get("profile")
    profile = profile if isinstance(profile, dict) else {}
    for value in (
        profile.get("display_name"),
        profile.get("real_name"),
        user.get("real_name"),
        user.get("name"),
    ):
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None


class Directory:
    """One app's view of its workspaces' names (see the module doc)."""

    def __init__(
        self,
        web: AsyncWebClient,
        governor: RateGovernor,
        *,
        ttl: float = NAMES_TTL,
        clock: Callable[[], float] = time.monotonic,
        max_names: int = MAX_NAMES,
    ) -> None:
        self.web = web
        self.governor = governor
        self.ttl = ttl
        self.clock = clock
        self.max_names = max_names
        self._known: OrderedDict[tuple[str, str], tuple[str | None, float]] = OrderedDict()
        self._asking: dict[tuple[str, str], asyncio.Future[str | None]] = {}
        self._groups: dict[tuple[str, str], tuple[frozenset[str], float]] = {}

    async def members(self, team: str, group: str) -> frozenset[str]:
        """The people of a user group (`usergroups.users.list`, scope `usergroups:read`),
        kept for `GROUPS_TTL`. A refusal counts as nobody (kept as long); Slack not reached
        counts as nobody this time only: an approval is refused rather than guessed."""
        known = self._groups.get((team, group))
        if known is not None and known[1] > self.clock():
            return known[0]
        args = {"usergroup": group}
        try:
            answer = await governed(self.governor, team, self.web, "usergroups.users.list", args)
        except SlackApiError as err:
            if err.response.status_code >= 500:
                log.warning("slack: members of %s unknown (%s)", group, slack_error(err))
                return frozenset()
            log.info("slack: usergroups.users.list %s refused (%s)", group, slack_error(err))
            found: frozenset[str] = frozenset()
        except Exception as err:
            log.warning("slack: members of %s unknown (%s)", group, describe(err))
            return frozenset()
        else:
            users = answer.get("users")
            found = (
                frozenset(u for u in users if isinstance(u, str))
                if isinstance(users, list)
                else frozenset()
            )
        self._groups[(team, group)] = (found, self.clock() + GROUPS_TTL)
        return found

    async def names(self, team: str, ids: Iterable[str]) -> dict[str, str]:
        """The names of those `ids` that are people (`U…`, `W…`) or apps (`B…`) Slack would
        name; ids it refused or that name nothing else are left out."""
        wanted = sorted({i for i in ids if i[:1] in ("U", "W", "B")})
        found = await asyncio.gather(*(self._name(team, i) for i in wanted))
        return {i: name for i, name in zip(wanted, found, strict=True) if name}

    async def _name(self, team: str, ref: str) -> str | None:
        key = (team, ref)
        known = self._known.get(key)
        if known is not None and known[1] > self.clock():
            self._known.move_to_end(key)
            return known[0]
        asking = self._asking.get(key)
        if asking is not None:
            return await asyncio.shield(asking)
        future: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        self._asking[key] = future
        name: str | None = None
        try:
            name = await self._lookup(team, ref)
        except Exception as err:  # Slack away or slow past its 429s: the id, this time
            log.warning("slack: no name for %s (%s); showing the id", ref, describe(err))
        finally:
            del self._asking[key]
            future.set_result(name)  # also when cancelled: those waiting along get the id
        return name

    async def _lookup(self, team: str, ref: str) -> str | None:
        """Slack's answer, kept for the TTL; a refusal is kept as None. Raises when Slack
        could not be asked (not kept: the next turn asks again)."""
        bot = ref[0] == "B"
        method, args = ("bots.info", {"bot": ref}) if bot else ("users.info", {"user": ref})
        try:
            answer = await governed(self.governor, team, self.web, method, args)
        except SlackApiError as err:
            if err.response.status_code >= 500:
                raise  # Slack's trouble, not a refusal: asked again next time
            log.info("slack: %s %s refused (%s); showing the id", method, ref, slack_error(err))
            name = None
        else:
            if bot:
                found = answer.get("bot")
                name = found.get("name") if isinstance(found, dict) else None
                name = name.strip() if isinstance(name, str) and name.strip() else None
            else:
                name = display_name(answer.get("user"))
        self._known[(team, ref)] = (name, self.clock() + self.ttl)
        self._known.move_to_end((team, ref))
        while len(self._known) > self.max_names:
            self._known.popitem(last=False)
        return name
