"""One agent's Slack app: what the listeners and the turn followers need to know of it.

Its own module so the listeners (bot/slack/listeners.py) and the followers
(bot/threads/follower.py) can name it without importing the wiring that builds it.
"""

from __future__ import annotations

from dataclasses import dataclass

from slack_bolt.async_app import AsyncApp
from slack_sdk.signature import SignatureVerifier
from slack_sdk.web.async_client import AsyncWebClient


@dataclass
class Bot:
    """One agent's Slack app."""

    agent: str
    answers: str
    app: AsyncApp
    web: AsyncWebClient
    app_token: str | None = None  # set: Socket Mode; else the HTTP Events API
    native: bool = False  # stream replies with chat.startStream/appendStream/stopStream
    verifier: SignatureVerifier | None = None  # HTTP only: signatures, before Bolt reads
