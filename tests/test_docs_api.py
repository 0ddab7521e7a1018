"""docs/API.md is run, not just read: every `curl` example in it, in document order,
against a real `subs serve` on a real Redis, with the real `curl` binary.

Each ```sh block holding `curl` is followed by an ```http block: the status line, the
headers that matter and the body the doc promises. The test runs the command as a reader
would (bash, with the variables the doc's conventions block exports; `set -u`, so a
variable the doc never defines fails the example), then holds the answer to that block:
the same status, each shown header, and the body's shape (`…` in the doc stands for a
value that differs per run; see `json_mismatches`). Between examples it waits (polling,
with a deadline) until the session has nothing in flight but a client tool call, the way a
reader waits for the model, and sets `CALL_ID` and `INTERRUPT_ID` from what came before,
as the doc tells the reader to.

Only the model vendor is fake (tests/fakes/llm_vendor/): a model that calls the client
tool `confirm` and, once it has the tool's answer, says something.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import signal
import textwrap
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from engine.api import ApiKeys, make_app
from engine.client import Client
from engine.store.snapshots import load_state
from engine.store.store import Store, connect
from tests.engine_helpers import ROOT, EngineProcess, poll_until, subs
from tests.fakes.llm_vendor import FakeVendor, Text, ToolCalls
from tests.fakes.slack import FakeSlack

DOC = ROOT / "docs" / "API.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.M | re.S)
ELLIPSIS = "…"
EXAMPLE_TIMEOUT = 30.0
QUIET_TIMEOUT = 20.0


# --- reading the doc -------------------------------------------------------------------------


@dataclass(frozen=True)
class Expected:
    status: int
    reason: str
    headers: dict[str, str]  # names lower-cased
    body: str


@dataclass(frozen=True)
class Example:
    line: int
    command: str
    expected: Expected

    @property
    def method(self) -> str:
        match = re.search(r"-X (\w+)", self.command)
        if match:
            return match.group(1)
        return "POST" if re.search(r"(^|\s)-d\s", self.command) else "GET"

    @property
    def path(self) -> str:
        match = re.search(r'"\$SUBS_URL(/[^"?]*)', self.command)
        assert match, f"API.md line {self.line}: the URL must start with $SUBS_URL"
        return match.group(1)


def fenced_blocks(text: str) -> list[tuple[str, str, int]]:
    """(language, content, line number of the opening fence) for every fenced block."""
    return [(m[1], m[2], text.count("\n", 0, m.start()) + 1) for m in FENCE.finditer(text)]


def parse_answer(block: str, line: int) -> Expected:
    head, _, body = block.partition("\n\n")
    status_line, *header_lines = head.splitlines()
    match = re.fullmatch(r"HTTP/1\.1 (\d{3}) (.+)", status_line)
    assert match, f"API.md line {line}: the answer must start with a status line"
    headers = {}
    for header in header_lines:
        name, sep, value = header.partition(": ")
        assert sep, f"API.md line {line}: not a header: {header!r}"
        headers[name.lower()] = value
    return Expected(int(match[1]), match[2], headers, body.strip())


def curl_examples(text: str) -> list[Example]:
    blocks = fenced_blocks(text)
    found = []
    for i, (lang, content, line) in enumerate(blocks):
        if lang != "sh" or "curl " not in content:
            continue
        answer = blocks[i + 1] if i + 1 < len(blocks) else None
        assert answer is not None and answer[0] == "http", (
            f"API.md line {line}: a curl example must be followed by an ```http block "
            "with the answer it gets"
        )
        found.append(Example(line, content, parse_answer(answer[1], answer[2])))
    return found


def doc_variables(text: str) -> dict[str, str]:
    """The `export NAME=value` lines of the doc's conventions block."""
    exports = re.findall(r"^export (\w+)=(\S+)", text, re.M)
    assert exports, "API.md: no `export NAME=value` conventions block"
    return dict(exports)


# --- holding an answer to the doc ---------------------------------------------------------------


def _pattern(expected: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in expected.split(ELLIPSIS)), re.S)


def json_mismatches(expected: Any, actual: Any, where: str = "body") -> list[str]:
    """How `actual` differs from the doc's `expected`.

    `"…"` matches any value; a string with `…` in it matches strings that differ only
    there (`"turn_…"`); a `"…": "…"` member allows more members; a `"…"` last in a list
    allows more items. Anything else must be equal.
    """
    if isinstance(expected, str) and ELLIPSIS in expected:
        if expected == ELLIPSIS:
            return []
        if isinstance(actual, str) and _pattern(expected).fullmatch(actual):
            return []
        return [f"{where}: {actual!r} does not match {expected!r}"]
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return [f"{where}: expected an object, got {actual!r}"]
        shown = set(expected) - {ELLIPSIS}
        out = [f"{where}.{key}: missing" for key in sorted(shown - set(actual))]
        if ELLIPSIS not in expected:
            out += [f"{where}.{key}: not in the doc" for key in sorted(set(actual) - shown)]
        for key in sorted(shown & set(actual)):
            out += json_mismatches(expected[key], actual[key], f"{where}.{key}")
        return out
    if isinstance(expected, list):
        if not isinstance(actual, list):
            return [f"{where}: expected a list, got {actual!r}"]
        more = bool(expected) and expected[-1] == ELLIPSIS
        items = expected[:-1] if more else expected
        if len(actual) < len(items) or (not more and len(actual) != len(items)):
            return [f"{where}: {len(actual)} items, the doc shows {len(expected)}"]
        out = []
        for n, (e, a) in enumerate(zip(items, actual, strict=False)):
            out += json_mismatches(e, a, f"{where}[{n}]")
        return out
    if expected != actual or type(expected) is not type(actual):
        return [f"{where}: {actual!r}, the doc says {expected!r}"]
    return []


Frame = tuple[str | None, str | None]  # (id, event)


def sse_frames(text: str) -> list[Frame | str]:
    """Frames as (id, event); a doc's `…` line as `…`. Comment-only frames are dropped."""
    frames: list[Frame | str] = []
    for chunk in re.split(r"\r?\n\r?\n", text.strip()):
        lines = chunk.splitlines()
        if lines == [ELLIPSIS]:
            frames.append(ELLIPSIS)
            continue
        fields = dict(line.split(": ", 1) for line in lines if not line.startswith(":"))
        if fields:
            frames.append((fields.get("id"), fields.get("event")))
    return frames


def frame_matches(expected: Frame, actual: Frame) -> bool:
    """Same event; an id only where the doc shows one (`id: …` for any)."""
    (want_id, want_event), (got_id, got_event) = expected, actual
    if want_event != got_event or (want_id is None) != (got_id is None):
        return False
    return want_id is None or bool(_pattern(want_id).fullmatch(got_id or ""))


def sequence_matches(expected: list[Frame | str], actual: list[Frame]) -> bool:
    """Whether `actual` is `expected` with each `…` standing for any number of frames."""
    if not expected:
        return not actual
    head, rest = expected[0], expected[1:]
    if isinstance(head, str):  # `…`
        return any(sequence_matches(rest, actual[n:]) for n in range(len(actual) + 1))
    return bool(actual) and frame_matches(head, actual[0]) and sequence_matches(rest, actual[1:])


@dataclass
class Answer:
    status: int
    reason: str
    headers: dict[str, str]
    body: str


def parse_curl_output(raw: str) -> Answer:
    head, _, body = raw.partition("\r\n\r\n")
    status_line, *header_lines = head.split("\r\n")
    _, status, reason = status_line.split(" ", 2)
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(": ")
        headers[name.lower()] = value
    return Answer(int(status), reason, headers, body)


def mismatches(expected: Expected, answer: Answer) -> list[str]:
    out = []
    if (answer.status, answer.reason) != (expected.status, expected.reason):
        out.append(f"status {answer.status} {answer.reason}, the doc says {expected.status}")
    for name, value in expected.headers.items():
        got = answer.headers.get(name)
        if got is None or not _pattern(value).fullmatch(got):
            out.append(f"header {name}: {got!r}, the doc says {value!r}")
    if not expected.body:
        if answer.body:
            out.append(f"a body the doc does not show: {answer.body[:200]!r}")
        return out
    kind = answer.headers.get("content-type", "")
    if kind.startswith("application/json"):
        out += json_mismatches(json.loads(expected.body), json.loads(answer.body))
    elif kind.startswith("text/event-stream"):
        shown, sent = sse_frames(expected.body), sse_frames(answer.body)
        if not sequence_matches(shown, [f for f in sent if f != ELLIPSIS]):  # type: ignore[misc]
            out.append(f"frames {sent}, the doc shows {shown}")
    else:
        lines = answer.body.splitlines()
        for want in expected.body.splitlines():
            if want != ELLIPSIS and not any(_pattern(want).fullmatch(line) for line in lines):
                out.append(f"no line {want!r} in the body")
    return out


# --- running them --------------------------------------------------------------------------------


KEY = "change-me"  # the doc's SUBS_API_KEY, so its commands can be pasted as they are


def confirm_then_answer(body: dict[str, Any]) -> Text | ToolCalls:
    """The model: ask the client tool `confirm`; with its answer in hand, say something."""
    if body["messages"][-1]["role"] == "tool":
        return Text("Go ahead: checkout restarts in about a minute.")
    return ToolCalls([("confirm", {"question": "Restart it?"})])


def api_toml(vendor_url: str) -> str:
    """The doc's agent: `oncall`, with the client tool `confirm`."""
    return textwrap.dedent(
        f"""\
        [llm.openrouter]
        type = "openai"
        base_url = "{vendor_url}/v1"

        [agent.oncall]
        llm = "openrouter"
        model = "anthropic/claude-sonnet-4-5"
        system = "You are the on-call assistant."
        tools = [{{ name = "confirm", description = "Ask the person", handler = "client" }}]
        """
    )


@pytest.fixture
async def fake_slack() -> AsyncIterator[FakeSlack]:
    """The workspace the doc's Slack examples land in (the doc's `$SLACK_CHANNEL` is its
    #general)."""
    async with FakeSlack() as fake:
        yield fake


@pytest.fixture
async def serve(
    tmp_path: Path, redis_url: str, fake_slack: FakeSlack
) -> AsyncIterator[EngineProcess]:
    async with FakeVendor() as vendor:
        vendor.responder = confirm_then_answer
        config = tmp_path / "subs.toml"
        channel = fake_slack.general.id
        config.write_text(
            api_toml(vendor.url)
            + '\n[agent.oncall.slack]\nanswers = "channels"\n'
            + f'\n[hooks.alertmanager]\nagent = "oncall"\nchannel = "{channel}"\n'
        )
        env = {
            "SUBS_API_KEYS": KEY,
            "CLIENT_TOKEN_HS256_SECRET": "docs-" + "0" * 40,
            "SLACK_BOT_TOKEN_ONCALL": fake_slack.bot_token,
            "SLACK_SIGNING_SECRET_ONCALL": fake_slack.signing_secret,
            "SLACK_API_URL": fake_slack.url,
        }
        proc = await EngineProcess(config, redis_url, env).start()
        try:
            yield proc
        finally:
            await proc.stop()


async def run_shell(command: str, env: dict[str, str]) -> tuple[int, str, str]:
    """bash -u -c `command`; killed with its whole process group if it outlives the timeout."""
    proc = await asyncio.create_subprocess_exec(
        "bash",
        "-u",
        "-o",
        "pipefail",
        "-c",
        command,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), EXAMPLE_TIMEOUT)
    except TimeoutError:
        os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        raise AssertionError(f"still running after {EXAMPLE_TIMEOUT} s: {command}") from None
    finally:
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def quiet(store: Store, sid: str) -> dict[str, str]:
    """Wait until nothing runs in the session but client tool calls (which wait for the
    reader); the variables that gives: `CALL_ID`, the open client call's id."""

    async def settled() -> tuple[dict[str, str]] | None:  # a tuple: `{}` is an answer too
        state = await load_state(store, sid)
        if state is None:
            return ({},)
        calls = list(state.calls.values())
        if state.decision or state.pending or any(c.handler != "client" for c in calls):
            return None
        return ({"CALL_ID": calls[0].id} if calls else {},)

    found = await poll_until(settled, QUIET_TIMEOUT, f"session {sid} to wait for nothing")
    return found[0]


async def test_every_curl_example_in_api_md_answers_as_shown(
    serve: EngineProcess, redis_url: str, fake_slack: FakeSlack
) -> None:
    text = DOC.read_text()
    examples = curl_examples(text)
    assert len(examples) >= 15, f"only {len(examples)} curl examples found in {DOC}"
    env = {"PATH": os.environ["PATH"], **doc_variables(text), "SUBS_URL": serve.api}
    env["SLACK_CHANNEL"] = fake_slack.general.id  # the doc's is a placeholder
    assert env["SUBS_API_KEY"] == KEY, "the doc's SUBS_API_KEY must be the key the test serves"
    redis = connect(redis_url)
    store = await Store.open(redis)
    failures = []
    try:
        for example in examples:
            env.update(await quiet(store, env["SID"]))
            code, out, err = await run_shell(example.command, env)
            where = f"API.md line {example.line}"
            assert code == 0, f"{where}: curl exited {code}: {err}\n{example.command}"
            answer = parse_curl_output(out)
            wrong = mismatches(example.expected, answer)
            if wrong:
                failures.append(f"{where}:\n  " + "\n  ".join(wrong) + f"\n  got: {out[:1500]}")
            if answer.headers.get("content-type", "").startswith("application/json"):
                body = json.loads(answer.body)
                if isinstance(body, dict) and isinstance(body.get("interrupt_id"), str):
                    env["INTERRUPT_ID"] = body["interrupt_id"]
                if isinstance(body, dict) and isinstance(body.get("token"), str):
                    env["CLIENT_TOKEN"] = body["token"]  # the doc: "keep the token as …"
    finally:
        await redis.aclose()
    assert not failures, "\n".join(failures) + f"\nserve log:\n{serve.log_tail()}"


async def test_every_route_has_a_curl_example(redis_url: str) -> None:
    """Every route `subs serve` answers (but Slack's) is shown in docs/API.md."""
    redis = connect(redis_url)
    try:
        store = await Store.open(redis)
        app = make_app(Client(store), store, keys=ApiKeys())
        routes = {
            (route.method, route.resource.canonical)
            for route in app.router.routes()
            if route.method != "HEAD" and route.resource is not None
        }
    finally:
        await redis.aclose()
    shown = [(e.method, e.path) for e in curl_examples(DOC.read_text())]
    missing = []
    for method, template in sorted(routes):
        path = re.compile(re.sub(r"\\\{\w+\\\}", "[^/]+", re.escape(template)))
        if not any(m == method and path.fullmatch(p) for m, p in shown):
            missing.append(f"{method} {template}")
    assert not missing, f"routes without a curl example in {DOC}: {missing}"
    assert len(routes) >= 12


def github_anchor(heading: str) -> str:
    """The id GitHub gives a heading: lower case, punctuation dropped, spaces as '-'."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


@pytest.mark.parametrize("doc", ["docs/API.md", "docs/slack.md", "docs/workers.md", "README.md"])
def test_in_page_links_lead_somewhere(doc: str) -> None:
    text = (ROOT / doc).read_text()
    outside = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    anchors = {github_anchor(h) for h in re.findall(r"^#+ (.+)$", outside, re.M)}
    links = set(re.findall(r"\]\(#([^)]+)\)", outside))
    assert links - anchors == set(), f"{doc}: links to no heading: {sorted(links - anchors)}"
    for target in re.findall(r"\]\((?!#|https?:)([^)#]+)", outside):
        assert (ROOT / doc).parent.joinpath(target).exists(), f"{doc}: no file {target}"


# --- what auth errors tell a person -------------------------------------------------------------


async def test_the_cli_names_subs_api_key_when_a_remote_engine_refuses_it(
    serve: EngineProcess,
) -> None:
    url = serve.api
    code, _, err = await subs("sessions", "list", "--url", url, env={"SUBS_API_KEY": ""})
    assert code == 1
    assert "SUBS_API_KEY is not set" in err and "SUBS_API_KEYS" in err, err
    code, _, err = await subs("sessions", "list", "--url", url, env={"SUBS_API_KEY": "guess"})
    assert code == 1
    assert "the key in SUBS_API_KEY is not one of the server's SUBS_API_KEYS" in err, err
    assert "guess" not in err  # the key itself is never printed
    code, out, err = await subs("sessions", "list", "--url", url, env={"SUBS_API_KEY": KEY})
    assert (code, out) == (0, ""), err


async def test_a_refused_key_is_told_the_header_and_the_setting(serve: EngineProcess) -> None:
    for header, said in [
        (None, "missing API key"),
        ("Bearer guess", "unknown API key"),
        (f"Basic {KEY}", "the Authorization header is not a Bearer key"),
    ]:
        auth = [] if header is None else ["-H", f"Authorization: {header}"]
        command = shlex.join(["curl", "-sS", "-i", f"{serve.api}/api/admin/sessions", *auth])
        code, out, err = await run_shell(command, {"PATH": os.environ["PATH"]})
        assert code == 0, err
        answer = parse_curl_output(out)
        assert answer.status == 401 and answer.headers["www-authenticate"] == "Bearer"
        body = json.loads(answer.body)
        assert body["code"] == "unauthorized"
        assert body["error"].startswith(said), body
        assert 'send "Authorization: Bearer <key>" with a key from SUBS_API_KEYS' in body["error"]
        assert "guess" not in body["error"]
