"""Tool contracts (SPEC §6): input validation, output checks, MCP result blocks.

Validation never coerces and never blocks a call: it reports what it found.
jsonschema and the JSON edge (engine/jsonedge.py) are pure computations, so they may
live in the core.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from itertools import chain
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from engine.jsonedge import JsonEdgeError, loads_checked


def find_tool(
    agent: dict[str, Any] | None, name: str, client_tools: Iterable[dict[str, Any]] = ()
) -> dict[str, Any] | None:
    """The contract of tool `name`: the agent's, else one of the turn's per-submit tools."""
    for tool in chain((agent or {}).get("tools") or (), client_tools):
        if tool.get("name") == name:
            found: dict[str, Any] = tool
            return found
    return None


_TOOL_KEYS = ("name", "description", "input", "output", "defer")


def submitted_tools(client: dict[str, Any] | None) -> list[dict[str, Any]]:
    """A submit's `client.tools` as its turn records them: each forced to `handler:
    "client"` (SPEC §6), fields left unset left out."""
    tools = []
    for tool in (client or {}).get("tools") or ():
        kept = {k: tool[k] for k in _TOOL_KEYS if tool.get(k) is not None}
        tools.append({**kept, "handler": "client"})
    return tools


def client_tool_clash(tools: list[dict[str, Any]], offered: set[str]) -> tuple[int, str] | None:
    """The first per-submit tool whose name the model is already `offered`, or that an
    earlier one in the list took: its index and why."""
    taken = dict.fromkeys(offered, "the agent")
    for i, tool in enumerate(tools):
        name = tool["name"]
        if name in taken:
            return i, f"tool {name!r} is already offered by {taken[name]}"
        taken[name] = "an earlier tool of this input"
    return None


def _first_error(schema: Any, value: Any) -> str | None:
    try:
        validator = Draft202012Validator(schema)
        error = next(iter(sorted(validator.iter_errors(value), key=lambda e: list(e.path))), None)
    except SchemaError as err:
        return f"the tool's schema is invalid: {err.message}"
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path)
    return f"{where}: {error.message}" if where else error.message


def arguments_of(arguments: str) -> dict[str, Any] | str:
    """A tool call's raw `arguments` as the object they hold, or why they are malformed.

    They are a model's output, so they pass the JSON edge (jsonedge) as a client's body
    does: nesting past its depth, a NaN or a lone surrogate is refused here, by name,
    rather than failing later (a parser's RecursionError, a request no one can encode).
    """
    if not arguments.strip():
        return {}
    try:
        value = loads_checked(arguments)
    except JsonEdgeError as err:
        if err.syntax:
            return f"arguments are {err.message}"  # "not JSON: <where it stopped>"
        problem = err.message.removeprefix(f"{err.param}: ") if err.param else err.message
        return f"arguments refused: {problem}"
    if not isinstance(value, dict):
        return f"arguments are a JSON {type(value).__name__}, not an object"
    return value


def validate_input(tool: dict[str, Any] | None, arguments: str) -> dict[str, Any]:
    """`{status: valid|invalid|malformed, ...}` for the raw `arguments` string."""
    value = arguments_of(arguments)
    if isinstance(value, str):
        return {"status": "malformed", "error": value}
    schema = (tool or {}).get("input")
    if schema is not None:
        error = _first_error(schema, value)
        if error is not None:
            return {"status": "invalid", "value": value, "error": error}
    return {"status": "valid", "value": value}


def check_output(tool: dict[str, Any] | None, result: dict[str, Any]) -> str | None:
    """Why `result` breaks the tool's `output` schema, or None. Checked against the
    structured content when there is any, else the text of a single text block."""
    schema = (tool or {}).get("output")
    if schema is None or result.get("isError"):
        return None
    if "structuredContent" in result:
        value = result["structuredContent"]
    else:
        text = result_text(result)
        try:
            value = loads_checked(text)
        except JsonEdgeError:  # not JSON (or none the edge takes): checked as the text
            value = text
    error = _first_error(schema, value)
    return None if error is None else f"the result does not match the tool's output schema: {error}"


def tool_result_of(
    result: Any = None,
    content: list[dict[str, Any]] | None = None,
    structured: Any = None,
    is_error: bool = False,
) -> dict[str, Any]:
    """A tool result as MCP content blocks: a string or other JSON becomes one text block."""
    if content is None:
        text = result if isinstance(result, str) else json.dumps(result, separators=(",", ":"))
        content = [{"type": "text", "text": text}]
    out: dict[str, Any] = {"content": content}
    if structured is not None:
        out["structuredContent"] = structured
    if is_error:
        out["isError"] = True
    return out


def result_text(result: dict[str, Any]) -> str:
    """A tool result's text parts, joined: what a model reads of it."""
    parts = [b.get("text", "") for b in result.get("content") or () if b.get("type") == "text"]
    return "\n".join(parts)
