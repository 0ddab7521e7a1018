"""Interrupt prompts in Slack (SPEC §8, §14): the message asking a person to choose, the
click read back, and the message rewritten to say who answered.

A button carries its option's index, never its value: the value a click resumes with is the
one the engine recorded, so a forged click cannot inject one.

Limits used: button text <= 75 characters, `action_id` and `block_id` <= 255, `value`
<= 2,000; an actions block holds at most 25 elements.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from bot.rendering.layout import FALLBACK_LIMIT, MARKDOWN_BLOCK_LIMIT, clip, clip_mrkdwn, context
from bot.rendering.mrkdwn import escape, to_mrkdwn
from bot.rendering.split import split_markdown

log = logging.getLogger(__name__)
BUTTON_TEXT_LIMIT = 75
ID_LIMIT = 255
ACTIONS_LIMIT = 25
ACTION_PREFIX = "subs_interrupt"
_EXPIRY_PREFIX = "subs_expiry"


def interrupt_prompt(
    interrupt_id: str, payload: dict[str, Any] | None, reason: str
) -> dict[str, Any]:
    """The message asking a person to answer an interrupt: `{"text", "blocks"}`.

    One button per `metadata.options` entry. A button carries the option's index, never its
    value, so a click can only pick an option the engine recorded.

    Raises:
        ValueError: when the interrupt id makes an `action_id` longer than Slack takes.
    """
    payload = payload or {}
    longest = f"{ACTION_PREFIX}:{interrupt_id}:{ACTIONS_LIMIT}"
    if len(longest) > ID_LIMIT:
        raise ValueError(f"interrupt id too long for a Slack action_id: {interrupt_id!r}")
    message = payload.get("message")
    blocks: list[dict[str, Any]] = []
    if message:
        pieces = split_markdown(message, MARKDOWN_BLOCK_LIMIT - 100)
        shown = pieces[0] + ("\n\n…" if len(pieces) > 1 else "")
        blocks.append({"type": "markdown", "text": shown})
        text = to_mrkdwn(split_markdown(message, FALLBACK_LIMIT // 2)[0])
    else:
        text = f"*Paused:* {escape(clip(reason, 2_900))}"
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": text}})
    buttons = _buttons(interrupt_id, payload.get("metadata"))
    if buttons:
        blocks.append(
            {"type": "actions", "block_id": f"{ACTION_PREFIX}:{interrupt_id}", "elements": buttons}
        )
    expires = payload.get("expiresAt")
    if expires:
        blocks.append(
            {
                "type": "context",
                "block_id": f"{_EXPIRY_PREFIX}:{interrupt_id}"[:ID_LIMIT],
                "elements": [{"type": "mrkdwn", "text": _expiry(str(expires))}],
            }
        )
    return {"text": clip_mrkdwn(text, FALLBACK_LIMIT), "blocks": blocks}


def _buttons(interrupt_id: str, metadata: Any) -> list[dict[str, Any]]:
    options = metadata.get("options") if isinstance(metadata, dict) else None
    if not isinstance(options, list):
        return []
    buttons = []
    primary = False
    for index, option in enumerate(options[:ACTIONS_LIMIT]):
        if not isinstance(option, dict):
            continue
        label = clip(" ".join(str(option.get("label") or "").split()), BUTTON_TEXT_LIMIT)
        button: dict[str, Any] = {
            "type": "button",
            "action_id": f"{ACTION_PREFIX}:{interrupt_id}:{index}",
            "value": str(index),
            "text": {"type": "plain_text", "text": label or f"Option {index + 1}", "emoji": True},
        }
        style = option.get("style")
        # Slack's guidance: one primary button per set; later ones show plain.
        if style == "danger" or (style == "primary" and not primary):
            button["style"] = style
            primary = primary or style == "primary"
        buttons.append(button)
    return buttons


def _expiry(expires: str) -> str:
    """`Expires …` in the reader's own time zone (Slack date token), the raw value as fallback."""
    try:
        at = datetime.fromisoformat(expires)
    except ValueError:
        return f"Expires {escape(expires)}"
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    stamp = int(at.timestamp())
    return f"Expires <!date^{stamp}^{{date_short_pretty}} at {{time}}|{escape(expires)}>"


def parse_interrupt_action(action: dict[str, Any]) -> tuple[str, int] | None:
    """`(interrupt_id, option index)` from a block_actions `actions[]` entry of a prompt
    button, or None when the action is not one (or its id and value disagree)."""
    action_id = str(action.get("action_id") or "")
    prefix = f"{ACTION_PREFIX}:"
    if not action_id.startswith(prefix):
        return None
    interrupt_id, _, index = action_id[len(prefix) :].rpartition(":")
    if not interrupt_id or not index.isdigit() or action.get("value") != index:
        return None
    return interrupt_id, int(index)


def resolved_prompt(
    original: dict[str, Any], label: str | None, user: str, approved: bool
) -> dict[str, Any]:
    """`original` (an `interrupt_prompt` result or the posted message) without its buttons
    and expiry, saying who answered: `{"text", "blocks"}` for `chat.update`."""
    verdict = f"{'✅ Approved' if approved else '❌ Declined'} by <@{escape(user)}>"
    if label:
        verdict += f" · {escape(clip(label, BUTTON_TEXT_LIMIT))}"
    return _closed(original, verdict)


EXPIRED = "⌛ Expired: nobody answered in time, so it was declined"


def expired_prompt(original: dict[str, Any]) -> dict[str, Any]:
    """`original` without its buttons and expiry, saying it expired (the engine resolved it
    as declined at its `expiresAt`): `{"text", "blocks"}` for `chat.update`."""
    return _closed(original, EXPIRED)


def _closed(original: dict[str, Any], verdict: str) -> dict[str, Any]:
    blocks = [
        b
        for b in original.get("blocks") or []
        if b.get("type") != "actions"
        and not str(b.get("block_id") or "").startswith(_EXPIRY_PREFIX)
    ]
    blocks.append(context(verdict))
    text = clip_mrkdwn(str(original.get("text") or ""), FALLBACK_LIMIT - 200)
    return {"text": f"{text}\n{verdict}" if text else verdict, "blocks": blocks}


def prompt_for(interrupt: dict[str, Any]) -> dict[str, Any] | None:
    """The prompt message for a recorded interrupt; None when Slack cannot carry its id."""
    payload = interrupt.get("payload")
    try:
        return interrupt_prompt(
            str(interrupt["interrupt_id"]),
            payload if isinstance(payload, dict) else None,
            str(interrupt.get("reason") or ""),
        )
    except ValueError as err:
        log.warning("slack prompt not shown: %s", err)
        return None


def option_of(interrupt: dict[str, Any] | None, index: int) -> dict[str, Any] | None:
    """Option `index` of an interrupt's `metadata.options`, when there is such a dict."""
    payload = (interrupt or {}).get("payload")
    metadata = payload.get("metadata") if isinstance(payload, dict) else None
    options = metadata.get("options") if isinstance(metadata, dict) else None
    if not isinstance(options, list) or index >= len(options):
        return None
    option = options[index]
    return option if isinstance(option, dict) else None
