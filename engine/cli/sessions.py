"""`subs sessions`: list, read, follow, cancel, delete, export and import sessions,
from Redis or from a `--url` engine."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.cli.common import project_from, wants_jsonl
from engine.cli.connect import engine_client, redis_client, remote_client, say_when_lost
from engine.cli.text import short
from engine.errors import SubsError

if TYPE_CHECKING:
    from engine.session_client import SessionClient, SessionRow


@contextlib.asynccontextmanager
async def _reader(args: argparse.Namespace) -> AsyncIterator[SessionClient]:
    """Read sessions from a remote engine (`--url`) or straight from Redis."""
    if args.url:
        async with remote_client(args.url) as client:
            yield client
        return
    from engine.client import Client
    from engine.store.store import Store

    project = project_from(args)
    async with redis_client(project, args.redis) as redis:
        yield Client(await Store.open(redis), policies=project.budgets)


async def _cancel(args: argparse.Namespace) -> int:
    """Cancelling is an input: an engine applies it (a remote one, or one started here)."""
    if args.url:
        async with remote_client(args.url) as remote:
            reply = await remote.cancel(args.session, args.reason)
    else:
        async with engine_client(project_from(args), args.redis) as client:
            reply = await client.cancel(args.session, args.reason)
    print(f"subs: cancelled turn {reply['turn_id']} of session {args.session}", file=sys.stderr)
    return 0


async def sessions(args: argparse.Namespace) -> int:
    """`subs sessions <command>`: the ones that need an engine or Redis go their own
    way; the rest read through a client (Redis, or the `--url` engine)."""
    if args.sessions_command == "cancel":
        return await _cancel(args)
    if args.sessions_command == "import":
        return await _import(args)
    async with _reader(args) as client:
        if args.sessions_command == "list":
            rows, more = await client.session_rows(args.limit, args.cursor)
            _print_sessions(rows, wants_jsonl(args.output))
            if more is not None:
                print(f"subs: more: subs sessions list --cursor {more}", file=sys.stderr)
            return 0
        if args.sessions_command == "delete":
            await client.delete(args.session)
            print(f"subs: deleted session {args.session}", file=sys.stderr)
            return 0
        if args.sessions_command == "export":
            return await _export(args, client)
        if args.sessions_command == "dead":
            for letter in await client.dead_letters(args.limit):
                print(_dead_letter_line(letter))
            return 0
        jsonl = wants_jsonl(args.output)
        events = await client.events(args.session, args.after)
        if not events and args.after == 0 and not args.follow:
            raise SubsError(f"no session {args.session!r}; `subs sessions list` shows them")
        for event in events:
            _print_event(event, jsonl)
        if args.follow:
            say_when_lost(client, None)
            after = events[-1]["seq"] if events else args.after
            async for kind, event in client.follow(args.session, after):
                if kind == "event":
                    _print_event(event, jsonl)
    return 0


async def _export(args: argparse.Namespace, client: Any) -> int:
    """A live session's log, as the sweep archives it (docs/archive.md)."""
    from engine.runtime.retention import export
    from engine.store import archive

    events = await client.events(args.session, 0)
    if not events:
        raise SubsError(f"no session {args.session!r}; `subs sessions list` shows them")
    store = getattr(client, "store", None)  # straight from Redis: the files come too
    files = await store.session_files(args.session) if store is not None else {}
    if store is None:
        print(
            "subs: over --url the session's files are not exported, only its log", file=sys.stderr
        )
    kept = export(events, int(time.time() * 1000), files)
    path = Path(args.file or archive.export_name(args.session))
    try:
        await asyncio.to_thread(archive.write, path, kept)
    except OSError as err:
        raise SubsError(f"cannot write {path}: {err.strerror or err}") from None
    print(f"subs: wrote {kept.seq} events of session {args.session} to {path}", file=sys.stderr)
    return 0


async def _import(args: argparse.Namespace) -> int:
    """Put an archived session back: straight into Redis (an engine needs no part in it)."""
    from engine.runtime.retention import restore
    from engine.store import archive
    from engine.store.store import Store

    kept = await asyncio.to_thread(archive.read, Path(args.file))
    project = project_from(args)
    async with redis_client(project, args.redis) as redis:
        state = await restore(await Store.open(redis), kept)
    print(
        f"subs: restored session {kept.session_id} ({state.seq} events, agent {state.agent_id})",
        file=sys.stderr,
    )
    return 0


def _print_sessions(rows: list[SessionRow], jsonl: bool) -> None:
    """One JSON object a line, or a table with the first words of each conversation."""
    if jsonl:
        for row in rows:
            print(json.dumps(row, ensure_ascii=False))
        return
    if not rows:
        print('no sessions yet; start one with: subs run <agent> "hello"', file=sys.stderr)
        return
    table = [("SESSION", "AGENT", "STATUS", "LAST ACTIVITY", "TURNS", "FIRST MESSAGE")]
    for row in rows:
        last = (row.get("last_activity_at") or "")[:19].replace("T", " ")
        first = short(row.get("first_message") or "", 50)
        table.append(
            (row["session_id"], row["agent_id"], row["status"], last, str(row["turns"]), first)
        )
    widths = [max(len(line[i]) for line in table) for i in range(5)]
    for n, line in enumerate(table):
        cells = [cell.ljust(w) for cell, w in zip(line, widths, strict=False)]
        print("  ".join([*cells, line[5]]).rstrip())
        for bucket in rows[n - 1].get("budgets") or () if n else ():
            print(f"  {_bucket_line(bucket)}")


def _bucket_line(b: Mapping[str, Any]) -> str:
    """`budget per-user (user=slack:U1): 480 of 300 tokens, spent until …`: one bucket."""
    unit = "USD" if b.get("dimension") == "cost_usd" else "tokens"
    group = f" ({b['group']})" if b.get("group") else ""
    line = f"budget {b['policy']}{group}: {b['used']} of {b['limit']} {unit}"
    if b.get("frees_at"):
        line += f", spent until {b['frees_at']}"
    return line


def _dead_letter_line(letter: dict[str, Any]) -> str:
    """`<time> <session> <input kind> (<n> deliveries): <reason>`: one line to act on."""
    from engine.machine import iso

    when = iso(int(letter.get("at_ms", 0)))
    body = letter.get("input") or {}
    kind = "outbox entry" if "outbox" in letter else body.get("kind", "?")
    if kind == "client":
        kind = f"client {(body.get('input') or {}).get('type', '?')}"
    deliveries = letter.get("deliveries", 1)
    sid = letter.get("session_id") or "-"
    return f"{when} {sid} {kind} ({deliveries}x): {letter.get('reason', '')}"


def _print_event(event: dict[str, Any], jsonl: bool) -> None:
    if jsonl:
        print(json.dumps(event), flush=True)
        return
    p = event["payload"]
    detail = {k: v for k, v in p.items() if k != "type"}
    text = json.dumps(detail, ensure_ascii=False)
    print(
        f"{event['seq']:>5} {event['occurred_at']} {p['type']:<26} {short(text, 120)}", flush=True
    )
