"""The AG-UI channel under test: a project for it, the API on a real port, and a strict
reader of its SSE answers that checks every event against `ag_ui.core`."""

from __future__ import annotations

import json
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from ag_ui.core import Event
from pydantic import BaseModel, TypeAdapter

from engine.api import ApiKeys, make_app
from engine.client import Client
from engine.config import Project, parse_project
from engine.runtime.engine import Engine
from engine.store.store import Store
from tests.api_helpers import KEYS_ENV, ROOT, auth, serve
from tests.engine_helpers import ENV

EVENT: TypeAdapter[Any] = TypeAdapter(Event)
PICK = {
    "name": "pick_color",
    "description": "Let the user pick a colour",
    "parameters": {"type": "object", "properties": {"hint": {"type": "string"}}},
}
LOOKUP = (
    '{ name = "lookup", description = "Look a thing up", input = { type = "object", '
    'properties = { q = { type = "string" } } } }'
)


def agui_project(tmp_path: Path, vendor_url: str, worker_url: str) -> Project:
    """`chat` (OpenAI, engine-decided, a subagent), `thinker` (Anthropic), `helper`
    (a subagent) and `planner` (worker-decided, with a worker tool)."""
    text = textwrap.dedent(
        f"""\
        [llm.openai]
        type = "openai"
        base_url = "{vendor_url}/v1"

        [llm.anthropic]
        type = "anthropic"
        base_url = "{vendor_url}"

        [agent.chat]
        llm = "openai"
        model = "gpt-4.1-mini"
        system = "You are terse."
        subagents = ["agent.helper"]

        [agent.thinker]
        llm = "anthropic"
        model = "claude-haiku-4-5"

        [agent.helper]
        llm = "openai"
        model = "gpt-4.1-mini"
        description = "Knows things"

        [agent.planner]
        llm = "openai"
        model = "gpt-4.1-mini"
        worker = "{worker_url}"
        tools = [{LOOKUP}]
        """
    )
    path = tmp_path / "subs.toml"
    path.write_text(text)
    return parse_project(text, str(path), env={})


def run_path(agent: str, what: str = "run") -> str:
    return f"/api/channels/ag-ui/agents/{agent}/{what}"


def strict_event(data: Any) -> BaseModel:
    """One event as `ag_ui.core` parses it, held to what the lenient models let pass:
    no unknown member, every key its camelCase alias, no optional field sent as null."""
    event: BaseModel = EVENT.validate_python(data)
    assert not event.model_extra, f"unknown members {event.model_extra} in {data}"
    assert None not in data.values(), f"a null field in {data}"
    assert json.loads(event.model_dump_json(by_alias=True)) == data, data
    return event


def frames(raw: bytes) -> list[dict[str, Any]]:
    """The events of an AG-UI SSE body: LF-framed, `event: TYPE` then one `data:` line."""
    assert b"\r" not in raw, "frames must be LF-only"
    out = []
    for block in raw.decode().split("\n\n"):
        lines = [line for line in block.split("\n") if line and not line.startswith(":")]
        if not lines:
            continue
        assert len(lines) == 2 and lines[0].startswith("event: "), block
        assert lines[1].startswith("data: "), block
        data = json.loads(lines[1].removeprefix("data: "))
        assert data["type"] == lines[0].removeprefix("event: ")
        strict_event(data)
        out.append(data)
    return out


def types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


def squeeze(names: list[str]) -> list[str]:
    """Event types with each run of `*_CONTENT`/`*_ARGS` shown once (their count varies)."""
    out: list[str] = []
    for name in names:
        if out and out[-1] == name and name.endswith(("_CONTENT", "_ARGS")):
            continue
        out.append(name)
    return out


def run_input(thread: str, run: str, messages: list[dict[str, Any]], **extra: Any) -> dict:
    return {
        "threadId": thread,
        "runId": run,
        "messages": messages,
        "tools": [],
        "context": [],
        "state": {},
        "forwardedProps": {},
        **extra,
    }


def user(mid: str, text: str) -> dict[str, Any]:
    return {"id": mid, "role": "user", "content": text}


async def run(
    http: httpx.AsyncClient, agent: str, body: dict[str, Any], *, key: str = ROOT
) -> list[dict[str, Any]]:
    """One run; its events, each checked (the stream must end by itself)."""
    headers = {**auth(key), "Accept": "text/event-stream"}
    resp = await http.post(run_path(agent), json=body, headers=headers, timeout=20)
    assert resp.status_code == 200, resp.text
    assert resp.headers["Content-Type"] == "text/event-stream"
    return frames(resp.content)


@pytest.fixture
async def agui_worker(test_worker):
    """The `planner` agent's worker (it echoes proposals until a test says otherwise)."""
    return await test_worker()


@pytest.fixture
async def agui_engine(redis, vendor, tmp_path, agui_worker) -> AsyncIterator[Engine]:
    project = agui_project(tmp_path, vendor.url, agui_worker.url)
    engine = Engine(project, redis, env=ENV, lease_ms=3000)
    await engine.start()
    yield engine
    await engine.stop()


@pytest.fixture
async def agui_http(redis, agui_engine) -> AsyncIterator[httpx.AsyncClient]:
    """The API with keys (ROOT, ALICE, BOB as tests/api_helpers.py sets them)."""
    store = await Store.open(redis)
    keys = ApiKeys.from_env(KEYS_ENV)
    agents = agui_engine.project.agents
    app = make_app(Client(store), store, keys=keys, heartbeat=1.0, agents=agents)
    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=20) as client:
        yield client
