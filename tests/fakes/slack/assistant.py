"""assistant.threads.setStatus: the status a thread shows while the app works (notes §1.4);
the app's next reply in the thread clears it, and it times out (`PersonView.status`)."""

from __future__ import annotations

from typing import Any

from tests.fakes.slack.model import Ctx, Status
from tests.fakes.slack.rules import LOADING_MESSAGES_MAX, SlackError


class AssistantMethods:
    """The assistant.threads.* methods of `FakeSlack` (mixed into it)."""

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
