"""A Slack message as the text a person reads in the channel: what the model is given.

The input is a message as `conversations.replies` or an event gives it: a person's, another
app's or an integration's (an alert). The output is plain text in Slack's reading order:

- the `blocks` (section with its fields, header, context, `rich_text` with its lists, quotes
  and code, buttons' labels, images named) or, when they render to nothing, `text`;
- then each legacy attachment: pretext, author, title with its link, text, every field as
  `title: value`, images named, buttons, footer; its `fallback` only when it has none of these.

Text vs blocks: when a message has blocks, Slack shows them and not its `text`, which is then
the notification fallback (Block Kit's rule for `chat.postMessage`); so `text` is read only
when the blocks give nothing, and an alert never reaches the model twice.

Inline, mrkdwn stays as it is (`*bold*`, `` `code` ``), but every `<…>` form is spelled out:
`<@U…>` as `@Name`, `<#C…|name>` as `#name`, `<!subteam^…|@team>` as `@team`, `<!here>` as
`@here`, `<url|label>` as `label (url)`; entities (`&amp;`) are decoded. Names come from a
mapping passed in (Slack id -> name): this module does no I/O. `wanted_ids` says which ids a
rendering looks up, so the caller can fetch just those. Every field may be missing or of
the wrong type: such a field is left out, never raised on.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

__all__ = ["attributed", "message_text", "poster", "readable", "strip_mention", "wanted_ids"]

Names = Mapping[str, str]
Message = Mapping[str, Any]

NOTHING = "(no text)"  # a message with nothing readable: said, so the model knows it is there
_ANGLE = re.compile(r"<([^<>]*)>")
_ENTITIES = (("&lt;", "<"), ("&gt;", ">"), ("&amp;", "&"))
_STYLE_MARKS = (("code", "`"), ("bold", "*"), ("italic", "_"), ("strike", "~"))


def attributed(msg: Message, names: Names, *, addressed_to: str | None = None) -> str:
    """`Name: text`: the message as the model sees it, its poster named."""
    return f"{poster(msg, names)}: {message_text(msg, names, addressed_to=addressed_to) or NOTHING}"


def poster(msg: Message, names: Names) -> str:
    """Who posted it, as Slack shows them: an app by the `username` it posted under or its
    profile's name, a person by their name; the id when nothing better is known."""
    user, bot_id = _str(msg.get("user")), _str(msg.get("bot_id"))
    if bot_id or msg.get("subtype") == "bot_message":
        profile = msg.get("bot_profile")
        profile_name = _str(profile.get("name")) if isinstance(profile, dict) else None
        name = _str(msg.get("username")) or profile_name or (bot_id and names.get(bot_id))
        if name:
            return name
    if user:
        return names.get(user) or user
    return bot_id or "someone"


def message_text(msg: Message, names: Names, *, addressed_to: str | None = None) -> str:
    """The message's body as a person reads it ('' when there is nothing to read).

    `addressed_to` (the app's user id) drops a leading mention of it: that is how the message
    reached the app, not what it says.
    """
    parts: list[str] = []
    body = _blocks(_strip_leading_user(msg.get("blocks"), addressed_to), names)
    if not body and isinstance(msg.get("text"), str):
        body = readable(strip_mention(msg["text"], addressed_to), names)
    parts.append(body)
    parts += (_attachment(a, names) for a in _dicts(msg.get("attachments")))
    return "\n".join(p for p in parts if p).strip()


def wanted_ids(messages: Iterable[Message], *, addressed_to: str | None = None) -> set[str]:
    """Every id (people, apps, channels, groups) whose name rendering `messages` looks up."""
    asking = _Asking()
    for msg in messages:
        attributed(msg, asking, addressed_to=addressed_to)
    return asking.asked


def strip_mention(text: str, bot_user: str | None) -> str:
    """The text without a leading `<@BOT>` (with or without a `|name` label)."""
    if bot_user:
        text = re.sub(rf"^\s*<@{re.escape(bot_user)}(?:\|[^>]*)?>[\s:,]*", "", text)
    return text.strip()


def readable(mrkdwn: str, names: Names) -> str:
    """mrkdwn with its `<…>` forms spelled out and its entities decoded."""
    out: list[str] = []
    pos = 0
    for match in _ANGLE.finditer(mrkdwn):
        out += [_unescape(mrkdwn[pos : match.start()]), _angle(match.group(1), names)]
        pos = match.end()
    out.append(_unescape(mrkdwn[pos:]))
    return "".join(out)


# -- inline forms ----------------------------------------------------------------------------


def _angle(inner: str, names: Names) -> str:
    target, _, label = inner.partition("|")
    label = _unescape(label)
    if target.startswith("@"):
        return "@" + (names.get(target[1:]) or label.lstrip("@") or target[1:])
    if target.startswith("#"):
        return "#" + (names.get(target[1:]) or label or target[1:])
    if target.startswith("!subteam^"):
        group = target.removeprefix("!subteam^")
        return "@" + (names.get(group) or label.lstrip("@") or group)
    if target.startswith("!date^"):
        return label or target
    if target.startswith("!"):
        return "@" + (label.lstrip("@") or target[1:])  # here, channel, everyone
    return _link(_unescape(target), label)


def _link(url: str, label: str) -> str:
    """`label (url)`, or just the url when the label only repeats it."""
    bare = re.sub(r"^(?:[a-z][a-z0-9+.-]*:)(?://)?", "", url, flags=re.I)
    if not label or label in (url, bare, bare.rstrip("/")):
        return bare if url.startswith("mailto:") else url
    return f"{label} ({url})"


def _unescape(text: str) -> str:
    for entity, char in _ENTITIES:
        text = text.replace(entity, char)
    return text


# -- blocks ----------------------------------------------------------------------------------


def _blocks(blocks: Any, names: Names) -> str:
    return "\n".join(t for t in (_block(b, names) for b in _dicts(blocks)) if t)


def _block(block: Mapping[str, Any], names: Names) -> str:
    kind = block.get("type")
    if kind == "section":
        lines = [_text_object(block.get("text"), names)]
        lines += (_text_object(f, names) for f in _dicts(block.get("fields")))
        lines.append(_element(block.get("accessory"), names))
        return "\n".join(line for line in lines if line)
    if kind == "header":
        return _text_object(block.get("text"), names)
    if kind == "context":
        texts = (_text_object(e, names) for e in _dicts(block.get("elements")))
        return "  ".join(t for t in texts if t)
    if kind == "actions":
        labels = (_element(e, names) for e in _dicts(block.get("elements")))
        return " ".join(label for label in labels if label)
    if kind == "rich_text":
        return _rich_text(block.get("elements"), names)
    if kind == "image":
        return _image(block)
    if kind == "markdown":
        return _str(block.get("text")) or ""
    if kind == "video":
        return f"[video: {_text_object(block.get('title'), names) or 'untitled'}]"
    return ""  # divider, input, file, and kinds newer than this module


def _text_object(obj: Any, names: Names) -> str:
    """A text object: mrkdwn is made readable, plain_text is taken as it is."""
    if not isinstance(obj, Mapping) or obj.get("type") not in ("mrkdwn", "plain_text"):
        return ""
    text = _str(obj.get("text")) or ""
    return readable(text, names).strip() if obj["type"] == "mrkdwn" else text.strip()


def _element(element: Any, names: Names) -> str:
    """An interactive element as a person sees it: a button's label (and where it leads)."""
    if not isinstance(element, Mapping):
        return ""
    if element.get("type") == "button":
        label = _text_object(element.get("text"), names)
        url = _str(element.get("url"))
        return f"[{label}]" + (f" ({url})" if url else "") if label else ""
    if element.get("type") == "image":
        return _image(element)
    return ""  # selects, overflow menus, pickers: no text of their own to read


def _image(image: Mapping[str, Any]) -> str:
    """Named, never described: the model has not seen it."""
    alt = _str(image.get("alt_text")) or ""
    return f"[image: {alt}]" if alt else "[image]"


# -- rich_text -------------------------------------------------------------------------------


def _rich_text(elements: Any, names: Names) -> str:
    parts: list[str] = []
    for element in _dicts(elements):
        kind = element.get("type")
        inner = element.get("elements")
        if kind == "rich_text_section":
            parts.append(_inline(inner, names))
        elif kind == "rich_text_list":
            parts.append(_rich_list(element, names))
        elif kind == "rich_text_preformatted":
            parts.append("```\n" + _inline(inner, names, code=True).strip("\n") + "\n```")
        elif kind == "rich_text_quote":
            quoted = _inline(inner, names).strip("\n").split("\n")
            parts.append("\n".join(f"> {line}" for line in quoted))
    return "\n".join(p.strip("\n") for p in parts if p.strip())


def _rich_list(element: Mapping[str, Any], names: Names) -> str:
    indent = element.get("indent")
    pad = "  " * indent if isinstance(indent, int) and 0 < indent < 10 else ""
    offset = element.get("offset")
    start = offset if isinstance(offset, int) and offset >= 0 else 0
    ordered = element.get("style") == "ordered"
    items = []
    for i, item in enumerate(_dicts(element.get("elements"))):
        mark = f"{start + i + 1}." if ordered else "-"
        items.append(f"{pad}{mark} {_inline(item.get('elements'), names).strip()}")
    return "\n".join(items)


def _inline(elements: Any, names: Names, *, code: bool = False) -> str:
    return "".join(_inline_one(e, names, code) for e in _dicts(elements))


def _inline_one(element: Mapping[str, Any], names: Names, code: bool) -> str:
    kind = element.get("type")
    if kind == "text":
        return _styled(_str(element.get("text")) or "", element.get("style"), code)
    if kind == "link":
        url = _str(element.get("url")) or ""
        return _link(url, _str(element.get("text")) or "") if url else ""
    if kind == "user":
        return _named("@", _str(element.get("user_id")), names)
    if kind == "usergroup":
        return _named("@", _str(element.get("usergroup_id")), names)
    if kind == "channel":
        return _named("#", _str(element.get("channel_id")), names)
    if kind == "team":
        return _named("", _str(element.get("team_id")), names)
    if kind == "broadcast":
        return "@" + (_str(element.get("range")) or "here")
    if kind == "emoji":
        return _emoji(element)
    if kind == "date":
        return _str(element.get("fallback")) or _date(element.get("timestamp"))
    if kind == "color":
        return _str(element.get("value")) or ""
    return _str(element.get("text")) or ""  # newer inline kinds that carry a text


def _named(sigil: str, ref: str | None, names: Names) -> str:
    return sigil + (names.get(ref) or ref) if ref else ""


def _styled(text: str, style: Any, code: bool) -> str:
    """Rich text's styles as mrkdwn marks, as Slack's own `text` writes them."""
    core = text.strip()
    if not core or not isinstance(style, Mapping) or code:
        return text
    lead, trail = text[: len(text) - len(text.lstrip())], text[len(text.rstrip()) :]
    for name, mark in _STYLE_MARKS:
        if style.get(name) is True:
            core = f"{mark}{core}{mark}"
    return lead + core + trail


def _emoji(element: Mapping[str, Any]) -> str:
    code = _str(element.get("unicode"))
    if code:
        try:
            return "".join(chr(int(point, 16)) for point in code.split("-"))
        except (ValueError, OverflowError):
            pass
    name = _str(element.get("name"))
    return f":{name}:" if name else ""


def _date(timestamp: Any) -> str:
    if isinstance(timestamp, int | float) and not isinstance(timestamp, bool):
        try:
            return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%d %H:%M UTC")
        except (OverflowError, OSError, ValueError):
            return ""
    return ""


def _strip_leading_user(blocks: Any, user: str | None) -> Any:
    """`blocks` without a leading mention of `user` in its first rich_text (a copy)."""
    if not user or not isinstance(blocks, list) or not blocks:
        return blocks
    first = blocks[0]
    if not isinstance(first, dict) or first.get("type") != "rich_text":
        return blocks
    sections = first.get("elements")
    if not isinstance(sections, list) or not sections:
        return blocks
    section = sections[0]
    inline = section.get("elements") if isinstance(section, dict) else None
    if not isinstance(inline, list) or not inline:
        return blocks
    lead = inline[0]
    if not (isinstance(lead, dict) and lead.get("type") == "user" and lead.get("user_id") == user):
        return blocks
    rest = list(inline[1:])
    if rest and isinstance(rest[0], dict) and rest[0].get("type") == "text":
        text = str(rest[0].get("text") or "").lstrip(" \t:,")
        rest[0] = {**rest[0], "text": text}
    section = {**section, "elements": rest}
    return [{**first, "elements": [section, *sections[1:]]}, *blocks[1:]]


# -- attachments -----------------------------------------------------------------------------


def _attachment(att: Mapping[str, Any], names: Names) -> str:
    """One legacy attachment, in the order Slack lays it out."""

    def text(value: Any) -> str:
        return readable(value, names).strip() if isinstance(value, str) else ""

    def linked(label_key: str, url_key: str) -> str:
        label, url = text(att.get(label_key)), _str(att.get(url_key))
        return _link(url, label) if label and url else label

    lines = [text(att.get("pretext")), linked("author_name", "author_link")]
    lines += [linked("title", "title_link"), text(att.get("text"))]
    for field in _dicts(att.get("fields")):
        name, value = text(field.get("title")), text(field.get("value"))
        lines.append(f"{name}: {value}" if name else value)
    lines.append(_blocks(att.get("blocks"), names))
    image = _str(att.get("image_url"))
    lines.append(f"[image: {image}]" if image else "")
    lines.append(" ".join(_element({"type": "button", **a}, names) for a in _buttons(att)))
    lines.append(text(att.get("footer")))
    lines = [line for line in lines if line.strip()]
    return "\n".join(lines) if lines else text(att.get("fallback"))


def _buttons(att: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """A legacy attachment's `actions` as Block Kit buttons (their label is plain `text`)."""
    for action in _dicts(att.get("actions")):
        label = _str(action.get("text"))
        if label:
            yield {"text": {"type": "plain_text", "text": label}, "url": action.get("url")}


# -- reading fields --------------------------------------------------------------------------


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _dicts(value: Any) -> Iterator[Mapping[str, Any]]:
    if isinstance(value, list):
        yield from (item for item in value if isinstance(item, Mapping))


class _Asking(Mapping[str, str]):
    """A names mapping that knows none, and records every id it was asked for."""

    def __init__(self) -> None:
        self.asked: set[str] = set()

    def __getitem__(self, key: str) -> str:
        self.asked.add(key)
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0
