"""The shapes of what Slack sends the bot, as the listeners and the renderers read them.

Types only: these say which fields the bot reads, not that they are there. Every payload
comes from outside, so each is `total=False` and its readers still check each value's type
before use (bot/turns/routing.py, bot/turns/listeners.py). Only the fields the bot reads
are named; Slack sends more. Any layer of `bot/` may import this module: it imports
nothing of ours.

Sources (Slack's documentation):
- the Events API envelope: https://api.slack.com/apis/events-api#callback-field
- `app_mention` and `message` events: https://api.slack.com/events/app_mention,
  https://api.slack.com/events/message (`conversations.replies` returns the same message
  objects: https://api.slack.com/methods/conversations.replies)
- message metadata (our reply stamps): https://api.slack.com/metadata
- slash commands: https://api.slack.com/interactivity/slash-commands#app_command_handling
- `block_actions`: https://api.slack.com/reference/interaction-payloads/block-actions
"""

from __future__ import annotations

from typing import Any, TypedDict


class SlackMessage(TypedDict, total=False):
    """A message: an `app_mention` or `message` event, or one of `conversations.replies`."""

    type: str  # "app_mention" | "message"
    subtype: str  # absent for a person's plain message; "bot_message", "message_changed", ...
    channel: str
    channel_type: str  # "im" for the app's DM
    user: str  # the poster, a person's id (absent on an integration's message)
    bot_id: str  # an app's or integration's messages
    username: str  # an integration's display name (`bot_message`)
    bot_profile: dict[str, Any]
    text: str
    ts: str  # "seconds.micros", the message's id in its channel
    thread_ts: str  # the thread's root ts, when in a thread
    edited: dict[str, Any]  # present on an edited message: no new question
    blocks: list[dict[str, Any]]
    attachments: list[dict[str, Any]]
    files: list[dict[str, Any]]
    metadata: dict[str, Any]  # {event_type, event_payload}: our reply stamps (bot/slack/parts.py)
    team: str


class EventCallback(TypedDict, total=False):
    """The Events API envelope Bolt hands an event listener as `body`."""

    type: str  # "event_callback"
    team_id: str
    api_app_id: str
    event: SlackMessage
    event_id: str  # unique per event: the dedupe key of a retried delivery
    event_time: int


class SlashCommand(TypedDict, total=False):
    """A slash command's form fields (Bolt parses the form into this dict)."""

    command: str  # "/deploy"
    text: str
    user_id: str
    channel_id: str
    team_id: str
    response_url: str
    trigger_id: str


class IdRef(TypedDict, total=False):
    """`{"id": ...}` (and more) as `user`, `team` and `channel` are given in interactions."""

    id: str


class Container(TypedDict, total=False):
    """Where the clicked element is: for a message, its channel, ts and thread."""

    type: str  # "message"
    channel_id: str
    message_ts: str
    thread_ts: str
    is_ephemeral: bool


class BlockAction(TypedDict, total=False):
    """One entry of a `block_actions` payload's `actions`: the element clicked."""

    type: str  # "button"
    action_id: str
    block_id: str
    value: str
    action_ts: str


class BlockActions(TypedDict, total=False):
    """A `block_actions` interaction payload, as Bolt hands an action listener `body`."""

    type: str  # "block_actions"
    user: IdRef
    team: IdRef
    channel: IdRef
    container: Container
    actions: list[BlockAction]
    trigger_id: str
    response_url: str
    message: SlackMessage


class Mention(TypedDict):
    """A mention or DM as a checkpoint records it, to build the turn's input from later."""

    event: SlackMessage
    bot_user: str | None
    bot_id: str | None
