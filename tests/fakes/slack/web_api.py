"""What every Web API call goes through: reading its arguments as Slack merges them, the
token, the rate limit (HTTP 429 + Retry-After), the method's handler and Slack's error
answer; and the lookups the method families share (a channel, a message, a scope)."""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from tests.fakes.slack.checks import FORM_JSON
from tests.fakes.slack.model import Call, Channel, Ctx, Message, Team
from tests.fakes.slack.rules import Bucket, SlackError


class WebApiDispatch:
    """The Web API's dispatch in `FakeSlack` (mixed into it); its methods are in the family
    modules (`chat.py`, `conversations.py`, ...), listed in `FakeSlack._methods`."""

    async def _api(self, request: web.Request) -> web.Response:
        name = request.match_info["method"]
        call = Call(name, {}, time.time(), request.method, request.content_type)
        headers = {"x-slack-req-id": uuid.uuid4().hex}
        team: Team | None = None
        try:
            method = self._methods.get(name)
            if method is None:
                raise SlackError("unknown_method", req_method=name)
            call.args, token = await self._read(request, method.json)
            team = self._authenticate(token, method.token)
            if method.post_only and request.method != "POST":
                raise SlackError("insecure_request")
            wait = self._take(name, team, call.args)
            if wait:
                call.status = 429
                headers["Retry-After"] = str(wait)
                raise SlackError("ratelimited")
            call.response = {"ok": True, **method.handler(Ctx(team, call.args))}
        except SlackError as fail:
            call.response = {"ok": False, "error": fail.error, **fail.extra}
        if team is not None:
            headers["x-oauth-scopes"] = self.scopes
        self.requests.append(call)
        self._changed.set()
        return web.json_response(call.response, status=call.status, headers=headers)

    async def _read(self, request: web.Request, json_ok: bool) -> tuple[dict[str, Any], str | None]:
        """Query string + form or JSON body, as Slack merges them; and the token."""
        args: dict[str, Any] = dict(request.query)
        auth = request.headers.get("Authorization", "")
        token = auth[len("Bearer ") :].strip() if auth.startswith("Bearer ") else None
        if request.method == "POST" and request.body_exists:
            kind = request.content_type
            if kind == "application/json":
                raw = await request.read()
                if json_ok:
                    try:
                        body = json.loads(raw)
                    except ValueError:
                        raise SlackError("invalid_json") from None
                    if not isinstance(body, dict):
                        raise SlackError("invalid_json")
                    body.pop("token", None)  # a JSON body's token must be in Authorization
                    args.update(body)
            elif kind in ("application/x-www-form-urlencoded", "multipart/form-data"):
                form = await request.post()
                args.update({k: v for k, v in form.items() if isinstance(v, str)})
            else:
                raise SlackError("invalid_post_type" if kind else "missing_post_type")
        form_token = args.pop("token", None)
        token = token or form_token
        for name, error in FORM_JSON.items():
            if isinstance(args.get(name), str):
                try:
                    args[name] = json.loads(args[name])
                except ValueError:
                    raise SlackError(error) from None
        loading = args.get("loading_messages")
        if isinstance(loading, str):
            try:
                args["loading_messages"] = json.loads(loading)
            except ValueError:
                args["loading_messages"] = [m for m in loading.split(",") if m]
        return args, token

    def _authenticate(self, token: str | None, kind: str) -> Team | None:
        if not token:
            raise SlackError("not_authed")
        if token == self.app_token:
            if kind != "app":
                raise SlackError("not_allowed_token_type")
            return None
        team = next((t for t in self.teams.values() if t.bot_token == token), None)
        if team is None:
            raise SlackError("invalid_auth")
        if kind != "bot":
            raise SlackError("not_allowed_token_type")
        return team

    def _take(self, method: str, team: Team | None, args: Mapping[str, Any]) -> int:
        """0, or the Retry-After seconds (whole, at least 1: slack_sdk parses an int)."""
        limit = self.limits.get(method)
        if limit is None:
            return 0
        channel = str(args.get("channel", "")) if limit.per_channel else ""
        key = (team.id if team else "app", method, channel)
        now = self._now()
        bucket = self._buckets.setdefault(key, Bucket(float(limit.burst or limit.calls), now))
        wait = bucket.take(limit, now, self.time_scale)
        return max(1, math.ceil(wait)) if wait else 0

    # --- lookups the method families share ---------------------------------------------

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

    def _needs(self, scope: str) -> None:
        """Slack's answer to a token without `scope`: `missing_scope`, naming it."""
        if scope not in self.scopes.split(","):
            raise SlackError("missing_scope", needed=scope, provided=self.scopes)
