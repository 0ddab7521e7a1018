"""Files to and from Slack: a message's files downloaded, the agent's images uploaded.

Downloads GET `url_private_download` with the bot token (`files:read`), each in the
workspace's governor (`files.download`) and under a deadline; the size is checked from
`Content-Length` before the body is read, and again while reading, so a file over its limit
is never read whole (a text file is read up to its limit and cut there). What Slack answers
instead of the file (an error status, or its sign-in page: HTML with status 200, which is
what a token without `files:read` gets) is a `FileRefused` naming why, which the caller
turns into a note for the model.

Uploads go through slack_sdk's `files_upload_v2` (files.getUploadURLExternal, the bytes,
files.completeUploadExternal; `files:write`), into the turn's thread.
"""

from __future__ import annotations

import asyncio

import aiohttp
from slack_sdk.web.async_client import AsyncWebClient

from bot.rendering.files import FilePlan, is_sign_in, size_text
from bot.slack.governor import RateGovernor
from bot.slack.webapi import slack_error, slot_for
from engine.errors import describe

__all__ = ["DOWNLOAD", "DOWNLOAD_SECONDS", "FileRefused", "download", "upload"]

DOWNLOAD = "files.download"  # the governor's name for file downloads
DOWNLOAD_SECONDS = 30.0  # one download, from asking to the last byte
UPLOAD_SECONDS = 60.0
_CHUNK = 64 * 1024
SIGN_IN = "Slack answered its sign-in page instead of the file (the app lacks files:read)"


class FileRefused(Exception):
    """A file that could not be read; the message says why, in a few words."""


async def download(
    http: aiohttp.ClientSession,
    governor: RateGovernor,
    team: str,
    token: str,
    plan: FilePlan,
    *,
    timeout: float = DOWNLOAD_SECONDS,
) -> tuple[bytes, int | None]:
    """The file's bytes (a text file's first `plan.limit`), and its whole size when known.

    Raises:
        FileRefused: Slack did not give the file (why in the message); an image or PDF
            over its limit.
    """
    assert plan.url is not None
    await slot_for(governor, team, DOWNLOAD)
    try:
        async with asyncio.timeout(timeout):
            return await _read(http, token, plan)
    except TimeoutError:
        raise FileRefused(f"the download took over {timeout:g} s") from None
    except aiohttp.ClientError as err:
        raise FileRefused(f"the download failed ({describe(err)})") from None


async def _read(
    http: aiohttp.ClientSession, token: str, plan: FilePlan
) -> tuple[bytes, int | None]:
    assert plan.url is not None
    headers = {"Authorization": f"Bearer {token}"}
    async with http.get(plan.url, headers=headers) as response:
        if response.status != 200:
            raise FileRefused(f"Slack answered HTTP {response.status}")
        if is_sign_in(response.headers.get("Content-Type", ""), plan):
            raise FileRefused(SIGN_IN)
        length = response.content_length
        whole = plan.kind != "text"  # an image or a PDF is read whole or not at all
        too_big = f"it is over {size_text(plan.limit)}"
        if whole and length is not None and length > plan.limit:
            raise FileRefused(too_big)
        data = bytearray()
        async for chunk in response.content.iter_chunked(_CHUNK):
            data += chunk
            if len(data) > plan.limit:
                if whole:
                    raise FileRefused(too_big)
                break  # a text file: cut here; the rest is not read
        total = length if length is not None else plan.size
        if len(data) > plan.limit and total is None:
            total = len(data)  # at least: said as "more left out"
        return bytes(data), total


async def upload(
    web: AsyncWebClient,
    governor: RateGovernor,
    team: str,
    channel: str,
    thread_ts: str,
    filename: str,
    data: bytes,
    *,
    timeout: float = UPLOAD_SECONDS,
) -> str | None:
    """Upload `data` into the thread; None when it landed, else why not (Slack's error code,
    or what went wrong), for a note in the thread."""
    await slot_for(governor, team, "files.getUploadURLExternal")
    await slot_for(governor, team, "files.completeUploadExternal")
    try:
        async with asyncio.timeout(timeout):
            await web.files_upload_v2(
                channel=channel, thread_ts=thread_ts, filename=filename, content=data
            )
    except TimeoutError:
        return f"the upload took over {timeout:g} s"
    except Exception as err:  # Slack's refusal or a transport failure: a note, not a failure
        return slack_error(err) or describe(err)
    return None
