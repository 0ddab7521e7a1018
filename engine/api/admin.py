"""The operator's routes: sessions listed, dead letters, a session's raw log (full-access
keys only), and the open `/healthz` and `/metrics`."""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from engine.api.errors import ApiError, error_response
from engine.api.parsing import MAX_SEQ, int_query
from engine.api.state import API, principal_of
from engine.errors import SubsError
from engine.jsonedge import compact_json
from engine.machine import iso
from engine.statuses import LISTED_STATUSES, is_listed_status

HEALTH_TIMEOUT = 1.0  # /healthz waits this long for Redis's PONG


def _full_access(request: web.Request) -> None:
    if not principal_of(request).full:
        raise ApiError(
            "this key may only use its own sessions (a KEY:own entry in SUBS_API_KEYS); "
            "the admin endpoints need a full-access key",
            status=403,
            code="forbidden",
        )


FILTER_SCAN = 1000  # sessions one filtered page reads at most, matches or not


async def admin_sessions(request: web.Request) -> web.Response:
    """Newest first, paged. `agent` and `status` filter; a filtered page reads at most
    `FILTER_SCAN` sessions, so it may hold fewer rows than asked, with `next_offset` to go on."""
    _full_access(request)
    offset = int_query(request, "offset", 0, lo=0, hi=2**31)
    limit = int_query(request, "limit", 50, lo=1, hi=500)
    agent = request.query.get("agent") or None
    status = request.query.get("status") or None
    if status is not None and not is_listed_status(status):
        raise ApiError(
            f"status: {status!r} is not one of {', '.join(LISTED_STATUSES)}",
            status=400,
            code="invalid_query",
        )
    client = request.app[API].client
    if agent is None and status is None:
        sessions, more = await client.session_rows(offset, limit)
        next_offset = offset + limit if more else None
    else:
        sessions, next_offset = await client.find_rows(
            offset, limit, agent=agent, status=status, scan=FILTER_SCAN
        )
    used, limit, full = await client.store_memory()
    store = {"used_memory": used, "maxmemory": limit, "full": full}
    body = {"sessions": sessions, "next_offset": next_offset, "store": store}
    return web.json_response(body, dumps=compact_json)


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
