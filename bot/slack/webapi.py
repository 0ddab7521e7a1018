"""Slack Web API calls under the workspace's rate governor.

Two ways to call: through `Paced` (coalesced, for edits whose latest version is all that
matters) or `governed` (awaited once in the method's next slot, for posts that must each land:
a reply, a continuation, a prompt, a stream start). Both honour Retry-After on 429.
"""

from __future__ import annotations

import asyncio
from typing import Any

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from bot.slack.governor import RateGovernor, RateLimited, scope
from engine.telemetry.live import timed
from engine.telemetry.spans import Attributes

__all__ = [
    "ATTEMPTS",
    "call",
    "every_message",
    "governed",
    "slack_error",
    "slot_for",
    "thread_messages",
]

ATTEMPTS = 5  # 429s waited out before a governed call gives up


async def call(web: AsyncWebClient, method: str, args: dict[str, Any]) -> Any:
    """One Web API call, made the way slack_sdk's own method makes it (JSON, form or query,
    as Slack takes each); a 429 becomes `RateLimited` for the governor."""
    try:
        attributes: Attributes = {"slack.method": method}
        if isinstance(args.get("channel"), str):
            attributes["slack.channel"] = args["channel"]
        request = getattr(web, method.replace(".", "_"))(**args)
        return await timed(f"slack {method}", attributes, request)
    except SlackApiError as err:
        if err.response.status_code == 429:
            headers = {k.lower(): v for k, v in (err.response.headers or {}).items()}
            retry_after = headers.get("retry-after")
            if isinstance(retry_after, list):
                retry_after = retry_after[0] if retry_after else None
            raise RateLimited(float(retry_after or 1)) from err
        raise


async def governed(
    governor: RateGovernor,
    team: str,
    web: AsyncWebClient,
    method: str,
    args: dict[str, Any],
    *,
    unless: asyncio.Future[Any] | None = None,
) -> Any:
    """`call` in the method's next free slot for the workspace, waiting out 429s.

    The slot is taken before the wait, so concurrent callers queue one gap apart instead of
    all waking for the same slot. With `unless`, the call never queues ahead of others: it
    waits until a slot is free now and takes it then (a note that may wait), and is not
    made once `unless` is done (None is returned)."""
    budget = scope(team, method, str(args.get("channel") or ""))
    loop = asyncio.get_running_loop()
    for attempt in range(ATTEMPTS):
        if unless is not None:
            while not unless.done() and (
                (free := governor.next_slot(budget, method, loop.time())) > loop.time()
            ):
                await asyncio.wait([unless], timeout=free - loop.time())
            if unless.done():
                return None
        await slot_for(governor, budget, method)
        try:
            return await call(web, method, args)
        except RateLimited as limited:
            if attempt == ATTEMPTS - 1:
                raise
            governor.penalise(budget, method, limited.retry_after, loop.time())
    raise AssertionError("unreachable")


async def slot_for(governor: RateGovernor, budget: str, method: str) -> None:
    """Wait for the method's next free slot in `budget` (a workspace, or a channel), taking
    it before the wait, and out any 429 that came meanwhile."""
    loop = asyncio.get_running_loop()
    slot = governor.next_slot(budget, method, loop.time())
    governor.record(budget, method, slot)
    if slot > loop.time():
        await asyncio.sleep(slot - loop.time())
    while (blocked := governor.blocked_until(budget, method)) > loop.time():
        await asyncio.sleep(blocked - loop.time())  # a 429 came while we waited


async def thread_messages(
    governor: RateGovernor, team: str, web: AsyncWebClient, channel: str, ts: str, **extra: Any
) -> list[dict[str, Any]]:
    """Every message of a thread (`conversations.replies`, all pages), oldest first."""
    args = {"channel": channel, "ts": ts, **extra}
    return await every_message(governor, team, web, "conversations.replies", args)


async def every_message(
    governor: RateGovernor, team: str, web: AsyncWebClient, method: str, args: dict[str, Any]
) -> list[dict[str, Any]]:
    """The `messages` of every page of a cursor-paged read."""
    messages: list[dict[str, Any]] = []
    cursor = ""
    while True:
        page_args = {"limit": 200, **args, **({"cursor": cursor} if cursor else {})}
        page = await governed(governor, team, web, method, page_args)
        messages += page.get("messages") or []
        cursor = (page.get("response_metadata") or {}).get("next_cursor") or ""
        if not cursor:
            return messages


def slack_error(err: BaseException) -> str | None:
    """Slack's error code for a refused call (`message_not_in_streaming_state`, …), else None."""
    if isinstance(err, SlackApiError):
        return str(err.response.get("error") or "") or None
    return None
