"""A scripted LLM vendor: OpenAI Chat Completions, OpenRouter and Anthropic Messages.

A real aiohttp server on 127.0.0.1, port 0. Tests push replies; each request pops
one and the reply is rendered in the format of the route that received it, as a
JSON body or an event stream (the request's `stream` decides), byte for byte as
notes/engine-facts.md §3 records the vendors' wire formats.

Usage is deterministic: input = characters of the request's text and tools // 4 + 1, output =
words of the reply (+ a quarter of each tool call's arguments). Part of the input is
read from or written to the vendor's prompt cache as each vendor does it
(tests/fakes/prompt_cache.py: Anthropic's breakpoints, OpenAI's automatic prefixes); the
rest is uncached. OpenRouter's reported cost prices each kind at its own rate.

The parts: `script.py` (the replies a test pushes, the requests recorded), `answer.py`
(one answer, vendor-neutral), `server.py` (`FakeVendor`: the routes, the script, the
stream's pacing), `vendor.py` (what the formats share) and one module per format:
`openai_chat.py`, `openrouter.py`, `anthropic_messages.py`. Tests import from here.
"""

from tests.fakes.llm_vendor.anthropic_messages import ANTHROPIC_PATH
from tests.fakes.llm_vendor.openai_chat import OPENAI_PATH
from tests.fakes.llm_vendor.openrouter import OPENROUTER_PATH
from tests.fakes.llm_vendor.script import (
    CutStream,
    HttpError,
    InStreamError,
    Raw,
    Recorded,
    Reply,
    Text,
    ToolCalls,
)
from tests.fakes.llm_vendor.server import FakeVendor

__all__ = [
    "ANTHROPIC_PATH",
    "OPENAI_PATH",
    "OPENROUTER_PATH",
    "CutStream",
    "FakeVendor",
    "HttpError",
    "InStreamError",
    "Raw",
    "Recorded",
    "Reply",
    "Text",
    "ToolCalls",
]
