"""The operator's routes: sessions listed, dead letters, a session's raw log (full-access
keys only), and the open `/healthz` and `/metrics`."""

from __future__ import annotations

import asyncio
import time
from typing import cast

from aiohttp import web

from engine.api.errors import ApiError, error_response, excerpt
from engine.api.parsing import MAX_SEQ, int_query
from engine.api.state import API, principal_of
from engine.errors import SubsError
from engine.jsonedge import compact_json
from engine.machine import iso
from engine.statuses import LISTED_STATUSES, ListedStatus
from engine.store.index import SORTS, Sort

HEALTH_TIMEOUT = 1.0  # /healthz waits this long for Redis's PONG


def _full_access(request: web.Request) -> None:
    if not principal_of(request).full:
        raise ApiError(
            "this key may only use its own sessions (a KEY:own entry in SUBS_API_KEYS); "
            "the admin endpoints need a full-access key",
            status=403,
            code="forbidden",
        )


def _word(request: web.Request, name: str, allowed: tuple[str, ...], default: str) -> str:
    """A query parameter that must be one of `allowed` words; else a 400 naming it."""
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    if raw not in allowed:
        raise ApiError(
            f"{name}: {excerpt(raw)} is not one of {', '.join(allowed)}",
            status=400,
            code="invalid_query",
            param=name,
        )
    return raw


def _text(request: web.Request, name: str) -> str | None:
    """An optional id from the query (1..200 characters); a longer one is a 400."""
    raw = request.query.get(name) or None
    if raw is not None and len(raw) > 200:
        raise ApiError(
            f"{name}: longer than 200 characters", status=400, code="invalid_query", param=name
        )
    return raw


async def admin_sessions(request: web.Request) -> web.Response:
    """The original engine's admin list, `{items, next_cursor}`: cursor paging over the
    listing indexes in one of four sorts, filtered by `top_level`, `agent_id`,
    `session_id` and (ours) `status`; `store` (ours) beside it. A bad parameter is one
    400 naming it."""
    _full_access(request)
    if "offset" in request.query:
        raise ApiError(
            "offset: this list pages by cursor now: send the previous page's next_cursor "
            "as `cursor`",
            status=400,
            code="invalid_query",
            param="offset",
        )
    limit = int_query(request, "limit", 50, lo=1, hi=500)
    sort = cast(Sort, _word(request, "sort", SORTS, "last_event_desc"))
    top = _word(request, "top_level", ("true", "false", "1", "0"), "")
    status = _word(request, "status", LISTED_STATUSES, "") or None
    agent = _text(request, "agent_id") or _text(request, "agent")  # `agent`: ours, before
    cursor = request.query.get("cursor")
    if cursor is not None and not 0 < len(cursor) <= 4096:
        raise ApiError(
            "cursor: send next_cursor as the previous page gave it",
            status=400,
            code="invalid_query",
            param="cursor",
        )
    client = request.app[API].client
    page = await client.list_page(
        limit=limit,
        cursor=cursor,
        sort=sort,
        top_level=None if top == "" else top in ("true", "1"),
        agent_id=agent,
        session_id=_text(request, "session_id"),
        status=cast(ListedStatus | None, status),
    )
    used, maxmemory, full = await client.store_memory()
    page["store"] = {"used_memory": used, "maxmemory": maxmemory, "full": full}
    return web.json_response(page, dumps=compact_json)


async def admin_budgets(request: web.Request) -> web.Response:
    """Every budget-policy bucket still inside its window (`[[budgets]]`): what it has used
    of its limit and, when spent, when it frees up. A full-access or `KEY:read` key's, as
    `/metrics` (they count across every session and key)."""
    if not principal_of(request).full:
        raise ApiError(
            "this key may only use its own sessions (a KEY:own entry in SUBS_API_KEYS); "
            "/api/admin/budgets needs a full-access or a KEY:read key",
            status=403,
            code="forbidden",
        )
    limit = int_query(request, "limit", 1000, lo=1, hi=10_000)
    uses = await request.app[API].store.list_buckets(int(time.time() * 1000), limit)
    body = {
        "budgets": [
            {
                "policy": u.policy,
                "group": u.group,
                "dimension": u.dimension,
                "used": u.used,
                "limit": u.limit,
                "window_ms": u.window_ms,
                "frees_at": None if u.frees_at is None else iso(u.frees_at),
            }
            for u in uses
        ]
    }
    return web.json_response(body, dumps=compact_json)


async def admin_dead_letters(request: web.Request) -> web.Response:
    """Inputs the engine could not apply, newest first (each failed its session's turn)."""
    _full_access(request)
    limit = int_query(request, "limit", 100, lo=1, hi=1000)
    letters = await request.app[API].store.dead_letters(limit)
    return web.json_response({"dead_letters": letters}, dumps=compact_json)


async def admin_events(request: web.Request) -> web.Response:
    """A session's raw log, paged by seq: for operators, not for clients."""
    _full_access(request)
    store = request.app[API].store
    sid = request.match_info["sid"]
    after = int_query(request, "after_seq", 0, lo=0, hi=MAX_SEQ)
    limit = int_query(request, "limit", 100, lo=1, hi=1000)
    head = await store.head(sid)
    if head is None:
        raise ApiError(f"session {sid!r} does not exist", status=404, code="unknown_session")
    events = await store.read_log(sid, after, count=limit)
    last = events[-1]["seq"] if events else after
    body = {"events": events, "next_after_seq": last if last < head[0] else None}
    return web.json_response(body, dumps=compact_json)


async def get_healthz(request: web.Request) -> web.Response:
    """Redis answers a PING within `HEALTH_TIMEOUT` and nothing else is known to be wrong
    with the store, or the engine is degraded. Open to anyone, so the reason is a word
    (the error's type) or a phrase, never an address."""
    api = request.app[API]
    try:
        async with asyncio.timeout(HEALTH_TIMEOUT):
            await api.store.ping()
    except TimeoutError:
        reason = f"no answer within {HEALTH_TIMEOUT:g} s"
    except Exception as err:  # whatever stops the PING: the check's only question
        reason = type(err).__name__
    else:
        problem = api.store_problem()
        if problem is None:
            return web.json_response({"status": "ok"}, dumps=compact_json)
        return error_response(
            SubsError(
                f"the store (Redis) answers but is degraded: {problem}",
                code="store_unavailable",
                status=503,
                detail={"status": "degraded", "redis": problem},
            )
        )
    return error_response(
        SubsError(
            f"the store (Redis) does not answer: {reason}",
            code="store_unavailable",
            status=503,
            detail={"status": "degraded", "redis": reason},
        )
    )


async def get_metrics(request: web.Request) -> web.Response:
    """Prometheus text exposition of the engine's counters and histograms: a full-access or
    `KEY:read` key's (they count across every session and key)."""
    if not principal_of(request).full:
        raise ApiError(
            "this key may only use its own sessions (a KEY:own entry in SUBS_API_KEYS); "
            "/metrics needs a full-access or a KEY:read key",
            status=403,
            code="forbidden",
        )
    api = request.app[API]
    api.metrics.set("subs_sse_readers", len(api.hub.readers))
    text = api.metrics.render()
    return web.Response(
        body=text.encode(), headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}
    )
