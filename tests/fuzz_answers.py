"""Seeded worker answers for the fuzz test (tests/test_fuzz_worker.py): valid ones, and
every class of bad answer a tester found wedging sessions.

Pure: no I/O. `answer(plan, request, n, fuzz=...)` returns the bytes a worker sends for
the n-th request of a session; the same seed, session index and request give the same
bytes. Each answer carries a `label` naming its class (`valid`, `valid:sse`,
`wrong_type@actions.0.type`, `vendor:content_not_list`, ...) so a failure names what was
sent.

An answer is built as documents (the JSON body, or each SSE frame's data) holding
sentinel strings that `render` swaps for raw bytes JSON cannot express as a value:
`NaN`, a lone surrogate escape `"\\ud800"`, invalid UTF-8, 300 nested brackets.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

MODEL = "fuzz-model-1"
TOOL = {
    "name": "lookup",
    "description": "Look a thing up",
    "input": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
}
# Attempts, backoff and timeouts: fast, so a bad answer costs milliseconds. Integers: the
# policy's fields are unsigned integers (a 0 backoff base retries at once).
RETRY = {
    "default": {
        "backoff_base_secs": 0,
        "backoff_max_secs": 0,
        "max_attempts": 3,
        "run_timeout_secs": 10,
    },
    "tool": {"run_timeout_secs": 2},
    "llm": {"run_timeout_secs": 5},
}
FORMATS = (None, "anthropic", "openai")
NEUTRAL_USAGE = {
    "input": 12,
    "output": 7,
    "uncached_input": 12,
    "cache_read": 0,
    "cache_write": 0,
    "total": 19,
}
# Valid Unicode that must come through unchanged: RTL text and overrides, zero-width
# characters, combining marks, a BOM, emoji with joiners and skin tones.
FINE = (
    "שלום",
    "مرحبا بالعالم",
    "\u202eevil\u202c",
    "\u200b",
    "a\u200db",
    "\u2066isolate\u2069",
    "e\u0301",
    "\ufeff",
    "👩🏽‍💻",
    "🏳️‍🌈",
    "🦀",
    "\U0001d518\U0001d52b\U0001d526\U0001d520\U0001d52c\U0001d521\U0001d522",  # Fraktur
)


# -- sessions ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SessionPlan:
    """What one session is: its seed-derived format, streaming and first input."""

    seed: int
    index: int
    format: str | None
    stream: bool
    audio: bool  # the first input carries input_audio content (client-side case)
    client_dup: bool = False  # before turn two, a client.message reusing a recorded id

    @property
    def session_id(self) -> str:
        return f"fuzz-{self.seed}-{self.index}"

    def agent(self) -> dict[str, Any]:
        """The config the worker returns at session.start (always valid)."""
        agent: dict[str, Any] = {
            "model": MODEL,
            "system": "You are fuzzed. " + FINE[self.index % len(FINE)],
            "handler": "worker",
            "stream": self.stream,
            "tools": [TOOL],
            "retry": RETRY,
        }
        if self.format:
            agent["format"] = self.format
        return agent

    def first_input(self) -> dict[str, Any]:
        text = f"turn one of {self.index} {FINE[(self.index * 7) % len(FINE)]}"
        content: Any = text
        if self.audio:
            content = [
                {"type": "text", "text": text},
                {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
            ]
        return {
            "type": "client.message",
            "agent_id": "fuzz",
            "message": {"role": "user", "content": content},
        }

    def dup_input(self, message_id: str) -> dict[str, Any]:
        """A client message under the id of a message the session already holds."""
        return {
            "type": "client.message",
            "agent_id": "fuzz",
            "message": {"id": message_id, "role": "user", "content": f"again {self.index}"},
        }

    def second_input(self) -> dict[str, Any]:
        return {
            "type": "client.message",
            "agent_id": "fuzz",
            "message": {"role": "user", "content": f"turn two of {self.index}"},
        }


def session_plan(seed: int, index: int) -> SessionPlan:
    rng = random.Random(f"{seed}/plan/{index}")
    fmt = FORMATS[index % 3] if rng.random() < 0.5 else rng.choice(FORMATS)
    audio = fmt == "anthropic" and rng.random() < 0.15
    return SessionPlan(seed, index, fmt, rng.random() < 0.6, audio, rng.random() < 0.05)


# Turn two's final reply and state: valid, odd, and expected back unchanged.
def final_text(plan: SessionPlan) -> str:
    return "Done: " + " ".join(FINE) + f" #{plan.index}"


def final_state(plan: SessionPlan) -> dict[str, Any]:
    return {"🔑": FINE[plan.index % len(FINE)], "\u202ekey": ["\u200b", {"ok": plan.index}]}


# -- rendering --------------------------------------------------------------------------


class Doc:
    """One JSON document with sentinels for bytes JSON values cannot hold."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self.whole: dict[str, bytes] = {}  # '"@@Wn@@"' → raw bytes (a whole value)
        self.inside: dict[str, bytes] = {}  # '@@In@@' inside a string → raw bytes
        self.raw: bytes | None = None  # the whole document replaced by these bytes
        self.ascii = False  # non-ASCII as \\u escapes (astral characters as surrogate pairs)

    def value_of(self, raw: bytes) -> str:
        key = f"@@W{len(self.whole)}@@"
        self.whole[key] = raw
        return key

    def inside_of(self, raw: bytes) -> str:
        key = f"@@I{len(self.inside)}@@"
        self.inside[key] = raw
        return key

    def render(self) -> bytes:
        if self.raw is not None:
            return self.raw
        out = json.dumps(self.value, ensure_ascii=self.ascii, separators=(",", ":")).encode()
        for key, raw in self.whole.items():
            out = out.replace(b'"' + key.encode() + b'"', raw)
        for key, raw in self.inside.items():
            out = out.replace(key.encode(), raw)
        return out


@dataclass
class Answer:
    """What the worker sends: a status, a content type and the body in chunks."""

    label: str
    status: int = 200
    content_type: str = "application/json"
    chunks: list[bytes] = field(default_factory=list)

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)

    @property
    def streamed(self) -> bool:
        return self.content_type.startswith("text/event-stream")


@dataclass
class Draft:
    """An answer before encoding: a JSON document, or SSE frames `(event, Doc | bytes)`."""

    json: Doc | None = None
    frames: list[tuple[str, Doc | bytes]] | None = None
    data_space: bool = True
    newline: bytes = b"\n"

    def encode(self, label: str) -> Answer:
        if self.frames is None:
            assert self.json is not None
            return Answer(label, chunks=[self.json.render()])
        prefix = b"data: " if self.data_space else b"data:"
        chunks = []
        for event, data in self.frames:
            raw = data.render() if isinstance(data, Doc) else data
            lines = [b"event: " + event.encode()] + [prefix + ln for ln in raw.split(b"\n")]
            chunks.append(b"".join(ln + self.newline for ln in lines) + self.newline)
        return Answer(label, content_type="text/event-stream", chunks=chunks)

    def docs(self) -> list[Doc]:
        if self.frames is None:
            return [self.json] if self.json is not None else []
        return [d for _, d in self.frames if isinstance(d, Doc)]

    def result_doc(self) -> Doc:
        """The DecisionResponse document (the body, or the decision.result frame's data)."""
        if self.frames is None:
            assert self.json is not None
            return self.json
        for event, data in self.frames:
            if event == "decision.result" and isinstance(data, Doc):
                return data
        raise LookupError("no decision.result frame")

    def delta_docs(self) -> list[Doc]:
        return [d for e, d in self.frames or () if e == "llm.token.delta" and isinstance(d, Doc)]


# -- valid answers ----------------------------------------------------------------------


def _tool_result_since_user(messages: Any) -> bool:
    """Whether the request already holds a tool result after the last user message."""
    for m in reversed(messages if isinstance(messages, list) else []):
        content = m.get("content")
        if m.get("role") == "tool" or (
            isinstance(content, list)
            and any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content)
        ):
            return True
        if m.get("role") == "user":
            return False
    return False


def _pieces(rng: random.Random, text: str) -> list[str]:
    if not text:
        return []
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(0, 3))))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


def _frame_delim(rng: random.Random, draft: Draft) -> Draft:
    """SSE variants every parser must take: `data:` with or without the space, CRLF."""
    draft.data_space = rng.random() < 0.8
    draft.newline = b"\r\n" if rng.random() < 0.2 else b"\n"
    return draft


@dataclass
class Reply:
    """A model reply in neutral terms, rendered per format."""

    tag: str
    text: str
    tool: tuple[str, dict[str, Any]] | None  # (tool call id, input)


def _neutral_response(r: Reply) -> dict[str, Any]:
    resp: dict[str, Any] = {
        "model": MODEL,
        "content": r.text or None,
        "finish_reason": "tool_calls" if r.tool else "stop",
        "usage": dict(NEUTRAL_USAGE),
        "cost": "0.00012",
    }
    if r.tool:
        resp["tool_calls"] = [
            {
                "id": r.tool[0],
                "type": "function",
                "function": {"name": "lookup", "arguments": json.dumps(r.tool[1])},
            }
        ]
    return resp


def _neutral_deltas(rng: random.Random, r: Reply) -> list[dict[str, Any]]:
    deltas: list[dict[str, Any]] = [{"text": p} for p in _pieces(rng, r.text)]
    if r.tool:
        args = json.dumps(r.tool[1])
        deltas.append({"tool_calls": [{"id": r.tool[0], "name": "lookup", "arguments": ""}]})
        deltas += [{"tool_calls": [{"id": r.tool[0], "arguments": p}]} for p in _pieces(rng, args)]
    deltas.append({"finish_reason": "tool_calls" if r.tool else "stop"})
    return deltas


def _anthropic_response(r: Reply) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if r.text:
        content.append({"type": "text", "text": r.text})
    if r.tool:
        content.append({"type": "tool_use", "id": r.tool[0], "name": "lookup", "input": r.tool[1]})
    return {
        "id": f"msg_{r.tag}",
        "type": "message",
        "role": "assistant",
        "model": MODEL,
        "content": content,
        "stop_reason": "tool_use" if r.tool else "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": 12,
            "output_tokens": 7,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }


def _anthropic_events(rng: random.Random, r: Reply) -> list[dict[str, Any]]:
    message = {**_anthropic_response(r), "content": [], "stop_reason": None}
    message["usage"] = {"input_tokens": 12, "output_tokens": 1}
    events: list[dict[str, Any]] = [{"type": "message_start", "message": message}]
    index = 0
    if r.text:
        events.append(
            {
                "type": "content_block_start",
                "index": index,
                "content_block": {"type": "text", "text": ""},
            }
        )
        if rng.random() < 0.3:
            events.append({"type": "ping"})
        events += [
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "text_delta", "text": p},
            }
            for p in _pieces(rng, r.text)
        ]
        events.append({"type": "content_block_stop", "index": index})
        index += 1
    if r.tool:
        events.append(
            {
                "type": "content_block_start",
                "index": index,
                "content_block": {
                    "type": "tool_use",
                    "id": r.tool[0],
                    "name": "lookup",
                    "input": {},
                },
            }
        )
        events += [
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "input_json_delta", "partial_json": p},
            }
            for p in _pieces(rng, json.dumps(r.tool[1]))
        ]
        events.append({"type": "content_block_stop", "index": index})
    events.append(
        {
            "type": "message_delta",
            "delta": {"stop_reason": "tool_use" if r.tool else "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": 7},
        }
    )
    events.append({"type": "message_stop"})
    return events


def _openai_response(r: Reply) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": r.text or None}
    if r.tool:
        message["tool_calls"] = [
            {
                "id": r.tool[0],
                "type": "function",
                "function": {"name": "lookup", "arguments": json.dumps(r.tool[1])},
            }
        ]
    return {
        "id": f"chatcmpl-{r.tag}",
        "object": "chat.completion",
        "created": 1700000000,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if r.tool else "stop",
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19},
    }


def _openai_chunks(rng: random.Random, r: Reply) -> list[dict[str, Any]]:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": f"chatcmpl-{r.tag}",
            "object": "chat.completion.chunk",
            "created": 1700000000,
            "model": MODEL,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    chunks = [chunk({"role": "assistant", "content": ""})]
    chunks += [chunk({"content": p}) for p in _pieces(rng, r.text)]
    if r.tool:
        first = {"index": 0, "id": r.tool[0], "type": "function"}
        chunks.append(
            chunk({"tool_calls": [{**first, "function": {"name": "lookup", "arguments": ""}}]})
        )
        chunks += [
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": p}}]})
            for p in _pieces(rng, json.dumps(r.tool[1]))
        ]
    chunks.append(chunk({}, "tool_calls" if r.tool else "stop"))
    usage = {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19}
    chunks.append({**chunk({}), "choices": [], "usage": usage})
    return chunks


def _vendor_response(fmt: str | None, r: Reply) -> dict[str, Any]:
    if fmt == "anthropic":
        return _anthropic_response(r)
    if fmt == "openai":
        return _openai_response(r)
    return _neutral_response(r)


def _vendor_stream(fmt: str | None, rng: random.Random, r: Reply) -> list[dict[str, Any]]:
    if fmt == "anthropic":
        return _anthropic_events(rng, r)
    if fmt == "openai":
        return _openai_chunks(rng, r)
    return _neutral_deltas(rng, r)


def _reply_for(
    plan: SessionPlan, req: dict[str, Any], n: int, rng: random.Random, fuzz: bool
) -> Reply:
    trigger = req["trigger"]
    tag = f"{plan.index}_{n}"
    has_result = _tool_result_since_user((trigger.get("request") or {}).get("messages"))
    want_tool = not plan.audio and not has_result and (not fuzz or rng.random() < 0.5)
    if want_tool:
        q = rng.choice(["disk", "cpu", *FINE])
        text = rng.choice(["", "Let me look.", FINE[n % len(FINE)]])
        return Reply(tag, text, (f"toolu_{tag}", {"q": q}))
    if fuzz:
        text = rng.choice(["It is fine.", "All clear " + rng.choice(FINE), " ".join(FINE)])
    else:
        text = final_text(plan)
    return Reply(tag, text, None)


def valid(plan: SessionPlan, req: dict[str, Any], n: int, rng: random.Random, fuzz: bool) -> Draft:
    """The correct answer to this request, as JSON or SSE."""
    trigger = req["trigger"]
    kind = trigger["type"]
    if kind == "session.start":
        return Draft(json=Doc({"agent": plan.agent()}))
    if kind == "llm.execute":
        reply = _reply_for(plan, req, n, rng, fuzz)
        result: dict[str, Any] = {
            "type": "llm.result",
            "response": _vendor_response(plan.format, reply),
        }
        if rng.random() < 0.3:
            result["id"], result["attempt"] = trigger["id"], trigger["attempt"]
        answer = Doc({"actions": [result]})
        if trigger.get("stream") and rng.random() < 0.85:
            deltas = _vendor_stream(plan.format, rng, reply)
            frames: list[tuple[str, Doc | bytes]] = [("llm.token.delta", Doc(d)) for d in deltas]
            return _frame_delim(rng, Draft(frames=[*frames, ("decision.result", answer)]))
        return Draft(json=answer)
    if kind == "tool.execute":
        q = (trigger.get("input") or {}).get("value", {})
        roll = rng.random()
        if roll < 0.6:
            action: dict[str, Any] = {"type": "tool.result", "result": {"found": q, "✓": True}}
        elif roll < 0.9 or not fuzz:
            text = "Found " + rng.choice(FINE)
            action = {"type": "tool.result", "content": [{"type": "text", "text": text}]}
        else:
            action = {"type": "tool.error", "error": "lookup is down " + rng.choice(FINE)}
        return Draft(json=Doc({"actions": [action]}))
    proposed = copy.deepcopy(req["proposed"])
    if plan.audio and not fuzz:
        # The audio message can never reach an Anthropic-format model: give each model
        # call its own text-only messages so the session can still finish a turn.
        for action in proposed.get("actions") or ():
            if action.get("type") == "llm.call":
                action["messages"] = [{"role": "user", "content": f"no audio {plan.index}"}]
    if not fuzz and kind == "client.messages":
        proposed["state"] = final_state(plan)
    if kind != "session.start" and rng.random() < 0.15:
        return _frame_delim(rng, Draft(frames=[("decision.result", Doc(proposed))]))
    return Draft(json=Doc(proposed))


# -- mutations --------------------------------------------------------------------------

_OTHER_VALUES: tuple[Any, ...] = (5, -1, 1.5, "x", "", None, True, [], {}, [1, "a"], {"a": 1})


def _slots(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, Any, tuple[Any, ...]]]:
    """(container, key, path) of every value under `value`."""
    out = []
    if isinstance(value, dict):
        for k, v in value.items():
            out.append((value, k, (*path, k)))
            out += _slots(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out.append((value, i, (*path, i)))
            out += _slots(v, (*path, i))
    return out


def _dotted(path: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in path) or "<root>"


def _string_slots(value: Any) -> list[tuple[Any, Any, tuple[Any, ...]]]:
    return [s for s in _slots(value) if isinstance(s[0][s[1]], str)]


def _deep(rng: random.Random, depth: int) -> bytes:
    if rng.random() < 0.5:
        return b"[" * depth + b"1" + b"]" * depth
    return b'{"d":' * depth + b"1" + b"}" * depth


def _pick_doc(rng: random.Random, draft: Draft) -> Doc:
    docs = draft.docs()
    return rng.choice(docs)


def _wrong_type(rng: random.Random, draft: Draft) -> str:
    doc = _pick_doc(rng, draft)
    slots = _slots(doc.value)
    if not slots:
        doc.value = rng.choice([v for v in _OTHER_VALUES if type(v) is not type(doc.value)])
        return "wrong_type@<root>"
    container, key, path = rng.choice(slots)
    old = container[key]
    container[key] = rng.choice([v for v in _OTHER_VALUES if type(v) is not type(old)])
    return f"wrong_type@{_dotted(path)}"


def _drop_key(rng: random.Random, draft: Draft) -> str:
    doc = _pick_doc(rng, draft)
    slots = [s for s in _slots(doc.value) if isinstance(s[0], dict)]
    if not slots:
        return _wrong_type(rng, draft)
    container, key, path = rng.choice(slots)
    del container[key]
    return f"missing@{_dotted(path)}"


def _surrogate(rng: random.Random, draft: Draft) -> str:
    doc = _pick_doc(rng, draft)
    escape = rng.choice([b"\\ud800", b"\\udfff", b"\\udc00x", b"\\ud83d"])
    where = rng.choice(["text", "key", "state"])
    strings = _string_slots(doc.value)
    if where == "text" and strings:
        container, key, path = rng.choice(strings)
        s = container[key]
        cut = rng.randint(0, len(s))
        container[key] = s[:cut] + doc.inside_of(escape) + s[cut:]
        return f"surrogate@{_dotted(path)}"
    dicts = [s[0][s[1]] for s in _slots(doc.value) if isinstance(s[0][s[1]], dict)]
    if where == "key" and (dicts or isinstance(doc.value, dict)):
        target = rng.choice(dicts + ([doc.value] if isinstance(doc.value, dict) else []))
        target["k" + doc.inside_of(escape)] = "v"
        return "surrogate@key"
    if isinstance(doc.value, dict):
        doc.value["state"] = {"note": "s" + doc.inside_of(escape), doc.inside_of(escape): 1}
        return "surrogate@state"
    return _wrong_type(rng, draft)


def _invalid_utf8(rng: random.Random, draft: Draft) -> str:
    doc = _pick_doc(rng, draft)
    bad = rng.choice([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xe2\x82", b"\xf0\x9f\x98"])
    strings = _string_slots(doc.value)
    if strings:
        container, key, path = rng.choice(strings)
        container[key] = container[key] + doc.inside_of(bad)
        return f"invalid_utf8@{_dotted(path)}"
    doc.raw = doc.render() + bad
    return "invalid_utf8@end"


def _deep_state(rng: random.Random, draft: Draft) -> str:
    doc = draft.result_doc()
    depth = rng.randint(100, 300)
    if not isinstance(doc.value, dict):
        doc.value = {}
    doc.value["state"] = doc.value_of(_deep(rng, depth))
    return f"deep_state@{depth}"


def _deep_anywhere(rng: random.Random, draft: Draft) -> str:
    doc = _pick_doc(rng, draft)
    depth = rng.randint(100, 300)
    slots = _slots(doc.value)
    if not slots:
        return _deep_state(rng, draft)
    container, key, path = rng.choice(slots)
    container[key] = doc.value_of(_deep(rng, depth))
    return f"deep@{_dotted(path)}:{depth}"


def _nan(rng: random.Random, draft: Draft) -> str:
    doc = _pick_doc(rng, draft)
    literal = rng.choice([b"NaN", b"Infinity", b"-Infinity"])
    numbers = [s for s in _slots(doc.value) if type(s[0][s[1]]) in (int, float)]
    if numbers and rng.random() < 0.7:
        container, key, path = rng.choice(numbers)
    else:
        slots = _slots(doc.value)
        if not slots:
            return _wrong_type(rng, draft)
        container, key, path = rng.choice(slots)
    container[key] = doc.value_of(literal)
    return f"{literal.decode()}@{_dotted(path)}"


def _fine_unicode(rng: random.Random, draft: Draft) -> str:
    """Not a fault: odd but valid Unicode in some string (it may break an enum or an id)."""
    doc = _pick_doc(rng, draft)
    strings = _string_slots(doc.value)
    if not strings:
        return "fine_unicode@none"
    container, key, path = rng.choice(strings)
    if rng.random() < 0.3:  # a surrogate pair written as escapes: one valid character
        container[key] = container[key] + doc.inside_of(b"\\ud83d\\ude00")
    else:
        container[key] = container[key] + rng.choice(FINE)
    return f"fine_unicode@{_dotted(path)}"


def _unknown_action(rng: random.Random, draft: Draft) -> str:
    doc = draft.result_doc()
    bogus = rng.choice(
        [
            {"type": "teleport"},
            {"type": "llm.cal"},
            {"type": 5},
            {"type": None},
            {"name": "no type"},
            {"type": "connector.sync", "path": "/x"},
            {"type": "tool.call"},  # missing name/arguments
            {"type": "done", "extra": 1},
        ]
    )
    if not isinstance(doc.value, dict):
        doc.value = {}
    actions = doc.value.get("actions")
    if not isinstance(actions, list):
        actions = []
    actions.insert(rng.randint(0, len(actions)), bogus)
    doc.value["actions"] = actions
    return f"unknown_action:{json.dumps(bogus)}"


def _not_open(rng: random.Random, draft: Draft, req: dict[str, Any]) -> str:
    doc = draft.result_doc()
    trigger = req["trigger"]
    options = [
        {"type": "tool.result", "id": "nope", "result": 1},
        {"type": "tool.error", "id": "nope", "error": "x"},
        {"type": "llm.result", "id": "nope", "response": {"model": MODEL}},
        {"type": "llm.error", "id": "nope", "error": "x"},
    ]
    if trigger["type"].endswith(".execute"):
        options.append({"type": "llm.result", "attempt": 7, "response": {"model": MODEL}})
        options.append({"type": "tool.result", "attempt": 0, "result": 1})
        # The right call, twice.
        if trigger["type"] == "llm.execute":
            options.append({"type": "llm.error", "error": "twice"})
        else:
            options.append({"type": "tool.result", "result": "twice"})
    bogus = rng.choice(options)
    if not isinstance(doc.value, dict):
        doc.value = {}
    actions = doc.value.get("actions")
    if not isinstance(actions, list):
        actions = []
    actions.append(bogus)
    doc.value["actions"] = actions
    return f"not_open:{json.dumps(bogus)}"


def _tool_id_not_string(rng: random.Random, draft: Draft, fmt: str | None) -> str:
    bad = rng.choice([5, None, [], {"id": "x"}, True, 1.5])
    hits = 0
    for doc in draft.docs():
        for container, key, _ in _slots(doc.value):
            value = container[key]
            if not isinstance(value, dict):
                continue
            is_call = (
                value.get("type") in ("tool_use", "function")
                or "function" in value
                or (fmt is None and key == 0 and "arguments" in value)
            )
            if is_call and "id" in value:
                value["id"] = bad
                hits += 1
    return f"tool_id_not_string:{json.dumps(bad)}x{hits}"


_ANTHROPIC_BREAKS = (
    "missing_content",
    "content_not_list",
    "unknown_block",
    "tool_use_no_id",
    "tool_use_no_input",
    "tool_use_input_str",
    "usage_strings",
    "usage_not_dict",
    "not_message",
    "block_not_dict",
    "text_not_str",
    "model_not_str",
    "stop_reason_int",
    "error_body",
    "max_tokens",
    "refusal",
    "response_is_list",
    "response_null",
)
_OPENAI_BREAKS = (
    "choices_empty",
    "choices_str",
    "choice_not_dict",
    "message_missing",
    "message_str",
    "tool_calls_str",
    "tool_call_no_id",
    "tool_call_no_function",
    "arguments_int",
    "usage_strings",
    "usage_str",
    "finish_reason_int",
    "content_int",
    "model_int",
    "error_body",
    "finish_error",
    "length",
    "response_is_list",
)
_NEUTRAL_BREAKS = (
    "no_model",
    "content_int",
    "tool_calls_str",
    "tool_call_no_function",
    "usage_strings",
    "usage_missing_total",
    "cost_not_decimal",
    "finish_reason_int",
    "extra_field",
    "reasoning_bad",
    "length",
    "content_filter",
)


def _vendor_break(rng: random.Random, draft: Draft, fmt: str | None) -> str:
    doc = draft.result_doc()
    actions = doc.value.get("actions") if isinstance(doc.value, dict) else None
    if not actions:
        return _wrong_type(rng, draft)
    action = actions[0]
    resp = action["response"]
    if fmt == "anthropic":
        how = rng.choice(_ANTHROPIC_BREAKS)
        blocks = resp.get("content") or []
        tool = next((b for b in blocks if b.get("type") == "tool_use"), None)
        block = blocks[0] if blocks else None
        if how == "missing_content":
            del resp["content"]
        elif how == "content_not_list":
            resp["content"] = rng.choice(["hello", {"type": "text", "text": "hi"}, 5])
        elif how == "unknown_block":
            blocks.append({"type": "hologram", "data": 1})
        elif how == "tool_use_no_id" and tool:
            del tool["id"]
        elif how == "tool_use_no_input" and tool:
            del tool["input"]
        elif how == "tool_use_input_str" and tool:
            tool["input"] = rng.choice(['{"q": 1', "x", 5, [1]])
        elif how == "usage_strings":
            resp["usage"] = {"input_tokens": "12", "output_tokens": "seven"}
        elif how == "usage_not_dict":
            resp["usage"] = rng.choice(["lots", 5, [1]])
        elif how == "not_message":
            resp["type"] = rng.choice(["completion", None, 5])
        elif how == "block_not_dict" and blocks is not None:
            blocks.insert(0, rng.choice([5, "text", None, []]))
        elif how == "text_not_str" and block and block.get("type") == "text":
            block["text"] = rng.choice([5, None, ["a"], {"t": 1}])
        elif how == "model_not_str":
            resp["model"] = rng.choice([5, None, {}])
        elif how == "stop_reason_int":
            resp["stop_reason"] = rng.choice([5, [], {"r": 1}])
        elif how == "error_body":
            action["response"] = {"type": "error", "error": {"type": "overloaded_error"}}
        elif how == "max_tokens":
            resp["stop_reason"] = "max_tokens"
        elif how == "refusal":
            resp["stop_reason"] = "refusal"
        elif how == "response_is_list":
            action["response"] = [resp]
        elif how == "response_null":
            action["response"] = None
        else:
            how += ":n/a→missing_content"
            resp.pop("content", None)
        return f"vendor:anthropic:{how}"
    if fmt == "openai":
        how = rng.choice(_OPENAI_BREAKS)
        choice = resp["choices"][0]
        message = choice["message"]
        calls = message.get("tool_calls")
        if how == "choices_empty":
            resp["choices"] = []
        elif how == "choices_str":
            resp["choices"] = "x"
        elif how == "choice_not_dict":
            resp["choices"] = [rng.choice([5, "x", None, []])]
        elif how == "message_missing":
            del choice["message"]
        elif how == "message_str":
            choice["message"] = "hi"
        elif how == "tool_calls_str":
            message["tool_calls"] = rng.choice(["x", 5, {"id": "a"}])
        elif how == "tool_call_no_id" and calls:
            del calls[0]["id"]
        elif how == "tool_call_no_function" and calls:
            del calls[0]["function"]
        elif how == "arguments_int" and calls:
            calls[0]["function"]["arguments"] = rng.choice([5, {"q": "x"}, ["q"]])
        elif how == "usage_strings":
            resp["usage"] = {"prompt_tokens": "12", "completion_tokens": "x", "total_tokens": "19"}
        elif how == "usage_str":
            resp["usage"] = rng.choice(["x", 5, [1]])
        elif how == "finish_reason_int":
            choice["finish_reason"] = rng.choice([5, [], {"r": 1}])
        elif how == "content_int":
            message["content"] = rng.choice([5, ["a"], {"t": 1}, True])
        elif how == "model_int":
            resp["model"] = rng.choice([5, [], {}])
        elif how == "error_body":
            action["response"] = {"error": {"message": "boom", "code": 429}}
        elif how == "finish_error":
            choice["finish_reason"] = "error"
        elif how == "length":
            choice["finish_reason"] = "length"
        elif how == "response_is_list":
            action["response"] = [resp]
        else:
            how += ":n/a→choices_empty"
            resp["choices"] = []
        return f"vendor:openai:{how}"
    how = rng.choice(_NEUTRAL_BREAKS)
    calls = resp.get("tool_calls")
    if how == "no_model":
        del resp["model"]
    elif how == "content_int":
        resp["content"] = rng.choice([5, ["a"], {"t": 1}])
    elif how == "tool_calls_str":
        resp["tool_calls"] = rng.choice(["x", 5, {"id": "a"}])
    elif how == "tool_call_no_function" and calls:
        del calls[0]["function"]
    elif how == "usage_strings":
        resp["usage"] = {k: str(v) for k, v in NEUTRAL_USAGE.items()}
    elif how == "usage_missing_total":
        del resp["usage"]["total"]
    elif how == "cost_not_decimal":
        resp["cost"] = rng.choice(["cheap", "1e-5", 0.01, "-"])
    elif how == "finish_reason_int":
        resp["finish_reason"] = rng.choice([5, [], {"r": 1}])
    elif how == "extra_field":
        resp["surprise"] = True
    elif how == "reasoning_bad":
        resp["reasoning"] = rng.choice([{"provider": "martian"}, "thought", {"text": 5}])
    elif how == "length":
        resp["finish_reason"] = "length"
    elif how == "content_filter":
        resp["finish_reason"] = "content_filter"
    else:
        how += ":n/a→no_model"
        resp.pop("model", None)
    return f"vendor:neutral:{how}"


_ANTHROPIC_STREAM_BREAKS = (
    "delta_unstarted_index",
    "message_delta_no_delta",
    "block_start_no_block",
    "delta_text_int",
    "delta_not_dict",
    "index_str",
    "index_list",
    "event_not_object",
    "event_no_type",
    "partial_json_int",
    "tool_use_id_int",
    "tool_name_int",
    "message_start_str",
    "error_event",
    "usage_str",
    "stop_reason_list",
)
_OPENAI_STREAM_BREAKS = (
    "choices_str",
    "choice_not_dict",
    "delta_str",
    "fragment_index_str",
    "fragment_index_float",
    "fragment_index_none",
    "fragment_index_list",
    "tool_calls_str",
    "fragment_not_dict",
    "function_str",
    "arguments_int",
    "content_int",
    "fragment_id_int",
    "name_int",
    "usage_str",
    "error_chunk",
    "done_sentinel",
    "finish_reason_int",
)
_NEUTRAL_STREAM_BREAKS = (
    "own_call_id",
    "own_seq",
    "own_attempt",
    "text_int",
    "tool_calls_str",
    "chunk_no_id",
    "chunk_id_int",
    "arguments_int",
    "unknown_field",
    "not_object",
    "finish_reason_list",
)


def _stream_break(rng: random.Random, draft: Draft, fmt: str | None) -> str:
    frames = draft.frames
    assert frames is not None
    deltas = [(i, d) for i, (e, d) in enumerate(frames) if e == "llm.token.delta"]
    if not deltas:
        return _sse_structure(rng, draft)
    i, doc = rng.choice(deltas)
    assert isinstance(doc, Doc)
    ev = doc.value

    def insert(value: Any) -> None:
        frames.insert(i, ("llm.token.delta", Doc(value)))

    if fmt == "anthropic":
        how = rng.choice(_ANTHROPIC_STREAM_BREAKS)
        if how == "delta_unstarted_index":
            insert(
                {
                    "type": "content_block_delta",
                    "index": 7,
                    "delta": {"type": rng.choice(["text_delta", "input_json_delta"]), "text": "?"},
                }
            )
        elif how == "message_delta_no_delta":
            insert({"type": "message_delta", "usage": {"output_tokens": 3}})
        elif how == "block_start_no_block":
            insert({"type": "content_block_start", "index": 5})
        elif how == "delta_text_int":
            insert(
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": 5},
                }
            )
        elif how == "delta_not_dict":
            insert({"type": "content_block_delta", "index": 0, "delta": rng.choice(["x", 5, [1]])})
        elif how == "index_str":
            insert(
                {
                    "type": "content_block_start",
                    "index": "x",
                    "content_block": {"type": "text", "text": "hi"},
                }
            )
        elif how == "index_list":
            insert(
                {
                    "type": "content_block_delta",
                    "index": [0],
                    "delta": {"type": "text_delta", "text": "a"},
                }
            )
        elif how == "event_not_object":
            frames.insert(i, ("llm.token.delta", Doc(rng.choice([5, "x", [1], None]))))
        elif how == "event_no_type":
            ev.pop("type", None)
        elif how == "partial_json_int":
            insert(
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "input_json_delta", "partial_json": rng.choice([5, ["a"]])},
                }
            )
        elif how == "tool_use_id_int":
            insert(
                {
                    "type": "content_block_start",
                    "index": 9,
                    "content_block": {"type": "tool_use", "id": 5, "name": "lookup", "input": {}},
                }
            )
        elif how == "tool_name_int":
            insert(
                {
                    "type": "content_block_start",
                    "index": 9,
                    "content_block": {"type": "tool_use", "id": "t9", "name": 5, "input": {}},
                }
            )
        elif how == "message_start_str":
            insert({"type": "message_start", "message": "hello"})
        elif how == "error_event":
            insert({"type": "error", "error": {"type": "overloaded_error", "message": "busy"}})
        elif how == "usage_str":
            insert({"type": "message_delta", "delta": {"stop_reason": None}, "usage": "x"})
        elif how == "stop_reason_list":
            insert({"type": "message_delta", "delta": {"stop_reason": ["end_turn"]}})
        return f"stream:anthropic:{how}"
    if fmt == "openai":
        how = rng.choice(_OPENAI_STREAM_BREAKS)

        def chunk(delta: Any, **extra: Any) -> dict[str, Any]:
            return {
                "id": "c",
                "object": "chat.completion.chunk",
                "model": MODEL,
                "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
                **extra,
            }

        if how == "choices_str":
            insert({**chunk({}), "choices": "x"})
        elif how == "choice_not_dict":
            insert({**chunk({}), "choices": [rng.choice([5, "x", None])]})
        elif how == "delta_str":
            insert(chunk(rng.choice(["x", 5, [1]])))
        elif how.startswith("fragment_index_"):
            bad = {"str": "x", "float": 0.5, "none": None, "list": [0]}[how.rsplit("_", 1)[1]]
            insert(
                chunk(
                    {
                        "tool_calls": [
                            {
                                "index": bad,
                                "id": "call_z",
                                "function": {"name": "lookup", "arguments": "{}"},
                            }
                        ]
                    }
                )
            )
        elif how == "tool_calls_str":
            insert(chunk({"tool_calls": rng.choice(["x", 5, {"index": 0}])}))
        elif how == "fragment_not_dict":
            insert(chunk({"tool_calls": [rng.choice([5, "x", None])]}))
        elif how == "function_str":
            insert(chunk({"tool_calls": [{"index": 3, "id": "c3", "function": "lookup"}]}))
        elif how == "arguments_int":
            insert(chunk({"tool_calls": [{"index": 3, "id": "c3", "function": {"arguments": 5}}]}))
        elif how == "content_int":
            insert(chunk({"content": rng.choice([5, ["a"], {"t": 1}, True])}))
        elif how == "fragment_id_int":
            insert(chunk({"tool_calls": [{"index": 4, "id": 5, "function": {"name": "lookup"}}]}))
        elif how == "name_int":
            insert(chunk({"tool_calls": [{"index": 4, "id": "c4", "function": {"name": 5}}]}))
        elif how == "usage_str":
            insert({**chunk({}), "choices": [], "usage": "x"})
        elif how == "error_chunk":
            insert({"error": {"message": "boom", "code": 500}})
        elif how == "done_sentinel":
            frames.insert(i, ("llm.token.delta", b"[DONE]"))
        elif how == "finish_reason_int":
            insert({**chunk({}), "choices": [{"index": 0, "delta": {}, "finish_reason": 5}]})
        return f"stream:openai:{how}"
    how = rng.choice(_NEUTRAL_STREAM_BREAKS)
    if how == "own_call_id":
        ev["call_id"] = rng.choice(["other-call", 5])
    elif how == "own_seq":
        ev["seq"] = rng.choice([1, -1, "x"])
    elif how == "own_attempt":
        ev["attempt"] = rng.choice([99, "x"])
    elif how == "text_int":
        insert({"text": rng.choice([5, ["a"], {"t": 1}])})
    elif how == "tool_calls_str":
        insert({"tool_calls": "x"})
    elif how == "chunk_no_id":
        insert({"tool_calls": [{"name": "lookup", "arguments": "{}"}]})
    elif how == "chunk_id_int":
        insert({"tool_calls": [{"id": 5, "name": "lookup"}]})
    elif how == "arguments_int":
        insert({"tool_calls": [{"id": "c", "arguments": 5}]})
    elif how == "unknown_field":
        ev["sparkle"] = 1
    elif how == "not_object":
        frames.insert(i, ("llm.token.delta", Doc(rng.choice([5, "x", [1], None]))))
    elif how == "finish_reason_list":
        insert({"finish_reason": ["stop"]})
    return f"stream:neutral:{how}"


def _sse_structure(rng: random.Random, draft: Draft) -> str:
    """Broken event streams: no decision.result, bad decision.error, garbage frames."""
    frames = draft.frames
    assert frames is not None
    how = rng.choice(
        [
            "no_result",
            "error_wrong_types",
            "error_valid_retryable",
            "error_valid_final",
            "result_not_json",
            "result_empty",
            "two_results",
            "truncated_frame",
            "result_is_list",
            "unknown_event",
        ]
    )
    if how == "no_result":
        draft.frames = [(e, d) for e, d in frames if e != "decision.result"]
    elif how == "error_wrong_types":
        bad = rng.choice(
            [
                {"message": 5},
                {"message": "boom", "retryable": "yes"},
                {"retryable": False},
                "boom",
                [1],
                None,
                {"message": ["a"], "retryable": 1},
            ]
        )
        draft.frames = [(e, d) for e, d in frames if e != "decision.result"]
        draft.frames.append(("decision.error", Doc(bad)))
        how += f":{json.dumps(bad)}"
    elif how == "error_valid_retryable":
        draft.frames = [(e, d) for e, d in frames if e != "decision.result"]
        draft.frames.append(("decision.error", Doc({"message": "try again " + rng.choice(FINE)})))
    elif how == "error_valid_final":
        draft.frames = [(e, d) for e, d in frames if e != "decision.result"]
        draft.frames.append(("decision.error", Doc({"message": "no", "retryable": False})))
    elif how == "result_not_json":
        draft.frames = [(e, d) for e, d in frames if e != "decision.result"]
        draft.frames.append(("decision.result", rng.choice([b"{oops", b"<html>", b"[DONE]"])))
    elif how == "result_empty":
        draft.frames = [(e, d) for e, d in frames if e != "decision.result"]
        draft.frames.append(("decision.result", b""))
    elif how == "two_results":
        result = draft.result_doc()
        frames.append(("decision.result", Doc({"actions": [{"type": "teleport"}]})))
        frames.insert(0, ("decision.result", Doc(copy.deepcopy(result.value))))
        # The first one wins; the valid copy comes first, so this may well succeed.
    elif how == "truncated_frame":
        result = draft.result_doc()
        raw = result.render()
        result.raw = raw[: max(1, len(raw) // 2)]
    elif how == "result_is_list":
        draft.result_doc().value = [draft.result_doc().value]
    elif how == "unknown_event":
        frames.insert(0, ("mystery", Doc({"hello": 1})))
        frames.insert(0, ("llm.token.delta", b"not json at all"))
    return f"sse:{how}"


def _transport(rng: random.Random, draft: Draft) -> Answer:
    """Bodies that are not a DecisionResponse at all, or sent the wrong way."""
    valid_body = draft.encode("x").body
    how = rng.choice(
        [
            "non_json",
            "truncated",
            "empty",
            "whitespace",
            "http_4xx",
            "http_5xx",
            "wrong_ct_sse_as_json",
            "wrong_ct_json_as_sse",
            "wrong_ct_text_plain",
            "top_level_not_object",
            "bom_prefix",
            "null_body",
        ]
    )
    if how == "non_json":
        body = rng.choice(
            [b"<html>oops</html>", b"hello", b"{'a': 1}", b"{actions: []}", b"\x00\x01"]
        )
        return Answer(f"transport:{how}", chunks=[body])
    if how == "truncated":
        cut = rng.randint(1, max(1, len(valid_body) - 1))
        return Answer(f"transport:{how}@{cut}/{len(valid_body)}", chunks=[valid_body[:cut]])
    if how == "empty":
        return Answer(f"transport:{how}", chunks=[b""])
    if how == "whitespace":
        return Answer(f"transport:{how}", chunks=[b" \n\t "])
    if how in ("http_4xx", "http_5xx"):
        status = rng.choice(
            [400, 401, 403, 404, 409, 422, 429] if how == "http_4xx" else [500, 502, 503, 504]
        )
        body = rng.choice([b"", b'{"error": "nope"}', valid_body, "erreur ✗".encode()])
        return Answer(f"transport:{how}:{status}", status=status, chunks=[body])
    if how == "wrong_ct_sse_as_json":
        sse = (
            draft
            if draft.frames is not None
            else Draft(frames=[("decision.result", draft.result_doc())])
        )
        return Answer(f"transport:{how}", chunks=sse.encode("x").chunks)
    if how == "wrong_ct_json_as_sse":
        return Answer(f"transport:{how}", content_type="text/event-stream", chunks=[valid_body])
    if how == "wrong_ct_text_plain":
        json_body = draft.result_doc().render()
        return Answer(
            f"transport:{how}",
            content_type=rng.choice(["text/plain", "text/html", "application/octet-stream"]),
            chunks=[json_body],
        )
    if how == "top_level_not_object":
        return Answer(
            f"transport:{how}", chunks=[rng.choice([b"5", b'"x"', b"[]", b"true", b"[{}]"])]
        )
    if how == "bom_prefix":
        return Answer(f"transport:{how}", chunks=[b"\xef\xbb\xbf" + draft.result_doc().render()])
    return Answer(f"transport:{how}", chunks=[b"null"])


def _deep_ok(rng: random.Random, draft: Draft) -> str:
    """Valid: state nested just inside the limit (64 levels, the document being 1)."""
    doc = draft.result_doc()
    if not isinstance(doc.value, dict):
        return "deep_ok:n/a"
    depth = rng.randint(40, 62)
    doc.value["state"] = doc.value_of(_deep(rng, depth))
    return f"deep_ok@{depth}"


def _dup_message_id(rng: random.Random, draft: Draft, req: dict[str, Any]) -> str:
    """A message recorded under an id the conversation already has (the head, an ancestor),
    or two messages of one answer sharing an id."""
    doc = draft.result_doc()
    if not isinstance(doc.value, dict):
        doc.value = {}
    messages = doc.value.get("messages")
    if not isinstance(messages, list) or not messages or not isinstance(messages[0], dict):
        messages = [{"role": "assistant", "content": "again"}]
        doc.value["messages"] = messages
    known = [m["id"] for m in req.get("messages") or () if isinstance(m, dict) and m.get("id")]
    if known and rng.random() < 0.8:
        target = rng.choice(known)
        messages[0]["id"] = target
        return "dup_message_id:" + ("head" if target == known[-1] else "ancestor")
    messages[0]["id"] = "twin"
    messages.append({**messages[0], "content": "twin again"})
    return "dup_message_id:twin"


# Every class `answer` draws from (a class may be skipped, e.g. while its bug is open).
CLASSES = (
    "wrong_type",
    "missing",
    "surrogate",
    "invalid_utf8",
    "deep_state",
    "deep_anywhere",
    "nan",
    "fine_unicode",
    "unknown_action",
    "not_open",
    "transport",
    "deep_ok",
    "dup_message_id",
    "vendor",
    "tool_id",
    "sse",
    "stream",
)


def answer(
    plan: SessionPlan,
    req: dict[str, Any],
    n: int,
    *,
    fuzz: bool,
    skip: frozenset[str] = frozenset(),
) -> Answer:
    """The answer to the n-th request of a session (reproducible from plan and n)."""
    kind = req["trigger"]["type"]
    attempt = req.get("attempts")
    rng = random.Random(f"{plan.seed}/{plan.index}/{n}/{kind}/{attempt}/{'fuzz' if fuzz else 'ok'}")
    draft = valid(plan, req, n, rng, fuzz)
    escaped = rng.random() < 0.3
    for doc in draft.docs():
        doc.ascii = escaped
    sse = ("sse" if draft.frames is not None else "json") + ("+ascii" if escaped else "")
    if not fuzz or kind == "session.start" or rng.random() < 0.5:
        return draft.encode(f"valid:{sse}")
    classes = [
        "wrong_type",
        "missing",
        "surrogate",
        "invalid_utf8",
        "deep_state",
        "deep_anywhere",
        "nan",
        "fine_unicode",
        "unknown_action",
        "not_open",
        "transport",
        "transport",
        "deep_ok",
    ]
    if not kind.endswith(".execute"):
        classes += ["dup_message_id"]
    if kind == "llm.execute":
        classes += ["vendor", "vendor", "vendor", "tool_id"]
    if draft.frames is not None:
        classes += ["sse", "sse"]
        if draft.delta_docs():
            classes += ["stream", "stream", "stream"]
    classes = [c for c in classes if c not in skip] or ["wrong_type"]
    cls = rng.choice(classes)
    if cls == "transport":
        return _transport(rng, draft)
    label = _MUTATIONS[cls](rng, draft, req, plan.format)
    return draft.encode(f"{label}:{sse}")


Mutation = Callable[[random.Random, Draft, dict[str, Any], str | None], str]

# Each class of bad answer: it changes the draft in place and returns its label.
_MUTATIONS: dict[str, Mutation] = {
    "dup_message_id": lambda rng, draft, req, fmt: _dup_message_id(rng, draft, req),
    "wrong_type": lambda rng, draft, req, fmt: _wrong_type(rng, draft),
    "missing": lambda rng, draft, req, fmt: _drop_key(rng, draft),
    "surrogate": lambda rng, draft, req, fmt: _surrogate(rng, draft),
    "invalid_utf8": lambda rng, draft, req, fmt: _invalid_utf8(rng, draft),
    "deep_state": lambda rng, draft, req, fmt: _deep_state(rng, draft),
    "deep_anywhere": lambda rng, draft, req, fmt: _deep_anywhere(rng, draft),
    "nan": lambda rng, draft, req, fmt: _nan(rng, draft),
    "fine_unicode": lambda rng, draft, req, fmt: _fine_unicode(rng, draft),
    "unknown_action": lambda rng, draft, req, fmt: _unknown_action(rng, draft),
    "not_open": lambda rng, draft, req, fmt: _not_open(rng, draft, req),
    "deep_ok": lambda rng, draft, req, fmt: _deep_ok(rng, draft),
    "vendor": lambda rng, draft, req, fmt: _vendor_break(rng, draft, fmt),
    "tool_id": lambda rng, draft, req, fmt: _tool_id_not_string(rng, draft, fmt),
    "sse": lambda rng, draft, req, fmt: _sse_structure(rng, draft),
    "stream": lambda rng, draft, req, fmt: _stream_break(rng, draft, fmt),
}
