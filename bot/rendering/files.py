"""Files on Slack messages: which kind each is, and the text the model reads about it.

Pure: a file object (the Events API's and `conversations.replies`' `files[]`, oncall-facts
§2.2) in, a plan or text out. The original engine's rule ("Attachments"):

- text-like (plain text, logs, snippets, JSON, YAML, CSV, Markdown, source code): read as
  text, up to a per-file limit, then cut with a note saying how much was left out;
- images (PNG, JPEG, GIF, WebP) up to 5 MiB: an image part of the user message;
- PDFs up to 10 MiB: a document (or its text, where the vendor takes no documents);
- anything else (and the above over their limit, an external file, a Slack Connect stub)
  is named (name, type, size) and not fetched.

A download that fails is a one-line note too: the model is told what it could not read,
never that there was nothing.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

__all__ = [
    "IMAGE_MAX",
    "PDF_MAX",
    "TEXT_LIMIT",
    "FilePlan",
    "cut_text",
    "files_of",
    "is_sign_in",
    "note",
    "plan_file",
    "size_text",
    "slack_hosted",
    "text_block",
    "titled",
    "tool_images",
]

IMAGE_MAX = 5 * 1024 * 1024
PDF_MAX = 10 * 1024 * 1024
TEXT_LIMIT = 256 * 1024  # bytes of a text file the model is given (`file_text_limit`)

Kind = Literal["text", "image", "pdf", "skip"]

IMAGE_TYPES = {"image/png": "png", "image/jpeg": "jpg", "image/gif": "gif", "image/webp": "webp"}
IMAGE_FILETYPES = {"png": "image/png", "jpg": "image/jpeg", "jpeg": "image/jpeg",
                   "gif": "image/gif", "webp": "image/webp"}  # fmt: skip
# Slack's `filetype` values of text (docs.slack.dev/reference/objects/file-object, "file
# types"): plain text, snippets and the source languages a snippet may be in.
TEXT_FILETYPES = frozenset(
    """text log json yaml yml csv tsv markdown md post python javascript typescript go rust
    java kotlin swift c cpp csharp objc php ruby perl shell bash powershell sql xml html css
    scss diff patch dockerfile toml ini properties groovy scala clojure elixir erlang haskell
    lua r matlab ocaml fsharp vb vbscript apex cobol fortran julia dart terraform hcl
    protobuf graphql makefile nginx apache""".split()  # noqa: SIM905
)
TEXT_MIMES = frozenset(
    {
        "application/json",
        "application/x-ndjson",
        "application/yaml",
        "application/x-yaml",
        "application/xml",
        "application/javascript",
        "application/x-javascript",
        "application/typescript",
        "application/x-sh",
        "application/x-shellscript",
        "application/sql",
        "application/toml",
        "application/csv",
    }
)


@dataclass(frozen=True)
class FilePlan:
    """What to do with one file: `kind`, and for a `skip` why (`reason`)."""

    kind: Kind
    name: str
    mime: str
    pretty: str  # Slack's `pretty_type` (or the mime type): how people see its type
    size: int | None
    url: str | None
    reason: str = ""
    limit: int = TEXT_LIMIT  # the most bytes read of it (a text file: where it is cut)


def files_of(msg: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The file objects a message carries (none when `files` is missing or not a list)."""
    files = msg.get("files")
    return [f for f in files if isinstance(f, Mapping)] if isinstance(files, list) else []


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def plan_file(file: Mapping[str, Any], *, text_limit: int = TEXT_LIMIT) -> FilePlan:
    """The kind of a Slack file object and where to fetch it; `skip` with a reason for a
    file that is not fetched."""
    name = _str(file.get("name")) or _str(file.get("title")) or _str(file.get("id")) or "file"
    mime = _str(file.get("mimetype")).split(";")[0].strip().lower()
    filetype = _str(file.get("filetype")).lower()
    pretty = _str(file.get("pretty_type")) or mime or filetype or "file"
    size = file.get("size")
    size = size if isinstance(size, int) and not isinstance(size, bool) and size >= 0 else None
    url = _str(file.get("url_private_download")) or _str(file.get("url_private")) or None

    def skip(reason: str) -> FilePlan:
        return FilePlan("skip", name, mime, pretty, size, url, reason)

    if file.get("file_access") == "check_file_info" or file.get("mode") == "tombstone":
        return skip("Slack did not share its contents with the app")
    if file.get("is_external") or file.get("mode") == "external":
        return skip("it is stored outside Slack")
    if url is None or not url.startswith(("https://", "http://")):
        return skip("Slack gave no address to download it from")
    if mime in IMAGE_TYPES or (not mime and filetype in IMAGE_FILETYPES):
        mime = mime or IMAGE_FILETYPES[filetype]
        if size is not None and size > IMAGE_MAX:
            return skip(f"images over {size_text(IMAGE_MAX)} are not read")
        return FilePlan("image", name, mime, pretty, size, url, limit=IMAGE_MAX)
    if mime == "application/pdf" or filetype == "pdf":
        if size is not None and size > PDF_MAX:
            return skip(f"PDFs over {size_text(PDF_MAX)} are not read")
        return FilePlan("pdf", name, "application/pdf", pretty, size, url, limit=PDF_MAX)
    if (
        mime.startswith("text/")
        or mime in TEXT_MIMES
        or mime.endswith(("+json", "+xml", "+yaml"))
        or filetype in TEXT_FILETYPES
        or file.get("mode") == "snippet"
    ):
        return FilePlan("text", name, mime or "text/plain", pretty, size, url, limit=text_limit)
    return skip("the app reads only text, images and PDFs")


def titled(plan: FilePlan) -> str:
    """How a file is named to the model: `name (type, size)`."""
    size = "" if plan.size is None else f", {size_text(plan.size)}"
    return f"{plan.name} ({plan.pretty}{size})"


def note(plan: FilePlan, why: str) -> str:
    """The one line the model reads for a file it is not given."""
    return f"[file {titled(plan)}: not read: {why}]"


def cut_text(data: bytes, total: int | None, limit: int) -> tuple[str, str | None]:
    """The text of a text file's first bytes (`data`, at most `limit` of a file of `total`
    bytes), and the note saying how much was left out when it was cut (else None)."""
    kept = data[:limit]
    total = max(total if total is not None else len(data), len(data))
    text = kept.decode("utf-8", errors="replace")
    if total <= limit and len(data) <= limit:
        return text, None
    if kept and len(kept) == limit:
        text = kept.decode("utf-8", errors="ignore")  # a character cut in two: dropped
    left = total - len(kept)
    return text, f"[cut at {size_text(limit)}: {size_text(left)} more left out]"


def text_block(plan: FilePlan, text: str, cut: str | None) -> str:
    """A text file as the model reads it: its name, then its text fenced, then the cut."""
    fence = "```"
    while fence in text:
        fence += "`"
    body = f"[file {titled(plan)}]\n{fence}\n{text.rstrip()}\n{fence}"
    return f"{body}\n{cut}" if cut else body


SLACK_DOMAINS = (".slack.com", ".slack-gov.com")  # files.slack.com, and GovSlack's


def slack_hosted(url: str | None, api_host: str | None = None) -> bool:
    """Whether `url` is Slack's (an https `*.slack.com` or GovSlack host, or the Web API's
    own host, `SLACK_API_URL`'s for a stand-in): the only places the bot token is sent."""
    if not url:
        return False
    try:
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
    except ValueError:
        return False
    if api_host and host == api_host.lower():
        return True
    return parts.scheme == "https" and host.endswith(SLACK_DOMAINS)


def is_sign_in(content_type: str, plan: FilePlan) -> bool:
    """Slack's sign-in page instead of the file: what a token without `files:read` gets
    (an HTML page with status 200, not a 401; oncall-facts §2.2). An HTML file is HTML."""
    served = content_type.split(";")[0].strip().lower()
    return served == "text/html" and plan.mime != "text/html"


def size_text(n: int) -> str:
    """A byte count as people read it: `512 B`, `12.5 KiB`, `5 MiB`."""
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB"):
        value /= 1024
        if value < 1024:
            return f"{value:.1f}".removesuffix(".0") + f" {unit}"
    return f"{value / 1024:.1f}".removesuffix(".0") + " GiB"


def tool_images(result: Any, stem: str) -> list[tuple[str, bytes]]:
    """The images in a tool's result (the engine keeps an MCP image as a `blob` with a
    `data:` URI; a worker's as an `image` block), each as (filename, bytes) named after
    `stem`; ones that are not valid base64 are left out."""
    blocks = result.get("content") if isinstance(result, Mapping) else None
    found: list[tuple[str, bytes]] = []
    for block in blocks if isinstance(blocks, list) else ():
        if not isinstance(block, Mapping):
            continue
        mime, data = "", ""
        uri = block.get("uri")
        if block.get("type") == "blob" and isinstance(uri, str) and uri.startswith("data:"):
            head, _, data = uri[len("data:") :].partition(",")
            mime = head.removesuffix(";base64") if head.endswith(";base64") else ""
        elif block.get("type") == "image":
            mime, data = _str(block.get("mimeType")), _str(block.get("data"))
        extension = IMAGE_TYPES.get(mime.lower())
        if extension is None or not data:
            continue
        try:
            raw = base64.b64decode(data, validate=True)
        except ValueError:
            continue
        found.append((f"{stem}-{len(found) + 1}.{extension}", raw))
    return found
