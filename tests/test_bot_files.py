"""Files in Slack threads, end to end (FakeSlack's files over loopback HTTP -> Bolt and
slack_sdk -> the engine -> the fake vendor): a log reaches the model as text, a screenshot as
an image part and a PDF as a document, each in the vendor's own format; the session's log
holds references, not bytes; an image a tool returns is uploaded into the thread; and what
cannot be read (cut, refused, a sign-in page) is a note, never a failed turn."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientSession, web

from bot.rendering.files import plan_file
from bot.slack.files import DOWNLOAD, FileRefused, download
from bot.slack.governor import RateGovernor
from bot.turns.routing import session_id_for
from engine.config import parse_project
from engine.files import FILE_URI
from tests.bot_helpers import World, serve_bots
from tests.engine_helpers import project_toml
from tests.fakes.llm_vendor import FakeVendor, Text, ToolCalls
from tests.fakes.slack import FakeSlack, Message
from tests.fakes.slack.rules import DEFAULT_SCOPES

ROOT = Path(__file__).resolve().parents[1]
MCP_SERVER = str(ROOT / "tests" / "mcp_server.py")
RETRY = "retry = { llm = { backoff_base_secs = 0 } }"
LOG = b"2026-12-06T02:00:01Z ERROR api: connection refused to db-1:5432\n" * 20
# A PNG's signature and IHDR, then enough bytes that a copy in the log would show.
PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + os.urandom(200_000)


def _pdf(text: str) -> bytes:
    """A one-page PDF whose page shows `text` (PDF 1.4, written out by hand: the objects,
    then the cross-reference table with each object's byte offset)."""
    stream = f"BT /F1 24 Tf 72 700 Td ({text}) Tj ET".encode()
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for n, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % n + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        xref,
    )
    return bytes(out)


@asynccontextmanager
async def _world(
    redis: Any, vendor: FakeVendor, tmp_path: Path, agent: str, slack: str = "", mcp: bool = False
) -> AsyncIterator[World]:
    retry = RETRY + ('\nmcp = ["mcp.clock"]' if mcp else "")
    text = project_toml(vendor.url, retry=retry)
    text += f'\n[agent.{agent}.slack]\nanswers = "both"\n{slack}\n'
    if mcp:
        command = json.dumps([sys.executable, MCP_SERVER])
        text += f'\n[mcp.clock]\ncommand = {command}\nenv = {{ CLOCK_TZ = "UTC" }}\n'
    project = parse_project(text, str(tmp_path / "subs.toml"), env={})
    async with serve_bots(redis, vendor, project, agent) as served:
        yield served


async def _ask(world: World, text: str, root: Message) -> Message:
    fake = world.fake
    asked = fake.post_as_user(fake.general, fake.mention(text), thread_ts=root.ts)
    delivered = await fake.send_event(world.url, fake.event_for(asked, kind="app_mention"))
    assert delivered.status == 200
    return asked


def _user_contents(vendor: FakeVendor, call: int = 0) -> list[Any]:
    return [m["content"] for m in vendor.requests[call].body["messages"] if m["role"] == "user"]


def _texts(content: Any) -> str:
    """Every text in a vendor message's content (a string, or its text parts)."""
    if isinstance(content, str):
        return content
    return "\n".join(p["text"] for p in content if p.get("type") == "text")


async def _log_bytes(world: World, sid: str) -> bytes:
    """The session's log as Redis holds it: every entry's raw fields, joined."""
    store = world.client.store
    entries = await store.redis.xrange(store.log_key(sid))
    return b"".join(v for _, fields in entries for v in fields.values())


@pytest.mark.parametrize("agent", ["ops_anthropic", "ops_openai"])
async def test_a_log_and_a_png_in_a_thread_reply_reach_the_model(
    redis: Any, vendor: FakeVendor, tmp_path: Path, agent: str
) -> None:
    async with _world(redis, vendor, tmp_path, agent) as world:
        fake = world.fake
        root = fake.post_as_user(fake.general, "the api is down")
        log = fake.add_file("api.log", LOG, "text/plain", pretty_type="Plain Text")
        png = fake.add_file("errors.png", PNG, "image/png", pretty_type="PNG")
        fake.post_files(fake.general, [log, png], "log and graph", thread_ts=root.ts)
        vendor.push(Text("db-1 refuses connections."))
        await _ask(world, "why?", root)
        await world.reply_to(root)

        said = _user_contents(vendor)
        assert _texts(said[0]) == "alice: the api is down"
        shared = said[1]
        assert isinstance(shared, list)
        text = _texts(shared)
        assert text.startswith("alice: log and graph\n[file api.log (Plain Text, 1.2 KiB)]\n```")
        assert LOG.decode().strip() in text
        assert "[file errors.png (PNG, 195.3 KiB)]" in text
        data = base64.b64encode(PNG).decode()
        # A prompt-cache breakpoint may sit on the block (tests/test_prompt_caching.py).
        images = [
            {k: v for k, v in p.items() if k != "cache_control"}
            for p in shared
            if p.get("type") in ("image", "image_url")
        ]
        if agent == "ops_anthropic":  # docs.anthropic.com messages: image block, base64 source
            source = {"type": "base64", "media_type": "image/png", "data": data}
            assert images == [{"type": "image", "source": source}]
        else:  # platform.openai.com chat completions: image_url part with a data URL
            url = f"data:image/png;base64,{data}"
            assert images == [{"type": "image_url", "image_url": {"url": url}}]
        assert _texts(said[2]) == "alice: why?"

        # The log holds a reference; the bytes are in the session's files once.
        sid = session_id_for(world.agent, fake.general.id, root.ts)
        raw = await _log_bytes(world, sid)
        digest = hashlib.sha256(PNG).hexdigest()
        assert f"{FILE_URI}{digest}".encode() in raw
        assert data[:1000].encode() not in raw and PNG[20:1000] not in raw
        store = world.client.store
        assert await store.redis.hkeys(store.files_key(sid)) == [digest.encode()]
        assert fake.file_state.files[png["id"]].downloads == 1


async def test_a_second_turn_sends_the_image_again_from_one_stored_copy(
    redis: Any, vendor: FakeVendor, tmp_path: Path
) -> None:
    async with _world(redis, vendor, tmp_path, "ops_anthropic") as world:
        fake = world.fake
        root = fake.post_as_user(fake.general, "look")
        png = fake.add_file("a.png", PNG, "image/png")
        fake.post_files(fake.general, [png], thread_ts=root.ts)
        store = world.client.store  # the engine's own: the client shares it
        reads: list[list[str]] = []
        get_files = store.get_files

        async def counted(sid: str, names: Any) -> list[bytes | None]:
            reads.append(list(names))
            return await get_files(sid, names)

        store.get_files = counted  # type: ignore[method-assign]
        vendor.push(Text("A graph."), Text("Still a graph."))
        await _ask(world, "what is it?", root)
        await world.reply_to(root)
        await _ask(world, "and now?", root)
        await world.reply_to(root, nth=2)

        data = base64.b64encode(PNG).decode()
        for call in (0, 1):
            sent = json.dumps(vendor.requests[call].body)
            assert sent.count(data) == 1
        # Read from Redis for the first call; the second sends the message as kept encoded.
        assert reads == [[hashlib.sha256(PNG).hexdigest()]]
        sid = session_id_for(world.agent, fake.general.id, root.ts)
        raw = await _log_bytes(world, sid)
        assert data[:1000].encode() not in raw
        assert len(await store.redis.hkeys(store.files_key(sid))) == 1
        assert fake.file_state.files[png["id"]].downloads == 1
        # Deleting the session deletes its files.
        await world.client.delete(sid)
        assert not await store.redis.exists(store.files_key(sid))


@pytest.mark.parametrize("agent", ["ops_anthropic", "ops_openai"])
async def test_a_pdf_is_a_document_for_anthropic_and_its_text_elsewhere(
    redis: Any, vendor: FakeVendor, tmp_path: Path, agent: str
) -> None:
    pdf = _pdf("Disk full on db-1")
    async with _world(redis, vendor, tmp_path, agent) as world:
        fake = world.fake
        root = fake.post_as_user(fake.general, "postmortem draft")
        # Slack may serve a PDF as binary/octet-stream (oncall-facts §2.2, Collmbo).
        doc = fake.add_file("pm.pdf", pdf, "application/pdf", served_as="binary/octet-stream")
        fake.post_files(fake.general, [doc], thread_ts=root.ts)
        vendor.push(Text("The disk filled."))
        await _ask(world, "summarise", root)
        await world.reply_to(root)

        shared = _user_contents(vendor)[1]
        if agent == "ops_anthropic":  # docs.anthropic.com PDF support: document, base64
            source = {
                "type": "base64",
                "media_type": "application/pdf",
                "data": base64.b64encode(pdf).decode(),
            }
            assert {"type": "document", "source": source} in shared
        else:
            assert "(the PDF's text)\nDisk full on db-1" in _texts(shared)
            assert not any(p.get("type") in ("file", "image_url") for p in shared)


async def test_an_oversize_text_file_is_cut_with_a_note(
    redis: Any, vendor: FakeVendor, tmp_path: Path
) -> None:
    big = b"".join(b"line %05d\n" % n for n in range(600))  # 6600 bytes
    async with _world(
        redis, vendor, tmp_path, "ops_openai", slack="file_text_limit = 1024"
    ) as world:
        fake = world.fake
        root = fake.post_as_user(fake.general, "crash")
        fake.post_files(
            fake.general, [fake.add_file("big.log", big, "text/plain")], thread_ts=root.ts
        )
        vendor.push(Text("ok"))
        await _ask(world, "read it", root)
        await world.reply_to(root)

        text = _texts(_user_contents(vendor)[1])
        assert big[:1020].decode() in text and big[1030:1100].decode() not in text
        assert text.endswith("```\n[cut at 1 KiB: 5.4 KiB more left out]")


async def test_a_sign_in_page_instead_of_the_file_is_a_note(
    redis: Any, vendor: FakeVendor, tmp_path: Path
) -> None:
    async with _world(redis, vendor, tmp_path, "ops_anthropic") as world:
        fake = world.fake
        fake.scopes = DEFAULT_SCOPES.replace("files:read,", "")  # installed without files:read
        root = fake.post_as_user(fake.general, "see log")
        fake.post_files(
            fake.general, [fake.add_file("x.log", LOG, "text/plain")], thread_ts=root.ts
        )
        vendor.push(Text("I could not read the log."))
        await _ask(world, "what does it say?", root)
        answer = await world.reply_to(root)

        assert fake.file_state.signin_pages == 1
        text = _texts(_user_contents(vendor)[1])
        assert (
            "[file x.log (text/plain, 1.2 KiB): not read: Slack answered its sign-in page" in text
        )
        assert "files:read" in text and "connection refused" not in text
        assert answer.text == "I could not read the log."


async def test_a_download_that_fails_is_a_note(
    redis: Any, vendor: FakeVendor, tmp_path: Path
) -> None:
    async with _world(redis, vendor, tmp_path, "ops_openai") as world:
        fake = world.fake
        root = fake.post_as_user(fake.general, "see these")
        gone = fake.add_file("gone.log", LOG, "text/plain")
        del fake.file_state.files[gone["id"]]  # deleted since it was shared: Slack's 404
        zipped = fake.add_file("dump.zip", b"PK", "application/zip", pretty_type="Zip")
        kept = fake.add_file("ok.log", b"all good", "text/plain")
        # A file object whose address is not Slack's: the bot token must not go there.
        elsewhere = {
            **kept,
            "id": "F9",
            "name": "x.log",
            "url_private_download": "http://127.0.0.2:9/x",
        }
        fake.post_files(fake.general, [gone, zipped, kept, elsewhere], thread_ts=root.ts)
        vendor.push(Text("One log was gone."))
        await _ask(world, "read them", root)
        answer = await world.reply_to(root)

        assert answer.text == "One log was gone."
        text = _texts(_user_contents(vendor)[1])
        assert "[file gone.log (text/plain, 1.2 KiB): not read: Slack answered HTTP 404]" in text
        assert (
            "[file dump.zip (Zip, 2 B): not read: the app reads only text, images and PDFs]" in text
        )
        assert "all good" in text
        assert "[file x.log (text/plain, 8 B): not read: its address is not Slack's" in text
        assert fake.file_state.files[zipped["id"]].downloads == 0  # named, not fetched


async def test_a_dm_with_only_a_file_starts_a_turn(
    redis: Any, vendor: FakeVendor, tmp_path: Path
) -> None:
    async with _world(redis, vendor, tmp_path, "ops_anthropic") as world:
        fake = world.fake
        shared = fake.post_files(fake.dm, [fake.add_file("api.log", LOG, "text/plain")])
        event = fake.event_for(shared)
        assert event["subtype"] == "file_share" and event["text"] == ""
        vendor.push(Text("db-1 is refusing connections."))
        delivered = await fake.send_event(world.url, event)
        assert delivered.status == 200
        answer = await world.reply_to(shared)

        assert answer.text == "db-1 is refusing connections."
        text = _texts(_user_contents(vendor)[0])
        assert text.startswith("alice: (shared 1 file)\n[file api.log")
        assert "connection refused to db-1" in text


@pytest.mark.parametrize("refused", [False, True], ids=["uploaded", "refused"])
async def test_an_image_a_tool_returns_is_uploaded_into_the_thread(
    redis: Any, vendor: FakeVendor, tmp_path: Path, refused: bool
) -> None:
    async with _world(redis, vendor, tmp_path, "ops_openai", mcp=True) as world:
        fake = world.fake
        if refused:
            fake.scopes = DEFAULT_SCOPES.replace("files:write,", "")
        root = fake.post_as_user(fake.general, "graph it")
        vendor.push(ToolCalls([("clock__picture", {})]), Text("Here is the picture."))
        await _ask(world, "draw", root)
        answer = await world.reply_to(root)
        assert answer.text == "Here is the picture."  # the text arrives either way

        mine = [m for m in fake.thread(fake.general.id, root.ts) if fake.by_app(m)]
        uploads = [f for f in fake.shared_files(fake.general.id, root.ts) if f.user != fake.user.id]
        if refused:
            assert uploads == []
            assert len(mine) == 2 and "could not be uploaded: missing_scope" in mine[1].text
        else:
            assert len(uploads) == 1 and uploads[0].mimetype == "image/png"
            assert uploads[0].name == "image-1-1.png"
            assert uploads[0].data.startswith(b"\x89PNG")
            assert len(mine) == 2 and mine[1].extra.get("files")  # the upload, in the thread


# --- the download itself (bot/slack/files.py), against the fake over loopback --------------


async def test_downloads_are_paced_size_checked_and_under_a_deadline() -> None:
    async with FakeSlack() as fake, ClientSession() as http:
        governor = RateGovernor({DOWNLOAD: 600})  # 0.1 s apart
        token, team = fake.bot_token, fake.team.id
        small = plan_file(fake.add_file("a.log", b"x" * 10, "text/plain"))
        loop = asyncio.get_running_loop()
        started = loop.time()
        for _ in range(3):
            assert await download(http, governor, team, token, small) == (b"x" * 10, 10)
        assert loop.time() - started >= 0.2  # three in one slot each

        # An image over its limit is refused, even when its object under-states its size.
        big = fake.add_file("big.png", b"\x89PNG" + bytes(6 * 1024 * 1024), "image/png")
        lying = plan_file({**big, "size": 100})
        with pytest.raises(FileRefused, match="over 5 MiB"):
            await download(http, RateGovernor({DOWNLOAD: 6000}), team, token, lying)

    async def stall(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        await response.write(b"partial")
        await asyncio.Event().wait()  # never finishes
        return response

    app = web.Application()
    app.router.add_get("/f", stall)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        url = f"http://127.0.0.1:{runner.addresses[0][1]}/f"
        plan = plan_file({"name": "s.log", "mimetype": "text/plain", "url_private_download": url})
        async with ClientSession() as http:
            with pytest.raises(FileRefused, match=r"took over 0\.2 s"):
                await download(http, RateGovernor({DOWNLOAD: 6000}), "T", "t", plan, timeout=0.2)
    finally:
        await runner.cleanup()
