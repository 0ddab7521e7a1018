"""Long answers in pieces that each fit one Slack message.

A `markdown` block takes a capped amount of text, so a long answer goes out as several
messages; a cut inside a code block would turn the rest into code, so each piece closes the
fence it cuts and the next opens it again. Cuts depend only on the text before them: a
streaming answer that grows never moves a cut already shown.
"""

from __future__ import annotations

from bot.rendering.mrkdwn import fence_marker, is_fence_close


def close_fence(markdown: str) -> str:
    """`markdown` with a fence the stream left open closed, so what follows is not code."""
    open_marker = None
    for line in markdown.split("\n"):
        if open_marker is None:
            fence = fence_marker(line)
            open_marker = fence[0] if fence else None
        elif is_fence_close(line, open_marker):
            open_marker = None
    return markdown if open_marker is None else f"{markdown}\n{open_marker}"


def split_markdown(text: str, limit: int) -> list[str]:
    """`text` in pieces of at most `limit` characters, cut at paragraph breaks, else at line
    breaks, else at a space. A piece that ends inside a code block closes it, and the next
    piece opens it again with the same fence. A piece depends only on the text up to the
    line it is cut in, so a growing stream does not move a cut once it exists.
    """
    pieces: list[str] = []
    reopen = ""
    rest = text
    while len(reopen + rest) > limit or len(close_fence(reopen + rest)) > limit:
        body = reopen + rest
        cut, fence, at_line = _cut(body, limit, len(reopen))
        if fence is not None:
            head = body[:cut] if body[:cut].endswith("\n") else body[:cut] + "\n"
            pieces.append(head + fence[0])
            reopen, rest = fence[1] + "\n", body[cut:]
        else:
            pieces.append(body[:cut].rstrip())
            reopen, rest = "", body[cut:].lstrip("\n" if at_line else " ")
    pieces.append(close_fence(reopen + rest))
    return pieces


def _cut(body: str, limit: int, floor: int) -> tuple[int, tuple[str, str] | None, bool]:
    """Where to cut `body` (past `floor`, which is the reopened fence), the fence
    `(marker, opening line)` open there, and whether the cut is at a line end."""
    fence: tuple[str, str] | None = None
    paragraph = line_end = 0
    line_fence: tuple[str, str] | None = None
    end = 0
    for line in body.split("\n"):
        start = end
        end = start + len(line) + 1
        before = fence
        if fence is None:
            opened = fence_marker(line)
            if opened is not None:
                marker, info = opened
                fence = (marker, marker + info if len(info) <= 40 else marker)
        elif is_fence_close(line, fence[0]):
            fence = None
        if end + (len(fence[0]) if fence else 0) > limit:
            break
        line_end, line_fence = min(end, len(body)), fence
        if fence is None and before is None and not line.strip() and end > floor:
            paragraph = min(end, len(body))
    if paragraph > floor and paragraph >= limit // 2:
        return paragraph, None, True
    if line_end > floor:
        return line_end, line_fence, True
    # Not one whole line fits: cut inside this one, at a space if there is one.
    reserve = len(before[0]) + 1 if before else 0
    hard = max(limit - reserve, floor + 1, start + 1)
    space = body.rfind(" ", max(start, floor) + 1, hard)
    return (space if space > 0 else hard), before, False
