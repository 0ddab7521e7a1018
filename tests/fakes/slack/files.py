"""The fake's files: people share files in messages; the app downloads and uploads them.

What Slack does, from notes/oncall-facts.md §2.2 and notes/slack-facts.md (files):
- A message with files is `subtype: file_share` with a `files[]` of file objects (`id`,
  `name`, `title`, `mimetype`, `filetype`, `pretty_type`, `user`, `size`, `mode`,
  `is_external`, `url_private`, `url_private_download`, `permalink`; docs.slack.dev/reference/
  objects/file-object; bolt-python #644).
- `url_private_download` is fetched with `Authorization: Bearer <token>`; the token needs
  `files:read`. Without it Slack answers no 401 but its sign-in page, HTML with status 200
  (seratch/ChatGPT-in-Slack app/slack_ops.py `download_slack_image_content` checks for it).
- Uploads (`files_upload_v2`): files.getUploadURLExternal (`filename`, `length`; returns
  `upload_url`, `file_id`), the bytes POSTed to that URL (answered `OK - <length>`, status
  200), then files.completeUploadExternal (`files` = JSON `[{id, title}]`, `channel_id`,
  `thread_ts`, `initial_comment`), which shares the files in the channel or thread; scope
  `files:write` (docs.slack.dev/reference/methods/files.getUploadURLExternal and
  files.completeUploadExternal; slack_sdk async_client.files_upload_v2).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.fakes.slack.model import Channel, Ctx, Message, User
from tests.fakes.slack.rules import SlackError

# What a browser (or a token without files:read) gets at a file's URL: Slack's sign-in page.
SIGN_IN_PAGE = (
    "<!DOCTYPE html><html lang='en'><head><title>Slack</title></head>"
    "<body><h1>Sign in to Fake Team</h1><form action='/signin'></form></body></html>"
)


@dataclass
class StoredFile:
    id: str
    team: str
    user: str
    name: str
    mimetype: str
    filetype: str
    pretty_type: str
    data: bytes
    served_as: str  # the Content-Type its download answers with
    title: str = ""
    uploaded: bool = True  # False: an upload whose bytes have not arrived yet
    downloads: int = 0


@dataclass
class FilesState:
    files: dict[str, StoredFile] = field(default_factory=dict)
    uploads: dict[str, str] = field(default_factory=dict)  # upload ticket -> file id
    signin_pages: int = 0  # downloads answered with the sign-in page


class FileMethods:
    """The file methods and routes of `FakeSlack` (mixed into it)."""

    # --- world building ---------------------------------------------------------------

    def add_file(
        self,
        name: str,
        data: bytes,
        mimetype: str,
        *,
        filetype: str = "",
        pretty_type: str = "",
        user: User | None = None,
        served_as: str | None = None,
    ) -> dict[str, Any]:
        """A file someone uploaded; returns its file object as events show it."""
        user = user or self.user
        stored = StoredFile(
            id=self._id("F"),
            team=user.team,
            user=user.id,
            name=name,
            mimetype=mimetype,
            filetype=filetype or name.rpartition(".")[2].lower(),
            pretty_type=pretty_type or mimetype,
            data=data,
            served_as=served_as or mimetype,
            title=name,
        )
        self.file_state.files[stored.id] = stored
        return self.file_object(stored)

    def file_object(self, f: StoredFile) -> dict[str, Any]:
        url = f"{self.base}/files-pri/{f.team}-{f.id}/{f.name}"
        return {
            "id": f.id,
            "created": 1700000000,
            "timestamp": 1700000000,
            "name": f.name,
            "title": f.title or f.name,
            "mimetype": f.mimetype,
            "filetype": f.filetype,
            "pretty_type": f.pretty_type,
            "user": f.user,
            "user_team": f.team,
            "editable": False,
            "size": len(f.data),
            "mode": "hosted",
            "is_external": False,
            "external_type": "",
            "is_public": False,
            "public_url_shared": False,
            "display_as_bot": False,
            "username": "",
            "url_private": url,
            "url_private_download": f"{self.base}/files-pri/{f.team}-{f.id}/download/{f.name}",
            "permalink": f"https://fake.slack.com/files/{f.user}/{f.id}/{f.name}",
            "has_rich_preview": False,
            "file_access": "visible",
        }

    def host_file(self, obj: dict[str, Any], team: str) -> dict[str, Any]:
        """A file object an integration's payload names (an alert's panel image), hosted by
        the fake: bytes of its `size` (a PNG's signature first, for an image) at the fake's
        own URLs, so a download never leaves the machine."""
        size = int(obj.get("size") or 0)
        head = b"\x89PNG\r\n\x1a\n" if str(obj.get("mimetype")) == "image/png" else b""
        stored = StoredFile(
            id=str(obj.get("id") or self._id("F")),
            team=team,
            user=str(obj.get("user") or ""),
            name=str(obj.get("name") or "file"),
            mimetype=str(obj.get("mimetype") or "application/octet-stream"),
            filetype=str(obj.get("filetype") or ""),
            pretty_type=str(obj.get("pretty_type") or ""),
            data=(head + bytes(size))[: max(size, len(head))],
            served_as=str(obj.get("mimetype") or "application/octet-stream"),
            title=str(obj.get("title") or ""),
        )
        self.file_state.files[stored.id] = stored
        return {
            **obj,
            **{k: self.file_object(stored)[k] for k in ("url_private", "url_private_download")},
        }

    def post_files(
        self,
        channel: Channel | str,
        files: list[dict[str, Any]],
        text: str = "",
        *,
        user: User | None = None,
        thread_ts: str | None = None,
    ) -> Message:
        """A person shares `files` (from `add_file`), with `text` or none (`file_share`)."""
        msg = self.post_as_user(channel, text, user=user, thread_ts=thread_ts)
        if not text:
            msg.blocks = []
        msg.extra.update(subtype="file_share", files=files, upload=False, display_as_bot=False)
        return msg

    def shared_files(self, channel: str, thread_ts: str) -> list[StoredFile]:
        """The files shared in a thread (uploads included), oldest first."""
        found = []
        for msg in self.thread(channel, thread_ts):
            for obj in msg.extra.get("files") or ():
                found.append(self.file_state.files[obj["id"]])
        return found

    # --- downloads ---------------------------------------------------------------------

    async def _download(self, request: web.Request) -> web.StreamResponse:
        """GET url_private(_download): the bytes for a bot token with files:read, else the
        sign-in page (HTML, status 200)."""
        team_id, _, file_id = request.match_info["ref"].partition("-")
        f = self.file_state.files.get(file_id)
        auth = request.headers.get("Authorization", "")
        token = auth[len("Bearer ") :].strip() if auth.startswith("Bearer ") else None
        team = next((t for t in self.teams.values() if t.bot_token == token), None)
        if f is None or f.team != team_id or not f.uploaded:
            return web.Response(status=404, text="Not Found")
        if team is None or team.id != team_id or "files:read" not in self.scopes.split(","):
            self.file_state.signin_pages += 1
            self._changed.set()
            return web.Response(text=SIGN_IN_PAGE, content_type="text/html", charset="utf-8")
        f.downloads += 1
        self._changed.set()
        return web.Response(body=f.data, headers={"Content-Type": f.served_as})

    # --- uploads -----------------------------------------------------------------------

    def _get_upload_url(self, ctx: Ctx) -> dict[str, Any]:
        assert ctx.team is not None
        self._needs("files:write")
        filename = str(ctx.args.get("filename") or "")
        length = str(ctx.args.get("length") or "")
        if not filename or not length.isdigit():
            raise SlackError("invalid_arguments")
        stored = StoredFile(
            id=self._id("F"),
            team=ctx.team.id,
            user=ctx.team.bot_user,
            name=filename,
            mimetype="",
            filetype=filename.rpartition(".")[2].lower(),
            pretty_type="",
            data=b"",
            served_as="application/octet-stream",
            uploaded=False,
        )
        self.file_state.files[stored.id] = stored
        ticket = uuid.uuid4().hex
        self.file_state.uploads[ticket] = stored.id
        return {"upload_url": f"{self.base}/upload/v1/{ticket}", "file_id": stored.id}

    async def _upload(self, request: web.Request) -> web.Response:
        file_id = self.file_state.uploads.pop(request.match_info["ticket"], None)
        if file_id is None:
            return web.Response(status=404, text="Not Found")
        f = self.file_state.files[file_id]
        f.data = await request.read()
        f.uploaded = True
        f.mimetype = f.served_as = _sniff(f.data)
        f.pretty_type = f.mimetype.split("/")[-1].upper()
        return web.Response(text=f"OK - {len(f.data)}")

    def _complete_upload(self, ctx: Ctx) -> dict[str, Any]:
        assert ctx.team is not None
        self._needs("files:write")
        files = ctx.args.get("files")
        if isinstance(files, str):
            try:
                files = json.loads(files)
            except ValueError:
                raise SlackError("invalid_json") from None
        if not isinstance(files, list) or not files:
            raise SlackError("invalid_arguments")
        stored = []
        for item in files:
            f = self.file_state.files.get(str((item or {}).get("id") or ""))
            if f is None or not f.uploaded or f.team != ctx.team.id:
                raise SlackError("file_not_found")
            f.title = str(item.get("title") or f.name)
            stored.append(f)
        channel_id = ctx.args.get("channel_id")
        if channel_id:
            channel = self._channel(ctx, channel_id)
            msg = self._bot_message(ctx, channel, ctx.args.get("thread_ts"))
            msg.text = str(ctx.args.get("initial_comment") or "")
            msg.extra.update(
                subtype="file_share", files=[self.file_object(f) for f in stored], upload=True
            )
            self._store(msg)
        return {"files": [{"id": f.id, "title": f.title} for f in stored]}


def _sniff(data: bytes) -> str:
    """The type Slack shows for uploaded bytes, from their magic numbers."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data.startswith(b"%PDF-"):
        return "application/pdf"
    return "application/octet-stream"
