"""The chat.* methods: post, update, delete, post an ephemeral, and the streams
(chat.startStream / appendStream / stopStream) with their states, notes §1.1."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tests.fakes.slack.checks import check_blocks, check_chunks, check_metadata, required
from tests.fakes.slack.model import Channel, Ctx, Ephemeral, Message
from tests.fakes.slack.rules import MARKDOWN_MAX, POST_TEXT_MAX, UPDATE_TEXT_MAX, SlackError


class ChatMethods:
    """The chat.* methods of `FakeSlack` (mixed into it)."""

    def _own(self, ctx: Ctx, msg: Message) -> bool:
        assert ctx.team is not None
        return msg.app_id == self.app_id and msg.bot_id == ctx.team.bot_id

    def _stream_state(self, msg: Message) -> str | None:
        limit = self.stream_lifetime * self.time_scale
        if msg.stream == "streaming" and self._now() - msg.stream_started > limit:
            msg.stream = "expired"
        return msg.stream

    def _bot_message(self, ctx: Ctx, channel: Channel, thread_ts: Any) -> Message:
        assert ctx.team is not None
        return Message(
            channel=channel.id,
            team=channel.team,
            ts=self._next_ts(),
            user=ctx.team.bot_user,
            bot_id=ctx.team.bot_id,
            app_id=self.app_id,
            thread_ts=str(thread_ts) if thread_ts else None,
        )

    def _content(self, args: Mapping[str, Any], *, text_max: int, truncate: bool) -> dict[str, Any]:
        """text / markdown_text / blocks / attachments of a post or an update, checked."""
        text, md = args.get("text"), args.get("markdown_text")
        blocks, attachments = args.get("blocks"), args.get("attachments")
        if md is not None and (text or blocks):
            raise SlackError("markdown_text_conflict")
        if md is not None:
            if len(str(md)) > MARKDOWN_MAX:
                raise SlackError("msg_too_long")
            return {"text": str(md), "markdown": True, "blocks": []}
        if not text and not blocks and not attachments:
            raise SlackError("no_text")
        out: dict[str, Any] = {}
        if blocks is not None:
            out["blocks"] = check_blocks(blocks)
        if attachments is not None:
            out["attachments"] = attachments
        if text is not None:
            text = str(text)
            if len(text) > text_max:
                if not truncate:
                    raise SlackError("msg_too_long")
                text = text[:text_max]
                out["warning"] = "message_truncated"
            out["text"], out["markdown"] = text, False
        return out

    @staticmethod
    def _apply(msg: Message, content: Mapping[str, Any]) -> dict[str, Any]:
        for name in ("text", "markdown", "blocks", "attachments"):
            if name in content:
                setattr(msg, name, content[name])
        if "warning" in content:
            return {
                "warning": content["warning"],
                "response_metadata": {"warnings": [content["warning"]]},
            }
        return {}

    def _post_message(self, ctx: Ctx) -> dict[str, Any]:
        channel = self._channel(ctx, ctx.args.get("channel"))
        content = self._content(ctx.args, text_max=POST_TEXT_MAX, truncate=True)
        metadata = check_metadata(ctx.args["metadata"]) if "metadata" in ctx.args else None
        msg = self._bot_message(ctx, channel, ctx.args.get("thread_ts"))
        extra = self._apply(msg, content)
        msg.metadata = metadata
        self._store(msg)
        return {"channel": channel.id, "ts": msg.ts, "message": self.render(msg), **extra}

    def _update(self, ctx: Ctx) -> dict[str, Any]:
        channel = self._channel(ctx, ctx.args.get("channel"))
        msg = self._find(channel, ctx.args.get("ts"))
        if not self._own(ctx, msg):
            raise SlackError("cant_update_message")
        if self._stream_state(msg) == "streaming":
            raise SlackError("streaming_state_conflict")
        content = self._content(ctx.args, text_max=UPDATE_TEXT_MAX, truncate=False)
        metadata = check_metadata(ctx.args["metadata"]) if "metadata" in ctx.args else msg.metadata
        self._apply(msg, content)
        msg.metadata = metadata  # kept unless sent; {} removes it
        msg.edited_ts = self._next_ts()
        self._touch(msg)
        return {"channel": channel.id, "ts": msg.ts, "text": msg.text, "message": self.render(msg)}

    def _delete(self, ctx: Ctx) -> dict[str, Any]:
        channel = self._channel(ctx, ctx.args.get("channel"))
        msg = self._find(channel, ctx.args.get("ts"))
        if not self._own(ctx, msg):
            raise SlackError("cant_delete_message")
        msg.deleted = True
        return {"channel": channel.id, "ts": msg.ts}

    def _post_ephemeral(self, ctx: Ctx) -> dict[str, Any]:
        channel = self._channel(ctx, ctx.args.get("channel"))
        user = str(ctx.args.get("user") or "")
        if user not in channel.members:
            raise SlackError("user_not_in_channel")
        content = self._content(ctx.args, text_max=POST_TEXT_MAX, truncate=True)
        ts = self._next_ts()
        thread_ts = ctx.args.get("thread_ts")
        self.ephemerals.append(
            Ephemeral(
                channel.id,
                user,
                ts,
                content.get("text", ""),
                content.get("blocks", []),
                str(thread_ts) if thread_ts else None,
            )
        )
        return {"message_ts": ts}

    def _start_stream(self, ctx: Ctx) -> dict[str, Any]:
        channel = self._channel(ctx, ctx.args.get("channel"))
        thread_ts = required(ctx.args, "thread_ts")
        if not channel.is_im:
            if not ctx.args.get("recipient_user_id"):
                raise SlackError("missing_recipient_user_id")
            if not ctx.args.get("recipient_team_id"):
                raise SlackError("missing_recipient_team_id")
        msg = self._bot_message(ctx, channel, thread_ts)
        msg.markdown, msg.stream, msg.stream_started = True, "streaming", self._now()
        self._stream_in(msg, ctx.args)
        self._store(msg)
        return {"channel": channel.id, "ts": msg.ts}

    def _streaming(self, ctx: Ctx) -> tuple[Channel, Message]:
        channel = self._channel(ctx, ctx.args.get("channel"))
        msg = self._find(channel, required(ctx.args, "ts"))
        if msg.app_id != self.app_id:
            raise SlackError("message_not_owned_by_app")
        state = self._stream_state(msg)
        if state == "stopped_by_user":
            raise SlackError("stopped_by_user")
        if state != "streaming":
            raise SlackError("message_not_in_streaming_state")
        return channel, msg

    def _stream_in(self, msg: Message, args: Mapping[str, Any]) -> None:
        """Appends markdown_text and chunks to a streaming message."""
        md = args.get("markdown_text")
        if md is not None and len(str(md)) > MARKDOWN_MAX:
            raise SlackError("msg_too_long")
        chunks = check_chunks(args["chunks"]) if "chunks" in args else []
        if md is not None:
            msg.text += str(md)
        for chunk in chunks:
            if chunk["type"] == "markdown_text":
                msg.text += chunk["text"]
            elif chunk["type"] == "plan_update":
                msg.plan_title = chunk["title"]
            elif chunk["type"] == "task_update":
                msg.tasks[chunk["id"]] = {**msg.tasks.get(chunk["id"], {}), **chunk}
            else:
                msg.blocks = [*msg.blocks, *chunk["blocks"]]

    def _append_stream(self, ctx: Ctx) -> dict[str, Any]:
        channel, msg = self._streaming(ctx)
        if ctx.args.get("markdown_text") is None and not ctx.args.get("chunks"):
            raise SlackError("no_text")
        self._stream_in(msg, ctx.args)
        self._touch(msg)
        return {"channel": channel.id, "ts": msg.ts}

    def _stop_stream(self, ctx: Ctx) -> dict[str, Any]:
        channel, msg = self._streaming(ctx)
        self._stream_in(msg, ctx.args)
        if ctx.args.get("blocks") is not None:
            msg.blocks = [*msg.blocks, *check_blocks(ctx.args["blocks"])]
        if "metadata" in ctx.args:
            msg.metadata = check_metadata(ctx.args["metadata"])
        msg.stream = "stopped"
        self._touch(msg)
        return {"channel": channel.id, "ts": msg.ts, "message": self.render(msg)}
