"""Files, the pure parts: which kind a Slack file object is, the text and notes the model
reads about it, the images in a tool's result, and the engine's swap of stored-file
references for what each vendor takes."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from bot.rendering.files import (
    IMAGE_MAX,
    PDF_MAX,
    TEXT_LIMIT,
    FilePlan,
    cut_text,
    files_of,
    is_sign_in,
    note,
    plan_file,
    size_text,
    slack_hosted,
    text_block,
    titled,
    tool_images,
)
from bot.turns.routing import is_dm, is_mention, route, wants_turn
from engine.effects.llm import anthropic, openai
from engine.effects.llm.files import pdf_text, resolve_files
from engine.files import FILE_URI, file_link, stored_digest
from engine.protocol import parse_client_input

URL = "https://files.slack.com/files-pri/T1-F1/download/x"


def _file(**kw: Any) -> dict[str, Any]:
    """A file object as Slack's events carry it (docs.slack.dev/reference/objects/file-object)."""
    return {
        "id": "F1",
        "name": "x",
        "size": 100,
        "mode": "hosted",
        "url_private_download": URL,
        **kw,
    }


# (file object fields, expected kind, expected reason fragment for a skip)
KINDS = {
    "plain text": ({"mimetype": "text/plain", "filetype": "text"}, "text", ""),
    "log by filetype": ({"mimetype": "application/octet-stream", "filetype": "log"}, "text", ""),
    "json": ({"mimetype": "application/json", "filetype": "json"}, "text", ""),
    "yaml": ({"mimetype": "application/x-yaml", "filetype": "yaml"}, "text", ""),
    "csv": ({"mimetype": "text/csv", "filetype": "csv"}, "text", ""),
    "markdown": ({"mimetype": "text/markdown", "filetype": "markdown"}, "text", ""),
    "python source": ({"mimetype": "text/x-python", "filetype": "python"}, "text", ""),
    "snippet": ({"mimetype": "", "filetype": "", "mode": "snippet"}, "text", ""),
    "charset param": ({"mimetype": "text/plain; charset=utf-8"}, "text", ""),
    "png": ({"mimetype": "image/png", "filetype": "png"}, "image", ""),
    "jpeg": ({"mimetype": "image/jpeg", "filetype": "jpg"}, "image", ""),
    "gif": ({"mimetype": "image/gif"}, "image", ""),
    "webp": ({"mimetype": "image/webp"}, "image", ""),
    "image by filetype": ({"mimetype": "", "filetype": "png"}, "image", ""),
    "image at the limit": ({"mimetype": "image/png", "size": IMAGE_MAX}, "image", ""),
    "image over": ({"mimetype": "image/png", "size": IMAGE_MAX + 1}, "skip", "over 5 MiB"),
    "svg (XML)": ({"mimetype": "image/svg+xml", "filetype": "svg"}, "text", ""),
    "heic": ({"mimetype": "image/heic", "filetype": "heic"}, "skip", "only text, images"),
    "pdf": ({"mimetype": "application/pdf", "filetype": "pdf"}, "pdf", ""),
    "pdf by filetype": ({"mimetype": "binary/octet-stream", "filetype": "pdf"}, "pdf", ""),
    "pdf over": ({"mimetype": "application/pdf", "size": PDF_MAX + 1}, "skip", "over 10 MiB"),
    "zip": ({"mimetype": "application/zip", "filetype": "zip"}, "skip", "only text, images"),
    "external": ({"mimetype": "text/plain", "is_external": True}, "skip", "outside Slack"),
    "connect stub": ({"file_access": "check_file_info"}, "skip", "did not share"),
    "no url": ({"mimetype": "text/plain", "url_private_download": None}, "skip", "no address"),
    "bad url": ({"mimetype": "text/plain", "url_private_download": "file:///x"}, "skip", "no"),
}


@pytest.mark.parametrize("case", list(KINDS))
def test_each_kind_of_file(case: str) -> None:
    fields, kind, reason = KINDS[case]
    plan = plan_file(_file(**fields))
    assert plan.kind == kind
    assert reason in plan.reason if kind == "skip" else plan.reason == ""
    assert plan.limit == {"image": IMAGE_MAX, "pdf": PDF_MAX}.get(kind, TEXT_LIMIT)


def test_a_text_files_limit_is_the_agents() -> None:
    assert plan_file(_file(mimetype="text/plain"), text_limit=10).limit == 10


@pytest.mark.parametrize(
    "bad",
    [{"size": "big"}, {"size": -1}, {"size": True}, {"name": 3, "title": None}, {"mimetype": 7}],
)
def test_fields_of_the_wrong_type_are_left_out_not_raised_on(bad: dict[str, Any]) -> None:
    plan = plan_file(_file(**bad))
    assert plan.name in ("x", "F1") and (plan.size is None or plan.size == 100)


def test_files_of_reads_only_objects_in_a_list() -> None:
    assert files_of({"files": [{"id": "F1"}, "F2", None]}) == [{"id": "F1"}]
    assert files_of({"files": "F1"}) == [] and files_of({}) == []


SIZES = [(0, "0 B"), (1023, "1023 B"), (1024, "1 KiB"), (1536, "1.5 KiB"),
         (5 * 1024 * 1024, "5 MiB"), (3 * 1024**3, "3 GiB")]  # fmt: skip


@pytest.mark.parametrize(("n", "text"), SIZES)
def test_sizes_read_as_people_read_them(n: int, text: str) -> None:
    assert size_text(n) == text


# (bytes, whole size, limit, expected text, expected note)
CUTS = [
    (b"short", 5, 10, "short", None),
    (b"exactly10!", 10, 10, "exactly10!", None),
    (b"0123456789", 4096, 10, "0123456789", "[cut at 10 B: 4 KiB more left out]"),
    (b"01234567890", None, 10, "0123456789", "[cut at 10 B: 1 B more left out]"),
    ("ab€".encode(), 100, 4, "ab", "[cut at 4 B: 96 B more left out]"),  # € cut in two: dropped
    (b"\xff\xfeok", 4, 10, "\ufffd\ufffdok", None),  # not UTF-8: replaced, not raised
]


@pytest.mark.parametrize(("data", "total", "limit", "text", "cut"), CUTS)
def test_cut_text(data: bytes, total: int | None, limit: int, text: str, cut: str | None) -> None:
    assert cut_text(data, total, limit) == (text, cut)


def test_text_block_fences_the_text_and_names_the_file() -> None:
    plan = plan_file(_file(mimetype="text/plain", name="a.log", pretty_type="Plain Text"))
    assert text_block(plan, "x\n", None) == "[file a.log (Plain Text, 100 B)]\n```\nx\n```"
    fenced = text_block(plan, "```py\nprint()\n```", "[cut]")
    assert fenced.startswith("[file a.log (Plain Text, 100 B)]\n````\n```py") and fenced.endswith(
        "```\n````\n[cut]"
    )


def test_notes_name_the_file_its_type_and_size() -> None:
    plan = plan_file(_file(mimetype="application/zip", name="b.zip", pretty_type="Zip", size=3000))
    assert titled(plan) == "b.zip (Zip, 2.9 KiB)"
    assert note(plan, plan.reason) == (
        "[file b.zip (Zip, 2.9 KiB): not read: the app reads only text, images and PDFs]"
    )
    assert titled(FilePlan("skip", "c", "", "file", None, None)) == "c (file)"


@pytest.mark.parametrize(
    ("served", "mime", "sign_in"),
    [
        ("text/html; charset=utf-8", "text/plain", True),
        ("text/html", "image/png", True),
        ("text/html", "text/html", False),  # an HTML file is HTML
        ("text/plain", "text/plain", False),
        ("binary/octet-stream", "application/pdf", False),
        ("", "text/plain", False),
    ],
)
def test_slacks_sign_in_page_is_told_from_the_file(served: str, mime: str, sign_in: bool) -> None:
    plan = FilePlan("text", "f", mime, mime, 1, URL)
    assert is_sign_in(served, plan) is sign_in


PIXEL = base64.b64encode(b"\x89PNG\r\n\x1a\nfake").decode()


def test_tool_images_from_mcp_blobs_and_image_blocks() -> None:
    result = {
        "content": [
            {"type": "text", "text": "a pixel"},
            {"type": "blob", "uri": f"data:image/png;base64,{PIXEL}"},
            {"type": "image", "data": PIXEL, "mimeType": "image/jpeg"},
            {"type": "blob", "uri": "data:audio/wav;base64,AAAA"},  # not an image
            {"type": "blob", "uri": "data:image/png;base64,@@not base64@@"},
            {"type": "blob", "uri": "https://example.com/x.png"},  # not inline
            "junk",
        ]
    }
    raw = base64.b64decode(PIXEL)
    assert tool_images(result, "image-1") == [("image-1-1.png", raw), ("image-1-2.jpg", raw)]
    assert tool_images(None, "s") == [] and tool_images({"content": "x"}, "s") == []


@pytest.mark.parametrize(
    ("url", "api_host", "ours"),
    [
        ("https://files.slack.com/files-pri/T1-F1/download/a.log", None, True),
        ("https://files.slack-gov.com/files-pri/T1-F1/a.log", None, True),
        ("http://files.slack.com/files-pri/T1-F1/a.log", None, False),  # not https
        ("https://files.slack.com.evil.example/x", None, False),
        ("https://evilslack.com/x", None, False),
        ("https://example.com/x", "slack.com", False),
        ("http://127.0.0.1:5555/files-pri/T1-F1/a.log", "127.0.0.1", True),  # SLACK_API_URL's
        ("http://[::1", None, False),  # not a URL
        (None, None, False),
    ],
)
def test_the_bot_token_goes_only_to_slack(
    url: str | None, api_host: str | None, ours: bool
) -> None:
    assert slack_hosted(url, api_host) is ours


# --- routing -----------------------------------------------------------------------------


def _dm(**kw: Any) -> dict[str, Any]:
    return {"type": "message", "channel_type": "im", "user": "U1", "channel": "D1",
            "ts": "1.000001", "text": "", **kw}  # fmt: skip


@pytest.mark.parametrize(
    ("event", "turn"),
    [
        (_dm(text="hi"), True),
        (_dm(subtype="file_share", files=[{"id": "F1"}]), True),  # a file, no text
        (_dm(subtype="file_share"), False),  # says file_share, carries none
        (_dm(subtype="message_changed"), False),
        (_dm(subtype="bot_message", files=[{"id": "F1"}]), False),
    ],
)
def test_a_dm_with_files_starts_a_turn(event: dict[str, Any], turn: bool) -> None:
    assert is_dm(event) is turn
    assert wants_turn(event, "both", "UBOT", "BBOT") is turn


def test_a_mention_with_files_is_a_mention() -> None:
    event = {"type": "app_mention", "subtype": "file_share", "files": [{"id": "F1"}]}
    assert is_mention(event) and not is_mention({**event, "subtype": "message_changed"})


def test_a_file_share_that_mentions_the_app_is_the_app_mentions_twin() -> None:
    """With channel messages subscribed, a mention with a file arrives as `app_mention` and
    as a `message` with `subtype: file_share`: both read as the one mention."""
    message = {"type": "message", "channel_type": "channel", "subtype": "file_share",
               "user": "U1", "channel": "C1", "ts": "2.000001", "thread_ts": "1.000001",
               "text": "<@UBOT> see this", "files": [{"id": "F1"}]}  # fmt: skip
    assert route(message, "both", "UBOT", "BBOT") == "mention"
    mention = {**message, "type": "app_mention"}
    del mention["channel_type"]
    assert route(mention, "both", "UBOT", "BBOT") == "mention"


# --- the engine's side: references in, vendor parts out ------------------------------------

DIGEST = "ab" * 32


def test_the_reference_is_valid_client_input() -> None:
    ref = file_link(DIGEST, "image/png", "a.png")
    assert ref == {"type": "link", "uri": FILE_URI + DIGEST, "mimeType": "image/png",
                   "name": "a.png"}  # fmt: skip
    assert stored_digest(ref) == DIGEST
    assert stored_digest({**ref, "uri": "https://x/y"}) is None
    assert stored_digest({"type": "text", "text": FILE_URI + DIGEST}) is None
    message = {"role": "user", "content": [{"type": "text", "text": "see"}, ref]}
    parse_client_input({"type": "client.append", "agent_id": "a", "messages": [message]})


def test_a_message_with_a_reference_is_a_schema_valid_message_for_a_worker() -> None:
    """What a worker is sent (`messages`, `message_tree`): the schema's own Message."""
    schema = json.loads((Path(__file__).parents[1] / "spec" / "protocol.schema.json").read_text())
    message_schema = Draft202012Validator({"$ref": "#/$defs/Message", **schema})
    ref = file_link(DIGEST, "application/pdf", "pm.pdf")
    content = [
        {"type": "text", "text": "alice: (shared 1 file)"},
        {"type": "text", "text": "[file pm.pdf (PDF, 1.2 KiB)]"},
        ref,
    ]
    message = {"id": "slack:1.000001", "role": "user", "content": content}
    assert list(message_schema.iter_errors(message)) == []
    assert list(message_schema.iter_errors({**message, "content": [{**ref, "extra": 1}]}))


def _request(*parts: dict[str, Any]) -> dict[str, Any]:
    content = [{"type": "text", "text": "alice: look"}, *parts]
    return {"model": "m", "messages": [{"role": "user", "content": content, "id": "m1"}]}


async def _resolved(vendor: str, found: dict[str, bytes | None], *parts: dict[str, Any]) -> Any:
    asked: list[list[str]] = []

    async def fetch(names: Any) -> list[bytes | None]:
        asked.append(list(names))
        return [found.get(n) for n in names]

    out = await resolve_files(_request(*parts), fetch, vendor)
    assert len(asked) <= 1  # one read for the whole request
    return out["messages"][0]["content"][1:]


PNG = b"\x89PNG\r\n\x1a\n1234"
PNG_URL = "data:image/png;base64," + base64.b64encode(PNG).decode()


async def test_an_image_reference_becomes_each_vendors_image() -> None:
    ref = file_link(DIGEST, "image/png", "a.png")
    for vendor in ("openai", "openrouter", "anthropic"):
        [part] = await _resolved(vendor, {DIGEST: PNG}, ref)
        assert part == {"type": "image_url", "image_url": {"url": PNG_URL}}
    body = anthropic.build_request(_request(part), stream=False)
    source = {"type": "base64", "media_type": "image/png", "data": base64.b64encode(PNG).decode()}
    assert body["messages"][0]["content"][1] == {"type": "image", "source": source}
    assert openai.build_request(_request(part), stream=False)["messages"][0]["content"][1] == part


async def test_a_pdf_reference_is_a_document_for_anthropic_and_text_elsewhere() -> None:
    pdf = b"%PDF-1.4 not really"
    ref = file_link(DIGEST, "application/pdf", "pm.pdf")
    [doc] = await _resolved("anthropic", {DIGEST: pdf}, ref)
    body = anthropic.build_request(_request(doc), stream=False)
    source = {"type": "base64", "media_type": "application/pdf",
              "data": base64.b64encode(pdf).decode()}  # fmt: skip
    assert body["messages"][0]["content"][1] == {"type": "document", "source": source}
    [text] = await _resolved("openai", {DIGEST: pdf}, ref)  # unreadable: a note
    assert text == {"type": "text", "text": "(a PDF with no text to read; this model takes no "
                    "documents)"}  # fmt: skip


async def test_missing_bytes_and_other_types_are_notes_and_the_rest_is_untouched() -> None:
    gone = file_link(DIGEST, "image/png", "a.png")
    other = file_link("cd" * 32, "application/zip", "b.zip")
    foreign = {"type": "link", "uri": "https://example.com/x.png", "mimeType": "image/png"}
    parts = await _resolved("openai", {"cd" * 32: b"zip"}, gone, other, foreign)
    assert parts == [
        {"type": "text", "text": "(a image/png that is no longer stored)"},
        {"type": "text", "text": "(a application/zip of 3 bytes, not readable here)"},
        foreign,  # not ours: left for the vendor module to refuse
    ]


async def test_a_request_without_references_is_returned_as_it_is() -> None:
    async def fetch(names: Any) -> list[bytes | None]:
        raise AssertionError("nothing to fetch")

    request = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert await resolve_files(request, fetch, "openai") is request


async def test_messages_kept_encoded_are_not_read_again() -> None:
    """A message whose vendor form is kept is sent as kept: its files are not fetched; one
    dropped from the keep while another was read is fetched in a second round."""
    ref = file_link(DIGEST, "image/png", "a.png")
    other = file_link("cd" * 32, "image/png", "b.png")
    request = {
        "model": "m",
        "messages": [
            {"role": "user", "id": "m1", "content": [ref]},
            {"role": "user", "id": "m2", "content": [other]},
        ],
    }
    keep = {"m1", "m2"}
    asked: list[list[str]] = []

    async def fetch(names: Any) -> list[bytes | None]:
        asked.append(list(names))
        keep.discard("m1")  # dropped from the keep while this read ran
        return [PNG for _ in names]

    out = await resolve_files(request, fetch, "openai", kept=lambda m: m["id"] in keep)
    assert out is request and asked == []  # all kept: nothing read
    keep.discard("m2")
    out = await resolve_files(request, fetch, "openai", kept=lambda m: m["id"] in keep)
    assert asked == [["cd" * 32], [DIGEST]]
    image = {"type": "image_url", "image_url": {"url": PNG_URL}}
    assert [m["content"] for m in out["messages"]] == [[image], [image]]


def test_pdf_text_cuts_with_a_note_and_reads_nothing_from_garbage() -> None:
    from tests.test_bot_files import _pdf

    assert pdf_text(_pdf("Disk full on db-1")) == "Disk full on db-1"
    assert pdf_text(_pdf("Disk full on db-1"), limit=4) == (
        "Disk\n(cut: 13 more characters of the PDF left out)"
    )
    assert pdf_text(b"not a pdf") is None
