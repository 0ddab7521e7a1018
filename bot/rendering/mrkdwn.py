"""Model Markdown to Slack mrkdwn, for the fields that don't take Markdown.

Slack renders standard Markdown only in `markdown_text` and the `markdown` block; section text
and a message's fallback `text` take mrkdwn (notes/slack-facts.md §1.8). The text may be cut
mid-token by a stream, so the converter works line by line: an unclosed `**` or link stays
literal on its own line, and an unclosed code fence is closed at the end.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Literal

__all__ = ["escape", "fence_marker", "is_fence_close", "to_mrkdwn"]

Style = Literal["mrkdwn", "heading", "plain"]

# Emphasis is first rewritten to these sentinels, so one rule's output is never read as
# another rule's input (`**b**` -> `*b*` must not then become italic).
_BOLD, _ITALIC, _STRIKE = "\x01", "\x02", "\x03"
_MARKS: dict[Style, dict[str, str]] = {
    "mrkdwn": {_BOLD: "*", _ITALIC: "_", _STRIKE: "~"},
    "heading": {_BOLD: "", _ITALIC: "_", _STRIKE: "~"},  # the whole heading is bold already
    "plain": {_BOLD: "", _ITALIC: "", _STRIKE: ""},
}
_PLACEHOLDER = 0xE000  # private-use code points stand for protected, already rendered pieces
_PRIVATE_USE = re.compile("[\ue000-\uf8ff]")

_EMPHASIS = [
    (re.compile(r"(?<!\*)\*\*\*(?![\s*])(.+?)(?<![\s*])\*\*\*(?!\*)"), _BOLD + _ITALIC),
    (re.compile(r"(?<!\*)\*\*(?![\s*])(.+?)(?<![\s*])\*\*(?!\*)"), _BOLD),
    (re.compile(r"(?<![\w_])__(?![\s_])(.+?)(?<![\s_])__(?![\w_])"), _BOLD),
    (re.compile(r"(?<![\w*])\*(?![\s*])(.+?)(?<![\s*])\*(?![\w*])"), _ITALIC),
    (re.compile(r"(?<![\w_])_(?![\s_])(.+?)(?<![\s_])_(?![\w_])"), _ITALIC),
    (re.compile(r"(?<!~)~~(?![\s~])(.+?)(?<![\s~])~~(?!~)"), _STRIKE),
]

_FENCE_OPEN = re.compile(r"^[ \t]*(`{3,}|~{3,})(.*)$")
_HEADING = re.compile(r"^ {0,3}#{1,6}(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
_RULE = re.compile(r"^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$")
_QUOTE = re.compile(r"^ {0,3}(?:>[ \t]*)+(.*)$")  # mrkdwn quotes do not nest: flatten
_TASK = re.compile(r"^([ \t]*)[-*+][ \t]+\[([ xX])\][ \t]+(.*)$")
_BULLET = re.compile(r"^([ \t]*)[-*+][ \t]+(.*)$")
_ORDERED = re.compile(r"^([ \t]*)(\d{1,9}[.)])[ \t]+(.*)$")
_TABLE_DELIMITER = re.compile(r"^[ \t]*\|?[ \t]*:?-+:?[ \t]*(?:\|[ \t]*:?-+:?[ \t]*)*\|?[ \t]*$")
_CELL_SPLIT = re.compile(r"(?<!\\)\|")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_AUTOLINK = re.compile(r"<((?:https?|mailto):[^\s<>]+)>")
# Slack's own user and channel references pass through; `<!here>`-style broadcasts do not.
_SLACK_REF = re.compile(r"<(?:@[UW][A-Z0-9]+|#C[A-Z0-9]+)(?:\|[^<>\n]*)?>")
_PUNCTUATION = frozenset("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")


def escape(text: str) -> str:
    """Slack's three control characters as entities (`&`, `<`, `>`)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def fence_marker(line: str) -> tuple[str, str] | None:
    """`(marker, info)` when `line` opens a fenced code block, else None."""
    m = _FENCE_OPEN.match(line)
    if m is None or (m.group(1)[0] == "`" and "`" in m.group(2)):
        return None  # "```x```" on one line is a code span, not a fence
    return m.group(1), m.group(2).strip()


def is_fence_close(line: str, marker: str) -> bool:
    """Whether `line` closes a block opened with `marker` (same character, at least as long)."""
    stripped = line.strip()
    return len(stripped) >= len(marker) and stripped == marker[0] * len(stripped)


def to_mrkdwn(markdown: str) -> str:
    """Slack mrkdwn for `markdown`, which may be cut off anywhere.

    Code (spans and fences) is kept verbatim except for entity escaping, which Slack applies
    to all text: unescaped, `<!here>` inside a code span would still notify everyone.
    """
    lines = _PRIVATE_USE.sub("\ufffd", markdown.replace("\r\n", "\n")).split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        fence = fence_marker(lines[i])
        if fence is not None:
            indent = len(lines[i]) - len(lines[i].lstrip(" \t"))
            body: list[str] = []
            i += 1
            while i < len(lines) and not is_fence_close(lines[i], fence[0]):
                body.append(_dedent(lines[i], indent))
                i += 1
            i += 1  # the closing fence, or past the end when the stream stopped inside
            out.append(_code_block(body))
            continue
        if i + 1 < len(lines) and _is_table_start(lines[i], lines[i + 1]):
            rows = [lines[i], lines[i + 1]]
            i += 2
            while i < len(lines) and "|" in lines[i] and lines[i].strip():
                rows.append(lines[i])
                i += 1
            out.append(_table(rows))
            continue
        out.append(_line(lines[i]))
        i += 1
    return "\n".join(out)


def _line(line: str) -> str:
    if not line.strip():
        return ""
    if m := _HEADING.match(line):
        title = _inline((m.group(1) or "").strip(), "heading")
        return f"*{title}*" if title else ""
    if _RULE.match(line):
        return "──────────"
    if m := _QUOTE.match(line):
        rest = _line(m.group(1))
        return f"> {rest}" if rest else ">"
    if m := _TASK.match(line):
        box = "☐" if m.group(2) == " " else "☑"
        return f"{m.group(1)}{box} {_inline(m.group(3), 'mrkdwn')}"
    if m := _BULLET.match(line):
        return f"{m.group(1)}• {_inline(m.group(2), 'mrkdwn')}"
    if m := _ORDERED.match(line):
        return f"{m.group(1)}{m.group(2)} {_inline(m.group(3), 'mrkdwn')}"
    return _inline(line.rstrip(), "mrkdwn")


def _dedent(line: str, indent: int) -> str:
    n = 0
    while n < indent and n < len(line) and line[n] in " \t":
        n += 1
    return line[n:]


def _code_block(body: list[str]) -> str:
    # A run of three backticks inside would end Slack's block early: break it with U+200B.
    text = "\n".join(re.sub("`{3,}", lambda m: "\u200b".join(m.group()), escape(x)) for x in body)
    return f"```\n{text}\n```"


def _is_table_start(header: str, delimiter: str) -> bool:
    return "|" in header and "|" in delimiter and _TABLE_DELIMITER.match(delimiter) is not None


def _cells(row: str) -> list[str]:
    s = row.strip()
    if s.startswith("|"):
        s = s[1:]
    if s.endswith("|") and not s.endswith("\\|"):
        s = s[:-1]
    return [c.strip() for c in _CELL_SPLIT.split(s)]


def _table(rows: list[str]) -> str:
    """A table as an aligned code block: mrkdwn has no tables."""
    aligns = []
    for spec in _cells(rows[1]):
        right, left = spec.endswith(":"), spec.startswith(":")
        aligns.append("center" if left and right else "right" if right else "left")
    grid = [[_inline(c, "plain", escaped=False) for c in _cells(r)] for r in [rows[0], *rows[2:]]]
    ncols = max(len(r) for r in grid)
    for r in grid:
        r.extend([""] * (ncols - len(r)))
    aligns.extend(["left"] * (ncols - len(aligns)))
    widths = [max(len(r[c]) for r in grid) for c in range(ncols)]

    def fmt(row: list[str]) -> str:
        cells = [_pad(cell, w, a) for cell, w, a in zip(row, widths, aligns, strict=True)]
        return " | ".join(cells).rstrip()

    lines = [fmt(grid[0]), "-+-".join("-" * w for w in widths), *(fmt(r) for r in grid[1:])]
    return _code_block(lines)


def _pad(cell: str, width: int, align: str) -> str:
    if align == "right":
        return cell.rjust(width)
    if align == "center":
        return cell.center(width)
    return cell.ljust(width)


def _inline(text: str, style: Style, *, escaped: bool = True) -> str:
    """One line's inline Markdown in `style`; `escaped=False` leaves `&<>` alone (for tables,
    which are padded before they are escaped as a whole)."""
    esc: Callable[[str], str] = escape if escaped else _same
    saved: list[str] = []

    def keep(rendered: str) -> str:
        saved.append(rendered)
        return chr(_PLACEHOLDER + len(saved) - 1)

    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "`":
            run = _run_length(text, i, "`")
            close = _find_run(text, i + run, run)
            if close < 0:
                out.append(text[i : i + run])  # unclosed: literal until the stream closes it
                i += run
                continue
            code = text[i + run : close]
            if len(code) > 2 and code[0] == code[-1] == " " and code.strip():
                code = code[1:-1]
            code = code.replace("`", "\u02cb")  # a modifier grave: Slack spans can't hold "`"
            out.append(keep(code if style == "plain" else f"`{esc(code)}`"))
            i = close + run
            continue
        if c == "\\" and i + 1 < n and text[i + 1] in _PUNCTUATION:
            literal = "\u02cb" if text[i + 1] == "`" else text[i + 1]  # "`" could open code
            out.append(keep(esc(literal)))
            i += 2
            continue
        if c == "[" or (c == "!" and text.startswith("[", i + 1)):
            link = _link(text, i + (c == "!"))
            if link is not None:
                label, url, end = link
                out.append(keep(_render_link(label, url, style, esc)))
                i = end
                continue
        if c == "<" and style != "plain":
            m = _SLACK_REF.match(text, i) or _AUTOLINK.match(text, i)
            if m is not None:
                token = m.group()
                out.append(keep(token if m.re is _SLACK_REF else f"<{_url(m.group(1))}>"))
                i = m.end()
                continue
        out.append(c)
        i += 1

    body = "".join(out)
    for pattern, mark in _EMPHASIS:
        body = pattern.sub(f"{mark}\\g<1>{mark[::-1]}", body)  # marks are control characters
    body = esc(body)
    for sentinel, mark in _MARKS[style].items():
        body = body.replace(sentinel, mark)
    return re.sub("[\ue000-\uf8ff]", lambda m: saved[ord(m.group()) - _PLACEHOLDER], body)


def _same(text: str) -> str:
    return text


def _run_length(text: str, i: int, char: str) -> int:
    j = i
    while j < len(text) and text[j] == char:
        j += 1
    return j - i


def _find_run(text: str, start: int, run: int) -> int:
    """Where the next backtick run of exactly `run` begins, or -1."""
    i = text.find("`", start)
    while i >= 0:
        length = _run_length(text, i, "`")
        if length == run:
            return i
        i = text.find("`", i + length)
    return -1


def _link(text: str, i: int) -> tuple[str, str, int] | None:
    """`[label](url "title")` at `i`: label, url and the end offset; None if not (yet) a link."""
    depth, j = 0, i
    while j < len(text):
        ch = text[j]
        if ch == "\\":
            j += 2
            continue
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth == 0:
                break
        j += 1
    else:
        return None
    label = text[i + 1 : j]
    if not text.startswith("(", j + 1):
        return None
    k = j + 2
    while k < len(text) and text[k] == " ":
        k += 1
    if text.startswith("<", k):
        end = text.find(">", k)
        if end < 0:
            return None
        url, k = text[k + 1 : end], end + 1
    else:
        start, parens = k, 0
        while k < len(text) and not text[k].isspace():
            if text[k] == "(":
                parens += 1
            elif text[k] == ")":
                if parens == 0:
                    break
                parens -= 1
            k += 1
        url = text[start:k]
    close = text.find(")", k)
    if close < 0 or text[k:close].strip()[:1] not in ("", '"', "'", "("):
        return None
    return label, url, close + 1


def _render_link(label: str, url: str, style: Style, esc: Callable[[str], str]) -> str:
    text = _inline(label, "plain", escaped=False).strip()
    if style == "plain" or not _SCHEME.match(url):
        return esc(f"{text} ({url})" if text and url else text or url)
    return f"<{_url(url)}|{escape(text)}>" if text else f"<{_url(url)}>"


def _url(url: str) -> str:
    """A url made safe inside Slack's `<url|label>`: `&` as an entity, the delimiters encoded."""
    return (
        url.replace("&", "&amp;")
        .replace("<", "%3C")
        .replace(">", "%3E")
        .replace("|", "%7C")
        .replace(" ", "%20")
    )
