"""The operator console in a real browser: Debian's headless chromium, driven through its
chromedriver by selenium, against a real `subs serve` on a real Redis; only the model
vendor is fake. Each test asserts what a person would see on the page, and saves
screenshots under tests/artifacts/.

Selenium is synchronous: its calls run in a thread (`_page`), so the fake vendor and the
proxy, which live on the test's event loop, keep answering while the browser waits.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import textwrap
from collections.abc import AsyncIterator, Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from aiohttp import web

from engine.store.keys import META
from engine.store.reindex import DONE_FIELD
from engine.store.store import Store, connect
from tests.engine_helpers import ROOT, EngineProcess, poll_until
from tests.fakes.llm_vendor import FakeVendor, HttpError, Reply, Text, ToolCalls
from tests.old_sessions import FAILURE as OLD_FAILURE
from tests.old_sessions import old_log, old_logs, store_log

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
if CHROMIUM is None or CHROMEDRIVER is None:
    pytest.skip(
        "the console's browser tests need Debian's chromium and chromium-driver "
        "(apt-get install chromium chromium-driver; .ci/run installs them)",
        allow_module_level=True,
    )

from selenium import webdriver  # noqa: E402  (only with a browser to drive)
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webelement import WebElement  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

ARTIFACTS = ROOT / "tests" / "artifacts"
FULL_KEY = "console-full-key"
READ_KEY = "console-read-key"
WAIT = 20.0  # seconds a page gets to show what it should
FAILURE = "model unavailable: quota exhausted for this project"


def _model(body: dict[str, Any]) -> Reply:
    """The model: fails when asked to, asks `confirm` when told to wait, else answers."""
    last = body["messages"][-1]
    text = str(last.get("content") or "")
    if last["role"] == "tool":
        return Text("Confirmed; restarting checkout now.")
    if "fail" in text:
        return HttpError(400, body={"error": {"message": FAILURE, "type": "invalid_request"}})
    if "wait" in text:
        return ToolCalls([("confirm", {"question": "Restart checkout?"})])
    if "slowly" in text:  # a slow vendor: its tokens show while they stream
        return Text("Typing this one slowly, word by word.", chunk_delay=0.15)
    if "payments" in text:  # as a second turn would: its prefix read from the vendor's cache
        return Text(f"Checkout is healthy (you asked: {text}).", cache_read=300)
    return Text(f"Checkout is healthy (you asked: {text}).")


def _toml(vendor_url: str, extra: str = "") -> str:
    """The project; `extra` adds keys to the agent's block."""
    return (
        textwrap.dedent(
            f"""\
        [llm.openai]
        type = "openai"
        base_url = "{vendor_url}/v1"

        [agent.oncall]
        llm = "openai"
        model = "gpt-4.1-mini"
        system = "You are the on-call assistant."
        tools = [{{ name = "confirm", description = "Ask the person", handler = "client" }}]
        """
        )
        + extra
    )


class Proxy:
    """A TCP relay between the browser and `subs serve`, whose `cut()` drops every open
    connection at once: the network failing under the page, the server still up."""

    def __init__(self, target: str) -> None:
        host, _, port = target.removeprefix("http://").rpartition(":")
        self.target = (host, int(port))
        self.url = ""
        self.server: asyncio.Server | None = None
        self.open: set[asyncio.StreamWriter] = set()

    async def start(self) -> Proxy:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self.open |= {writer, up_writer}

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))
        self.open -= {writer, up_writer}

    def cut(self) -> int:
        """Drop every connection now; how many there were."""
        dropped = len(self.open)
        for writer in self.open:
            writer.transport.abort()
        self.open.clear()
        return dropped

    async def stop(self) -> None:
        self.cut()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


class Page:
    """One headless chromium with a fresh profile, shared by the module's tests (`fresh()`
    gives each a new tab on a browser holding nothing of the last test's); every call here
    blocks (run it in a thread through `_page`)."""

    def __init__(self, profile: Path) -> None:
        options = webdriver.ChromeOptions()
        options.binary_location = str(CHROMIUM)
        for flag in (
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--window-size=1400,1000",
            f"--user-data-dir={profile}",
        ):
            options.add_argument(flag)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        self.driver = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))
        self.driver.set_page_load_timeout(WAIT)  # a page that never loads fails, not hangs
        self.origins: set[str] = set()  # whose storage the next test must not see

    def fresh(self) -> None:
        """A new tab, every other one closed, every visited origin's storage (the keys in
        sessionStorage among it), the cookies and the cache cleared, the log emptied."""
        driver = self.driver
        for origin in self.origins:
            driver.execute_cdp_cmd(
                "Storage.clearDataForOrigin", {"origin": origin, "storageTypes": "all"}
            )
        self.origins.clear()
        driver.execute_cdp_cmd("Network.clearBrowserCookies", {})
        driver.execute_cdp_cmd("Network.clearBrowserCache", {})
        old = driver.window_handles
        driver.switch_to.new_window("tab")
        tab = driver.current_window_handle
        for handle in old:
            driver.switch_to.window(handle)
            driver.close()
        driver.switch_to.window(tab)
        driver.get_log("browser")  # what the last test's pages logged

    def open(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme in ("http", "https"):
            self.origins.add(f"{parts.scheme}://{parts.netloc}")
        self.driver.get(url)

    def find(self, css: str) -> WebElement:
        return self.driver.find_element(By.CSS_SELECTOR, css)

    def all(self, css: str) -> list[WebElement]:
        return self.driver.find_elements(By.CSS_SELECTOR, css)

    def until(self, what: str, check: Callable[[], Any]) -> Any:
        """Poll `check` until it is truthy (what a person sees changes with no reload)."""

        def probe(_: Any) -> Any:
            try:
                return check()
            except Exception:  # an element not there yet, or replaced while read
                return False

        try:
            return WebDriverWait(self.driver, WAIT, poll_frequency=0.1).until(probe)
        except Exception as err:
            raise AssertionError(
                f"the page never showed {what} within {WAIT} s; it shows:\n"
                f"{self.find('body').text[:3000]}\nbrowser log: {self.console_log()}"
            ) from err

    def text_shown(self, text: str) -> bool:
        return text in self.find("body").text

    def console_log(self) -> list[str]:
        return [entry["message"] for entry in self.driver.get_log("browser")]

    def shot(self, name: str) -> Path:
        ARTIFACTS.mkdir(exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        self.driver.save_screenshot(str(path))
        return path

    def quit(self) -> None:
        self.driver.quit()


async def _page(fn: Callable[..., Any], *args: Any) -> Any:
    return await asyncio.to_thread(fn, *args)


# A budget the spend test's second turn runs into (issue #28): one model call per turn.
BUDGET = (
    "budget = { max_cost_usd = 0.5, max_model_calls = 1, max_tokens = 100000 }\n"
    "session_budget = { max_cost_usd = 1 }\n"
)


@pytest.fixture
async def served(
    tmp_path: Path, redis_url: str, request: pytest.FixtureRequest
) -> AsyncIterator[tuple[EngineProcess, Proxy]]:
    """`subs serve` behind a Proxy; parametrized indirectly, the text adds to the agent."""
    async with FakeVendor() as vendor:
        vendor.responder = _model
        config = tmp_path / "subs.toml"
        config.write_text(_toml(vendor.url, getattr(request, "param", "")))
        keys = f"{FULL_KEY},{READ_KEY}:read"
        proc = await EngineProcess(config, redis_url, {"SUBS_API_KEYS": keys}).start()
        proxy = await Proxy(proc.api).start()
        try:
            yield proc, proxy
        finally:
            await proxy.stop()
            await proc.stop()


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Page]:
    """One chromium for the module: starting one costs a second or two of CPU."""
    started = Page(tmp_path_factory.mktemp("chromium-profile"))
    try:
        yield started
    finally:
        started.quit()


@pytest.fixture
def page(browser: Page) -> Page:
    browser.fresh()
    return browser


class Api:
    """The test's own client of the server: turns are started here, not in the page."""

    def __init__(self, base: str) -> None:
        self.http = httpx.AsyncClient(
            base_url=base, headers={"Authorization": f"Bearer {FULL_KEY}"}, timeout=10
        )

    async def say(self, text: str, session_id: str) -> None:
        message = {"role": "user", "content": text}
        body = {
            "session_id": session_id,
            "input": {"type": "client.message", "agent_id": "oncall", "message": message},
        }
        answer = await self.http.post("/api/client/sessions/input", json=body)
        assert answer.status_code == 202, answer.text

    async def settled(self, session_id: str, status: str, seq_at_least: int = 0) -> dict:
        """The session once it shows `status` (and its log reached `seq_at_least`)."""

        async def shown() -> dict | None:
            view = (await self.http.get(f"/api/client/sessions/{session_id}")).json()
            ok = view.get("status") == status and view.get("seq", 0) >= seq_at_least
            if status == "running":  # a running turn waits on its client tool
                ok = ok and any(m.get("tool_calls") for m in view["messages"])
            return view if ok else None

        return await poll_until(shown, WAIT, f"session {session_id} to be {status}")

    async def aclose(self) -> None:
        await self.http.aclose()


@pytest.fixture
async def api(served: tuple[EngineProcess, Proxy]) -> AsyncIterator[Api]:
    client = Api(served[0].api)
    try:
        yield client
    finally:
        await client.aclose()


async def test_console_lists_sessions_and_shows_a_live_timeline(
    served: tuple[EngineProcess, Proxy], page: Page, api: Api
) -> None:
    _, proxy = served
    await api.say("is checkout up?", "ses-healthy")
    done = await api.settled("ses-healthy", "idle")
    await api.say("please fail now", "ses-broken")
    await api.settled("ses-broken", "idle")

    # Keys are set: the page asks for one before it shows anything.
    await _page(page.open, f"{proxy.url}/console")
    await _page(page.until, "the key prompt", lambda: page.find("#key-form").is_displayed())
    assert "API key" in page.find("#key-form").text
    await _page(page.shot, "console-key-prompt")
    await _page(lambda: page.find("#key").send_keys(FULL_KEY + "\n"))

    # The list: both sessions, the failed one marked with its reason.
    row = "#sessions tr[data-session='{}']"
    await _page(page.until, "the sessions", lambda: page.find(row.format("ses-broken")))
    healthy = page.find(row.format("ses-healthy")).text
    assert "oncall" in healthy and "idle" in healthy and "is checkout up?" in healthy
    broken = page.find(row.format("ses-broken"))
    assert "failed" in broken.get_attribute("class")
    assert FAILURE in broken.text
    rows = [r.get_attribute("data-session") for r in page.all("#sessions tbody tr")]
    assert rows == ["ses-broken", "ses-healthy"], "newest first"
    await _page(page.shot, "console-list")

    # A session started while the list is open shows up in it, on top, with no reload.
    page.driver.execute_script("window.sameDocument = true")
    await api.say("is search up?", "ses-newer")
    await _page(
        page.until,
        "the new session on top",
        lambda: page.all("#sessions tbody tr")[0].get_attribute("data-session") == "ses-newer",
    )
    assert page.driver.execute_script("return window.sameDocument") is True

    # Filtered by status: only the failed one.
    await _page(page.open, f"{proxy.url}/console?status=failed")
    await _page(page.until, "the filtered list", lambda: page.all("#sessions tbody tr"))
    assert [r.get_attribute("data-session") for r in page.all("#sessions tbody tr")] == [
        "ses-broken"
    ]

    # One session's timeline: the model call with its latency, tokens, cost and reply.
    await _page(page.open, f"{proxy.url}/console/sessions/ses-healthy")
    call = "#timeline tr.model-call.ok"
    await _page(page.until, "the model call", lambda: page.find(call))
    cells = page.find(call)
    took = cells.find_element(By.CSS_SELECTOR, "td.took").text
    assert took.endswith((" ms", " s")), took
    tokens = cells.find_element(By.CSS_SELECTOR, "td.tokens").text
    assert " in · " in tokens and tokens.endswith(" out"), tokens
    assert cells.find_element(By.CSS_SELECTOR, "td.cost").text.startswith("$")
    assert "gpt-4.1-mini" in cells.text
    reply = done["messages"][-1]["content"]
    assert reply in cells.text
    assert reply in page.find("#path").text  # the active path beside it
    assert "is checkout up?" in page.find("#path").text
    assert page.find("#status").text == "idle"

    # A turn started after the page opened appears with no reload.
    page.driver.execute_script("window.sameDocument = true")
    await api.say("and payments?", "ses-healthy")
    await _page(
        page.until,
        "the second turn's reply",
        lambda: len(page.all(call)) == 2 and "you asked: and payments?" in page.all(call)[1].text,
    )
    assert page.driver.execute_script("return window.sameDocument") is True
    await _page(
        page.until,
        "the active path's new reply",
        lambda: "you asked: and payments?" in page.find("#path").text,
    )
    # The cache hit share: the call's, the turn's and the session's.
    tokens_of = "td.tokens"
    await _page(
        page.until,
        "the call's cache hit share",
        lambda: re.fullmatch(
            r"[\d,]+ in \(\d+% cached\) · [\d,]+ out",
            page.all(call)[1].find_element(By.CSS_SELECTOR, tokens_of).text,
        ),
    )
    assert "cached" not in page.all(call)[0].find_element(By.CSS_SELECTOR, tokens_of).text
    await _page(
        page.until,
        "the session's cache hit share",
        lambda: re.fullmatch(r"[1-9]\d?%", page.find("#cache-share").text),
    )
    await _page(
        page.until,
        "the turn's cache hit share",
        lambda: re.search(r"total · [1-9]\d?% cache hits", page.find("#timeline").text),
    )
    await _page(page.shot, "console-timeline")

    # The failed turn's reason, on its own row.
    await _page(page.open, f"{proxy.url}/console/sessions/ses-broken")
    failed = "#timeline tr.turn-failed"
    await _page(page.until, "the failure", lambda: FAILURE in page.find(failed).text)
    assert "failed" in page.find("#timeline tr.model-call").get_attribute("class")

    # Cancel a running turn (it waits on a client tool) from the page.
    await api.say("wait for my confirm", "ses-waiting")
    await api.settled("ses-waiting", "running")
    await _page(page.open, f"{proxy.url}/console/sessions/ses-waiting")
    await _page(page.until, "the cancel button", lambda: page.find("#cancel").is_displayed())
    assert page.find("#status").text == "running"
    assert "Restart checkout?" in page.find("#timeline tr.tool-client").text
    await _page(lambda: page.find("#cancel").click())
    await _page(page.until, "the ended turn", lambda: page.find("#status").text == "idle")
    assert page.all("#timeline tr.turn-failed"), "a cancelled turn ends as failed"
    assert not page.find("#cancel").is_displayed()
    await _page(page.shot, "console-cancelled")
    await api.settled("ses-waiting", "idle")
    assert not [m for m in page.console_log() if "SEVERE" in m and "401" not in m]


async def test_a_read_only_key_sees_but_cannot_cancel_and_the_stream_resumes(
    served: tuple[EngineProcess, Proxy], page: Page, api: Api
) -> None:
    _, proxy = served
    await api.say("wait for my confirm", "ses-held")
    await api.settled("ses-held", "running")
    await _page(page.open, f"{proxy.url}/console/sessions/ses-held")
    await _page(page.until, "the key prompt", lambda: page.find("#key-form").is_displayed())
    await _page(lambda: page.find("#key").send_keys(READ_KEY + "\n"))
    await _page(page.until, "the tool call", lambda: page.find("#timeline tr.tool-client"))
    await _page(lambda: page.find("#cancel").click())
    await _page(page.until, "the refusal", lambda: "read-only" in page.find("#notice").text)
    assert "cancel refused" in page.find("#notice").text
    assert (await api.settled("ses-held", "running"))["status"] == "running"

    # The network drops under the page; it reconnects and misses nothing.
    await _page(page.until, "a live stream", lambda: "live" in page.find("#conn").text)
    await api.say("status of search?", "ses-live")
    await api.settled("ses-live", "idle")
    await _page(page.open, f"{proxy.url}/console/sessions/ses-live")
    call = "#timeline tr.model-call.ok"
    await _page(page.until, "the first reply", lambda: page.find(call))
    await _page(page.until, "a live stream", lambda: "live" in page.find("#conn").text)
    seen = len(page.all("#timeline tbody tr"))
    assert proxy.cut() >= 1
    await api.say("and the index?", "ses-live")
    await _page(
        page.until,
        "the turn sent while disconnected",
        lambda: "you asked: and the index?" in page.find("#timeline").text,
    )
    assert "live" in page.find("#conn").text
    view = await api.settled("ses-live", "idle")
    await _page(
        page.until,
        "one row per step, none twice",
        lambda: len(page.all("#timeline tr[data-seq]")) > seen,
    )
    seqs = [int(r.get_attribute("data-seq")) for r in page.all("#timeline tr[data-seq]")]
    assert len(seqs) == len(set(seqs)) and max(seqs) <= view["seq"]
    assert len(page.all("#timeline tr.turn")) == 2

    # The model's tokens show in its row as they stream, then the whole reply.
    await api.say("answer slowly", "ses-live")
    typing = "#timeline tr.model-call .block.live"
    await _page(page.until, "the tokens so far", lambda: "Typing" in page.find(typing).text)
    assert "word by word." not in page.find(typing).text
    await _page(
        page.until,
        "the whole reply",
        lambda: "Typing this one slowly, word by word." in page.all(call)[-1].text,
    )
    assert not page.all(typing)


GOLDEN = sorted((ROOT / "tests" / "golden").glob("*.jsonl"))
# What each kind of step shows as, for the logs that hold one (golden log -> row texts).
SHOWN = {
    "worker_interrupt": ["interrupt", "resumed", "decision"],
    "worker_tool": ["tool worker", "decision"],
    "worker_decision_retries_fail": ["decision", "attempt 1:", "turn failed"],
    "engine_vendor_retries": ["model call", "(will retry)"],
    "subagents.1": ["subagent"],
    "engine_cancel": ["turn failed", "cancelled"],
    "connectors": ["mcp tools", "mcp.clock", "tools: ", "mcp.gone", "is off", "tool server"],
    "connector_off": [
        "mcp.changes · off",
        "off: its command names CHANGES_REPO, which is not set; the agent runs without its tools",
        "still off: its command names CHANGES_REPO",
    ],
}


async def test_every_golden_log_draws_a_timeline_with_no_unknown_step_or_script_error(
    served: tuple[EngineProcess, Proxy], page: Page, redis_url: str
) -> None:
    """The golden logs, recorded from real engine runs, hold every kind of event the
    catalogue has: each one, put in Redis as the engine stores it, draws a row per step."""
    _, proxy = served
    redis = connect(redis_url)
    try:
        store = await Store.open(redis)
        for log in GOLDEN:
            events = [json.loads(line) for line in log.read_text().splitlines()]
            await store_log(store, events)
    finally:
        await redis.aclose()
    await _page(page.open, f"{proxy.url}/console")
    await _page(page.until, "the key prompt", lambda: page.find("#key-form").is_displayed())
    await _page(lambda: page.find("#key").send_keys(READ_KEY + "\n"))
    await _page(page.until, "the sessions", lambda: page.all("#sessions tbody tr"))
    for log in GOLDEN:
        events = [json.loads(line) for line in log.read_text().splitlines()]
        sid, last = events[0]["session_id"], events[-1]["seq"]
        await _page(page.open, f"{proxy.url}/console/sessions/{sid}")
        await _page(
            page.until,
            f"{log.stem}'s events up to {last}",
            lambda last=last: page.find("#facts-seq").text == str(last),
        )
        kinds = [cell.text for cell in page.all("#timeline td.kind")]
        unknown = [k for k in kinds if "." in k]  # a kind shown raw: the page does not know it
        assert not unknown, f"{log.stem}: steps drawn as raw kinds {unknown}"
        text = page.find("#timeline").text
        for shown in SHOWN.get(log.stem, []):
            assert shown in text, f"{log.stem}: no {shown!r} in its timeline:\n{text}"
        errors = [m for m in page.console_log() if "SEVERE" in m or "could not show" in m]
        assert not errors, f"{log.stem}: {errors}"
        if log.stem == "worker_tool":
            await _page(page.shot, "console-timeline-worker")
        if log.stem == "connectors":
            await _page(page.shot, "console-timeline-mcp")
        if log.stem == "connector_off":  # a note on each turn's sync, never a red row
            assert not page.all("#timeline tr.failed")
            notes = page.all("#timeline tr.note")
            assert [n.find_element(By.CSS_SELECTOR, "td.kind").text for n in notes] == [
                "mcp tools",
                "mcp tools",
            ]
            await _page(page.shot, "console-timeline-mcp-off")


async def test_the_list_draws_sessions_an_older_version_stored(
    served: tuple[EngineProcess, Proxy], page: Page, redis_url: str
) -> None:
    """A user message with no content, content null, parts without text, an unknown
    role (tests/old_sessions.py): each lists, and a failed one reads `failed`."""
    _, proxy = served
    logs = old_logs()
    redis = connect(redis_url)
    try:
        store = await Store.open(redis)
        for events in logs:
            await store_log(store, events, indexed=False)
        await redis.hdel(META, DONE_FIELD)  # an older version kept no listing indexes
    finally:
        await redis.aclose()
    await _page(page.open, f"{proxy.url}/console")
    await _page(page.until, "the key prompt", lambda: page.find("#key-form").is_displayed())
    await _page(lambda: page.find("#key").send_keys(READ_KEY + "\n"))
    await _page(page.until, "the sessions", lambda: len(page.all("#sessions tbody tr")) == 6)
    assert not page.all("#error")
    rows = {r.get_attribute("data-session"): r for r in page.all("#sessions tbody tr")}
    assert list(rows) == [events[0]["session_id"] for events in logs][::-1]
    for sid, row in rows.items():
        badge = row.find_element(By.CSS_SELECTOR, ".badge").text
        assert badge == ("failed" if sid == "ses-old-failed" else "idle"), (sid, row.text)
    assert "failed" in rows["ses-old-failed"].get_attribute("class")
    assert OLD_FAILURE in rows["ses-old-failed"].text
    assert "look at" in rows["ses-old-text-parts"].text
    await _page(page.shot, "console-list-old-sessions")
    for sid in ("ses-old-no-content", "ses-old-unknown-role"):
        await _page(page.open, f"{proxy.url}/console/sessions/{sid}")
        await _page(page.until, f"{sid}'s events", lambda: page.find("#facts-seq").text == "5")
        assert page.find("#status").text == "idle"
    errors = [m for m in page.console_log() if "SEVERE" in m or "could not show" in m]
    assert not errors, errors


async def test_the_list_pages_by_cursor_older_and_back_to_the_newest(
    served: tuple[EngineProcess, Proxy], page: Page, redis_url: str
) -> None:
    """60 sessions, 50 a page: "older »" follows the page's next_cursor to the last 10
    (none twice, none missing), "« newest" goes back to the first page."""
    _, proxy = served
    ids = [f"ses-page-{n:02d}" for n in range(60)]
    redis = connect(redis_url)
    try:
        store = await Store.open(redis)
        for n, sid in enumerate(ids):
            await store_log(
                store, old_log(sid, {"role": "user", "content": f"q{n}"}, minute=n), indexed=False
            )
        await redis.hdel(META, DONE_FIELD)  # written as an older version did: indexed once
    finally:
        await redis.aclose()
    await _page(page.open, f"{proxy.url}/console")
    await _page(page.until, "the key prompt", lambda: page.find("#key-form").is_displayed())
    await _page(lambda: page.find("#key").send_keys(READ_KEY + "\n"))

    def shown() -> list[str]:
        return [r.get_attribute("data-session") for r in page.all("#sessions tbody tr")]

    await _page(page.until, "the first page", lambda: len(shown()) == 50)
    first = shown()
    assert first == ids[::-1][:50] and not page.all("#newest")
    await _page(lambda: page.find("#older").click())
    await _page(page.until, "the older page", lambda: shown() and shown()[0] == ids[9])
    assert shown() == ids[::-1][50:] and not page.all("#older")
    assert "cursor=" in page.driver.current_url
    await _page(page.shot, "console-list-older-page")
    await _page(lambda: page.find("#newest").click())
    await _page(page.until, "the first page again", lambda: shown() == first)
    assert not page.all("#error")
    # A cursor the API refuses (too old, or not one of its own) starts again from the newest.
    await _page(page.open, f"{proxy.url}/console?cursor=stale")
    await _page(page.until, "the newest page", lambda: "cursor=" not in page.driver.current_url)
    await _page(page.until, "its sessions", lambda: shown() == first)
    assert not page.all("#error")


async def test_the_list_shows_a_banner_while_the_store_is_full(
    served: tuple[EngineProcess, Proxy], page: Page, redis_url: str
) -> None:
    """Redis past 90 % of its maxmemory (the admin API's `store.full`): the list page says
    so and names the settings; room made, the banner goes at the next refresh."""
    _, proxy = served
    redis = connect(redis_url)
    [(_, before)] = (await redis.config_get("maxmemory")).items()
    try:
        await _page(page.open, f"{proxy.url}/console")
        await _page(page.until, "the key prompt", lambda: page.find("#key-form").is_displayed())
        await _page(lambda: page.find("#key").send_keys(FULL_KEY + "\n"))
        await _page(page.until, "the list", lambda: page.find("#list-note").text)
        assert not page.find("#store-full").is_displayed()
        used = (await redis.info("memory"))["used_memory"]
        await redis.config_set("maxmemory", int(used / 0.93))  # full, yet writes still fit
        banner = await _page(
            page.until,
            "the store-full banner",
            lambda: page.find("#store-full").is_displayed() and page.find("#store-full"),
        )
        assert "The store is full" in banner.text and "[store] max_memory" in banner.text
        assert "503 store_full" in banner.text
        await _page(page.shot, "console-list-store-full")
        await redis.config_set("maxmemory", before)
        await _page(
            page.until, "the banner to go", lambda: not page.find("#store-full").is_displayed()
        )
    finally:
        await redis.config_set("maxmemory", before)
        await redis.aclose()
    errors = [m for m in page.console_log() if "SEVERE" in m or "could not show" in m]
    assert not errors, errors


async def test_the_chat_page_sends_the_first_message_once_the_key_is_in_and_asks_the_tool(
    served: tuple[EngineProcess, Proxy], page: Page, api: Api
) -> None:
    """/console/chat/<agent> over the AG-UI endpoint: the first message, refused for want
    of a key, waits on the page and goes once the key is in (a wrong key first); the
    session id shows; a client tool's question is shown and answered with a button; the
    thread shows again on a fresh load."""
    _, proxy = served
    await _page(page.open, f"{proxy.url}/console/chat/oncall")
    await _page(page.until, "the composer", lambda: page.find("#text").is_displayed())
    assert page.find("#title").text == "oncall"
    assert not page.find("#session-line").is_displayed()  # no session before a run

    def say(text: str) -> None:
        page.find("#text").send_keys(text + "\n")

    await _page(say, "is checkout ok?")
    await _page(page.until, "the key prompt", lambda: page.find("#key-form").is_displayed())
    assert "This API needs a key" in page.find("#status").text
    assert "your message is sent once it is in" in page.find("#status").text
    # Refused, not lost: the message waits on the page, marked as not sent.
    assert [m.text for m in page.all("#log .msg.user.pending")] == ["is checkout ok?"]
    assert page.find("#text").get_attribute("value") == ""
    assert not page.find("#session-line").is_displayed()
    await _page(page.shot, "chat-key-prompt")
    await _page(lambda: page.find("#key").send_keys("not-a-key\n"))
    await _page(
        page.until, "the refusal", lambda: "That key was refused" in page.find("#status").text
    )
    assert page.find("#key-form").is_displayed()
    await _page(lambda: page.find("#key").send_keys(FULL_KEY + "\n"))
    reply = "Checkout is healthy (you asked: is checkout ok?)."
    await _page(page.until, "the reply, with nothing sent again", lambda: page.text_shown(reply))
    assert not page.find("#key-form").is_displayed()  # asked for, then out of the way
    assert [m.text for m in page.all("#log .msg.user")] == ["is checkout ok?"]
    assert not page.all("#log .msg.pending")

    # The session: its id as text to copy, and a link to its console page.
    thread = page.driver.execute_script("return location.hash.slice(1)")
    assert page.find("#session-id").text == thread
    assert page.find("#session-line").is_displayed()
    assert (
        page.find("#to-session").get_attribute("href") == f"{proxy.url}/console/sessions/{thread}"
    )

    # A client tool: the run ends waiting; its question is shown, with yes and no.
    await _page(say, "please wait for me")
    await _page(page.until, "the question", lambda: page.find("#questions").is_displayed())
    asks = page.find("#questions").text
    assert "Restart checkout?" in asks and "confirm" in asks, asks
    assert page.find("#questions .question").text == "Restart checkout?"
    await _page(page.shot, "chat-question")
    await _page(lambda: page.find("#questions button.yes").click())
    done = "Confirmed; restarting checkout now."
    await _page(page.until, "the answer after the tool", lambda: page.text_shown(done))
    assert not page.find("#questions").is_displayed()
    await _page(page.shot, "chat-page")
    shown = [m.text for m in page.all("#log .msg")]
    assert shown[0] == "is checkout ok?" and shown[-1] == done
    assert any("confirm" in m for m in shown) and "→ yes" in shown

    view = await api.settled(thread, "idle")
    assert [m["content"] for m in view["messages"] if m["role"] == "user"] == [
        "is checkout ok?",
        "please wait for me",
    ]
    assert [m["content"] for m in view["messages"] if m["role"] == "tool"] == ["yes"]

    # The thread is the session: its history comes back on a fresh load of the page.
    await _page(page.open, "about:blank")
    await _page(page.open, f"{proxy.url}/console/chat/oncall#{thread}")
    await _page(page.until, "the thread again", lambda: page.text_shown(done))
    assert [m.text for m in page.all("#log .msg")] == shown
    assert page.find("#session-id").text == thread
    assert not [entry for entry in page.console_log() if "SEVERE" in entry and "401" not in entry]


async def test_the_console_and_the_chat_page_link_to_each_other(
    served: tuple[EngineProcess, Proxy], page: Page, api: Api
) -> None:
    """The console links each agent's chat, and a session's page opens its thread on the
    chat page (with the key already given, and the open question asked there); the chat
    page links back; an address with no agent behind it lists the agents."""
    _, proxy = served
    await api.say("wait for my confirm", "ses-linked")
    await api.settled("ses-linked", "running")
    await _page(page.open, f"{proxy.url}/console")
    await _page(page.until, "the key prompt", lambda: page.find("#key-form").is_displayed())
    await _page(lambda: page.find("#key").send_keys(FULL_KEY + "\n"))
    row = "#sessions tr[data-session='ses-linked'] a.chat"
    await _page(page.until, "the session's row", lambda: page.find(row))
    assert page.find(row).get_attribute("href") == f"{proxy.url}/console/chat/oncall"
    assert page.find("#to-chat").get_attribute("href") == f"{proxy.url}/console/chat"
    await _page(page.shot, "console-list-chat-links")
    await _page(page.open, f"{proxy.url}/console?agent=oncall")
    await _page(page.until, "the filter's chat link", lambda: page.find("#chat-agent"))
    assert page.find("#chat-agent").text == "chat with oncall"
    assert page.find("#chat-agent").get_attribute("href") == f"{proxy.url}/console/chat/oncall"

    # A session's page opens its thread on the chat page: no key asked again (the
    # tab keeps one for both pages), the history and the open question shown.
    await _page(page.open, f"{proxy.url}/console/sessions/ses-linked")
    await _page(page.until, "the chat link", lambda: page.find("#open-chat").is_displayed())
    await _page(page.shot, "console-session-chat-link")
    await _page(lambda: page.find("#open-chat").click())
    await _page(page.until, "the thread's question", lambda: page.find("#questions").is_displayed())
    assert page.driver.current_url == f"{proxy.url}/console/chat/oncall#ses-linked"
    assert not page.find("#key-form").is_displayed()
    assert "wait for my confirm" in page.find("#log").text
    assert page.find("#questions .question").text == "Restart checkout?"
    assert page.find("#session-id").text == "ses-linked"
    await _page(page.shot, "chat-from-the-console")
    await _page(lambda: page.find("#text").send_keys("go ahead\n"))  # typed, not a button
    done = "Confirmed; restarting checkout now."
    await _page(page.until, "the turn going on", lambda: page.text_shown(done))
    view = await api.settled("ses-linked", "idle")
    assert [m["content"] for m in view["messages"] if m["role"] == "tool"] == ["go ahead"]

    # And back: the session's console page, then the console.
    await _page(lambda: page.find("#to-session").click())
    await _page(page.until, "the session's timeline", lambda: page.find("#timeline tr.turn-done"))
    assert page.driver.current_url == f"{proxy.url}/console/sessions/ses-linked"
    assert page.find("#status").text == "idle"
    await _page(page.open, f"{proxy.url}/console/chat/oncall")
    await _page(lambda: page.find("#to-console").click())
    await _page(
        page.until, "the list", lambda: page.find("#sessions tr[data-session='ses-linked']")
    )

    # No agent in the address, or one the server does not run: a page listing the agents.
    await _page(lambda: page.find("#to-chat").click())
    await _page(page.until, "the agents", lambda: page.find("#agents a"))
    assert page.find("#problem").text == "Which agent?"
    await _page(page.shot, "chat-which-agent")
    await _page(lambda: page.find("#agents a").click())
    await _page(page.until, "the chat page", lambda: page.find("#title").text == "oncall")
    await _page(page.open, f"{proxy.url}/console/chat/nobody")
    await _page(page.until, "the missing agent", lambda: page.find("#problem"))
    assert page.find("#problem").text == "No agent named 'nobody'"
    assert [a.text for a in page.all("#agents a")] == ["oncall"]
    assert page.find("#to-console").get_attribute("href") == f"{proxy.url}/console"
    await _page(page.shot, "chat-no-such-agent")
    missing = await api.http.get("/console/chat/nobody")
    assert missing.status_code == 404 and missing.headers["Content-Type"].startswith("text/html")
    assert not [entry for entry in page.console_log() if "SEVERE" in entry and "401" not in entry]


async def test_a_fresh_page_keeps_nothing_of_the_last_tests_pages(page: Page) -> None:
    """The module's tests share one chromium: what one page stored (a key in sessionStorage,
    localStorage, a cookie), its tabs and its log are gone for the next test."""

    async def blank(_: web.Request) -> web.Response:
        return web.Response(text="<p>blank</p>", content_type="text/html")

    app = web.Application()
    app.router.add_get("/", blank)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/"
    left = "[sessionStorage['k'], localStorage['k'], document.cookie]"
    try:
        await _page(page.open, url)
        page.driver.execute_script(
            "sessionStorage.setItem('k', 'last'); localStorage.setItem('k', 'last');"
            "document.cookie = 'k=last; max-age=600'; console.error('from the last test');"
            "window.open('about:blank')"
        )
        assert page.driver.execute_script(f"return {left}") == ["last", "last", "k=last"]
        assert len(page.driver.window_handles) == 2
        await _page(page.fresh)
        await _page(page.open, url)
        assert page.driver.execute_script(f"return {left}") == [None, None, ""]
        assert len(page.driver.window_handles) == 1
        assert not [m for m in page.console_log() if "from the last test" in m]
    finally:
        await runner.cleanup()


async def test_the_list_shows_each_sessions_budget_buckets(
    tmp_path: Path, redis_url: str, page: Page
) -> None:
    """`[[budgets]]`: a session's row shows what its buckets have used of their limits."""
    policies = textwrap.dedent(
        """
        [[budgets]]
        name = "oncall-hourly"
        group_by = ["agent"]
        dimension = "total_tokens"
        limit = 1000000
        window = "1h"
        """
    )
    async with FakeVendor() as vendor:
        vendor.responder = _model
        config = tmp_path / "subs.toml"
        config.write_text(_toml(vendor.url) + policies)
        keys = f"{FULL_KEY},{READ_KEY}:read"
        proc = await EngineProcess(config, redis_url, {"SUBS_API_KEYS": keys}).start()
        api = Api(proc.api)
        try:
            await api.say("is checkout up?", "ses-first")
            await api.settled("ses-first", "idle")

            async def charged() -> bool:
                listed = (await api.http.get("/api/admin/budgets")).json()["budgets"]
                return bool(listed) and listed[0]["used"] != "0"

            await poll_until(charged, WAIT, "the bucket charged")
            [bucket] = (await api.http.get("/api/admin/budgets")).json()["budgets"]
            await _page(page.open, f"{proc.api}/console")
            await _page(page.until, "the key prompt", lambda: page.find("#key-form").is_displayed())
            await _page(lambda: page.find("#key").send_keys(FULL_KEY + "\n"))
            cell = "#sessions tr[data-session='ses-first'] .budget"
            shown = await _page(page.until, "the bucket", lambda: page.find(cell))
            used = f"{int(bucket['used']):,}"
            assert shown.text == f"oncall-hourly: {used} of 1,000,000 tokens"
            assert "spent" not in shown.get_attribute("class")
            assert shown.get_attribute("title") == "agent=oncall"
            await _page(page.shot, "console-list-budgets")
        finally:
            await api.aclose()
            await proc.stop()
    errors = [m for m in page.console_log() if "SEVERE" in m or "could not show" in m]
    assert not errors, errors


@pytest.mark.parametrize("served", [BUDGET], indirect=True)
async def test_the_session_page_shows_each_turns_spend_against_its_budget(
    served: tuple[EngineProcess, Proxy], page: Page, api: Api, redis_url: str
) -> None:
    """Issue #28: per turn and for the session, what was spent (cost, model calls, tool
    calls, tokens, cache hits) beside the agent's limits; the limit a turn ran into is
    marked; an approved budget prompt's raise shows on its turn; the list shows the cost."""
    _, proxy = served
    sid = "ses-spend"
    await api.say("is checkout up?", sid)  # one model call: the turn's whole allowance
    await api.settled(sid, "idle")
    await api.say("wait for my confirm", sid)  # asks the client tool `confirm` ...
    view = await api.settled(sid, "running")
    [call_id] = [c["id"] for m in view["messages"] for c in m.get("tool_calls") or ()]
    body = {"session_id": sid, "input": {"type": "tool.result", "id": call_id, "result": "yes"}}
    answer = await api.http.post("/api/client/sessions/input", json=body)
    assert answer.status_code == 202, answer.text
    await api.settled(sid, "idle")  # ... and the model call after the answer is refused
    events = (await api.http.get(f"/api/admin/sessions/{sid}/events")).json()["events"]
    ends = [
        e["payload"] for e in events if e["payload"]["type"] in ("turn.completed", "turn.failed")
    ]
    assert [e["type"] for e in ends] == ["turn.completed", "turn.failed"]
    assert ends[1]["error"]["code"] == "budget_exceeded"
    assert ends[1]["error"]["detail"]["limit"] == "max_model_calls"
    first, second = ends

    # The golden log of an approved budget prompt, stored as an older engine left it.
    golden = ROOT / "tests" / "golden" / "budget_ask.jsonl"
    asked = [json.loads(line) for line in golden.read_text().splitlines()]
    redis = connect(redis_url)
    try:
        await store_log(await Store.open(redis), asked)
    finally:
        await redis.aclose()

    await _page(page.open, f"{proxy.url}/console/sessions/{sid}")
    await _page(page.until, "the key prompt", lambda: page.find("#key-form").is_displayed())
    await _page(lambda: page.find("#key").send_keys(READ_KEY + "\n"))
    rows = "#spend-rows tr"
    await _page(page.until, "both turns' spend", lambda: len(page.all(rows)) == 3)

    def cells(row: WebElement) -> list[str]:
        return [c.text for c in row.find_elements(By.CSS_SELECTOR, "td")]

    one, two, whole = page.all(rows)
    assert cells(one)[1:] == [
        f"{_money(first['cost'])} of $0.5000",
        "1 of 1",
        "0",
        f"{first['usage']['total']:,} of 100,000",
        _share(first["usage"]),
    ]
    assert cells(two)[1:] == [
        f"{_money(second['cost'])} of $0.5000",
        "1 of 1",
        "1",
        f"{second['usage']['total']:,} of 100,000",
        _share(second["usage"]),
    ]
    # The limit the second turn ran into is marked; the first only used it up.
    marked = two.find_elements(By.CSS_SELECTOR, "td.over")
    assert [c.text for c in marked] == ["1 of 1"]
    assert one.find_elements(By.CSS_SELECTOR, "td.over") == []
    assert "failed" in two.get_attribute("class")
    total = _money(Decimal(first["cost"]) + Decimal(second["cost"]))
    both = {k: first["usage"][k] + second["usage"][k] for k in ("total", "input", "cache_read")}
    assert cells(whole) == [
        "session",
        f"{total} of $1.0000",
        "2",
        "1",
        f"{both['total']:,}",
        _share(both),
    ]
    await _page(page.shot, "console-spend")

    # The list shows the session's cost.
    await _page(page.open, f"{proxy.url}/console")
    listed = f"#sessions tr[data-session='{sid}']"
    await _page(page.until, "the session in the list", lambda: page.find(listed))
    assert page.find(listed).find_elements(By.CSS_SELECTOR, "td")[-1].text == total

    # An approved budget prompt raised that turn's limit by its own size: 2 of 2 calls.
    golden_sid = asked[0]["session_id"]
    await _page(page.open, f"{proxy.url}/console/sessions/{golden_sid}")
    await _page(page.until, "the golden turn's spend", lambda: len(page.all(rows)) == 2)
    turn = cells(page.all(rows)[0])
    assert turn[2] == "2 of 2" and turn[1].endswith(" of $1.0000"), turn
    assert not [m for m in page.console_log() if "SEVERE" in m and "401" not in m]


def _share(usage: dict[str, Any]) -> str:
    """The share of input read from the prompt cache, as the console's `cacheShare` says it."""
    return f"{round(100 * usage['cache_read'] / usage['input'])}%"


def _money(cost: Any) -> str:
    """USD as the console's `money` shows it: 6 places under a cent, else 4."""
    n = Decimal(str(cost))
    if n == 0:
        return "$0"
    return f"${n:.6f}" if n < Decimal("0.01") else f"${n:.4f}"
