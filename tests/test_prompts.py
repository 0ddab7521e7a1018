"""Request bodies spliced from kept message fragments equal the bodies built whole."""

from __future__ import annotations

from functools import partial
from typing import Any

import orjson
import pytest

from engine.effects.llm import anthropic, openai
from engine.effects.llm.errors import ProviderError
from engine.effects.llm.prompts import EncodedMessages, encode_body

FORMATS = {
    "openai": (openai.message_groups, openai.convert_group, openai.build_request),
    "openrouter": (
        openai.message_groups,
        openai.convert_group,
        partial(openai.build_request, provider="openrouter"),
    ),
    "anthropic": (anthropic.message_groups, anthropic.convert_group, anthropic.build_request),
}


def call(n: int) -> dict[str, Any]:
    return {"id": f"call_{n}", "type": "function", "function": {"name": "t", "arguments": "{}"}}


HISTORY: list[dict[str, Any]] = [
    {"id": "m0", "role": "system", "content": "Be brief."},
    {"id": "m1", "role": "user", "content": "restart the db"},
    {"id": "m2", "role": "assistant", "content": "", "tool_calls": [call(1), call(2)]},
    {"id": "m3", "role": "tool", "tool_call_id": "call_1", "content": "done"},
    {
        "id": "m4",
        "role": "tool",
        "tool_call_id": "call_2",
        "content": [{"type": "text", "text": "ok"}],
    },
    {"id": "m5", "role": "assistant", "content": "Restarted. ✓"},
    {"role": "user", "content": "and the cache?", "name": "ana"},  # no id: not kept
    {"id": "m7", "role": "tool", "tool_call_id": "call_9", "content": None},
]


def request(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": messages,
        "tools": [{"name": "t", "description": "a tool", "input": {"type": "object"}}],
        "temperature": 0.5,
        "reasoning": {"effort": "low"},
    }


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("stream", [True, False])
def test_a_spliced_body_is_the_built_body(fmt: str, stream: bool) -> None:
    groups, convert, build = FORMATS[fmt]
    kept = EncodedMessages()
    for end in range(1, len(HISTORY) + 1):  # the history as it grows, call after call
        req = request(HISTORY[:end])
        body = encode_body(
            req,
            scope=("s1", fmt),
            groups=groups,
            convert=convert,
            build=build,
            stream=stream,
            kept=kept,
        )
        whole = build(req, stream=stream)
        assert orjson.loads(body) == whole, end
        assert list(orjson.loads(body)) == list(whole)  # the same keys in the same order


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_a_tool_schema_holding_an_empty_messages_list_does_not_move_the_messages(fmt: str):
    """Tools come before the messages in a Chat Completions body; a schema whose default is
    `{"messages": []}` must not be taken for the messages' place."""
    groups, convert, build = FORMATS[fmt]
    schema = {"type": "object", "default": {"messages": []}}
    req = {**request(HISTORY[:3]), "tools": [{"name": "t", "description": "", "input": schema}]}
    body = encode_body(
        req,
        scope=("s1", fmt),
        groups=groups,
        convert=convert,
        build=build,
        stream=False,
        kept=EncodedMessages(),
    )
    assert orjson.loads(body) == build(req, stream=False)


def test_a_message_is_encoded_once_per_session_and_format() -> None:
    groups, convert, build = FORMATS["openai"]
    converted: list[str] = []

    def counting(group: list[dict[str, Any]]) -> dict[str, Any]:
        converted.append(group[0].get("id") or "-")
        return convert(group)

    kept = EncodedMessages()
    encode = partial(
        encode_body, groups=groups, convert=counting, build=build, stream=True, kept=kept
    )
    encode(request(HISTORY[:3]), scope=("s1", "openai"))
    encode(request(HISTORY[:4]), scope=("s1", "openai"))
    encode(request(HISTORY[:4]), scope=("s2", "openai"))  # another session: its own
    assert converted == ["m0", "m1", "m2", "m3", "m0", "m1", "m2", "m3"]
    converted.clear()
    encode(request(HISTORY[:7]), scope=("s1", "openai"))
    encode(request(HISTORY[:7]), scope=("s1", "openai"))
    assert converted == ["m4", "m5", "-", "-"]  # the id-less message, each time


def test_past_its_size_the_least_recently_used_go() -> None:
    kept = EncodedMessages(max_bytes=30)
    for n in range(5):
        kept.fragment(("s", str(n)), lambda n=n: {"n": n, "pad": "x" * 5})
    assert kept.size <= 30
    assert 0 < len(kept) < 5
    first = kept.fragment(("s", "4"), lambda: {"changed": True})
    assert orjson.loads(first) == {"n": 4, "pad": "xxxxx"}  # the newest is still kept


def test_holds_says_whether_a_message_is_kept_and_keeps_it_longest() -> None:
    """What the model call's file check relies on (engine/effects/llm/files.py): a message
    found kept is the last to go while the body around it is encoded."""
    kept = EncodedMessages(max_bytes=70)  # three fragments of 21 bytes
    for n in range(3):
        kept.fragment(("s", str(n)), lambda n=n: {"n": n, "pad": "x" * 5})
    assert kept.holds(("s", "0")) and not kept.holds(("s", "9"))
    for n in range(3, 5):  # newer fragments push the least recently used out
        kept.fragment(("s", str(n)), lambda n=n: {"n": n, "pad": "x" * 5})
    assert kept.holds(("s", "0")) and not kept.holds(("s", "1"))


def test_a_message_that_cannot_be_sent_is_refused_and_not_kept() -> None:
    groups, convert, build = FORMATS["anthropic"]
    kept = EncodedMessages()
    audio = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
    req = request([{"id": "a1", "role": "user", "content": [audio]}])
    with pytest.raises(ProviderError):
        build(req, stream=True)
    with pytest.raises(ProviderError):
        encode_body(
            req,
            scope=("s", "anthropic"),
            groups=groups,
            convert=convert,
            build=build,
            stream=True,
            kept=kept,
        )
    assert len(kept) == 0
