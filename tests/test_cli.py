"""`subs run` as a user runs it: a real process, the embedded Redis, the fake vendor."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import socket
import sys

import httpx

from engine.cli.logs import OneLine
from engine.redact import Redactor
from engine.store.embedded import EmbeddedRedis
from engine.store.store import Store, connect
from tests.api_helpers import INPUT, of_type, read_stream
from tests.engine_helpers import project_toml, session_of, start_subs, subs
from tests.fakes.llm_vendor import HttpError, Text, ToolCalls


async def test_run_streams_the_reply_and_continues_the_session(config, vendor):
    vendor.push(Text("Nothing is paging right now.", chunks=4), Text("Still quiet."))
    code, out, err = await subs(
        "run", "-o", "pretty", "ops_openai", "what's paging?", "-c", str(config)
    )
    assert code == 0, err
    assert out.strip() == "Nothing is paging right now."
    sid = session_of(err)
    assert f'subs run ops_openai "..." --session {sid}' in err
    # No console link: this engine runs in the process, and no serve is known to answer.
    assert "console:" not in err, err
    assert (config.parent / ".subs" / "appendonly.aof").exists() or list(
        (config.parent / ".subs").glob("appendonly*")
    )

    code, out, err = await subs(
        "run", "-o", "pretty", "ops_openai", "and now?", "--session", sid, "-c", str(config)
    )
    assert code == 0, err
    assert out.strip() == "Still quiet."
    # The second call carried the whole conversation, from the persisted session.
    sent = [m["content"] for m in vendor.requests[1].body["messages"]]
    assert sent == ["You are terse.", "what's paging?", "Nothing is paging right now.", "and now?"]


async def test_piped_output_is_json_lines_of_every_event_and_delta(config, vendor):
    vendor.push(Text("one two three", chunks=3))
    # Piped, the default output is JSON lines.
    code, out, err = await subs("run", "ops_anthropic", "hi", "-c", str(config))
    assert code == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    events = [x for x in lines if "payload" in x]
    deltas = [x for x in lines if x.get("type") == "llm.token.delta"]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert events[0]["payload"]["type"] == "session.created"
    assert events[-1]["payload"]["type"] == "turn.completed"
    assert "".join(d.get("text") or "" for d in deltas) == "one two three"


async def test_a_client_tool_is_answered_at_the_keyboard(config, vendor):
    vendor.push(ToolCalls([("confirm", {"question": "Restart the db?"})]), Text("Restarted."))
    code, out, err = await subs(
        "run", "-o", "pretty", "ops_openai", "fix it", "-c", str(config), stdin=b"yes, go ahead\n"
    )
    assert code == 0, err
    assert "confirm: Restart the db?" in err
    assert "→ confirm(" in out and out.rstrip().endswith("Restarted.")
    tool_msg = vendor.requests[1].body["messages"][-1]
    assert tool_msg["role"] == "tool" and tool_msg["content"] == "yes, go ahead"


async def test_a_failed_turn_exits_non_zero_with_the_error(config, vendor):
    vendor.push(HttpError(401))
    code, _, err = await subs("run", "-o", "pretty", "ops_openai", "hi", "-c", str(config))
    assert code == 1
    assert "the turn failed:" in err and "Traceback" not in err


async def test_bad_config_and_unknown_agent_are_clear_errors(tmp_path, config):
    bad = tmp_path / "bad.toml"
    bad.write_text('[agent.x]\nllm = "nope"\nmodel = "m"\n')
    code, _, err = await subs("run", "-o", "pretty", "x", "hi", "-c", str(bad))
    assert code == 2 and "agent.x.llm" in err and str(bad) in err
    code, _, err = await subs("run", "-o", "pretty", "ghost", "hi", "-c", str(config))
    assert code == 2 and "ops_openai" in err


async def test_an_engine_url_nothing_answers_is_a_clear_error():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    for args in (("sessions", "list"), ("run", "-o", "pretty", "ops_openai", "hi")):
        code, _, err = await subs(*args, "--url", url)
        assert code == 1, err
        assert err.startswith(f"subs: cannot reach {url}: ConnectError: "), err
        assert "Traceback" not in err


async def test_killed_mid_turn_then_run_again_the_session_is_still_there(config, vendor):
    slow = " ".join(f"w{i}" for i in range(80))
    vendor.push(Text(slow, chunk_delay=0.05), Text("Recovered answer."), Text("Second answer."))
    env = {"SUBS_LEASE_MS": "1000"}
    proc = await start_subs(
        "run", "-o", "pretty", "ops_openai", "long one", "-c", str(config), env=env
    )
    assert proc.stderr is not None and proc.stdout is not None
    sid = session_of((await asyncio.wait_for(proc.stderr.readline(), 20)).decode())
    await asyncio.wait_for(proc.stdout.read(20), 20)  # the answer is streaming
    proc.send_signal(signal.SIGKILL)
    await proc.wait()

    code, out, err = await subs(
        "run",
        "-o",
        "pretty",
        "ops_openai",
        "are you back?",
        "--session",
        sid,
        "-c",
        str(config),
        env=env,
    )
    assert code == 0, err
    assert out.strip() == "Second answer."
    # The interrupted turn was finished first, with its model call sent again.
    contents = [m["content"] for m in vendor.requests[-1].body["messages"]]
    assert contents[1:] == ["long one", "Recovered answer.", "are you back?"]
    assert len(vendor.requests) == 3


async def test_check_lists_missing_variables_and_fails(config):
    code, out, _ = await subs("check", "-c", str(config), env={"OPENAI_API_KEY": ""})
    assert code == 1
    rows = [json.loads(line) for line in out.splitlines()]
    assert {"missing": "OPENAI_API_KEY", "needed_by": "llm.openai"}.items() <= rows[0].items()
    code, out, _ = await subs("check", "-c", str(config))
    assert code == 0 and out == ""


async def test_sessions_list_and_events(config, vendor):
    vendor.push(Text("listed"))
    code, _, err = await subs("run", "-o", "pretty", "ops_openai", "hi", "-c", str(config))
    assert code == 0, err
    sid = session_of(err)
    code, out, _ = await subs("sessions", "list", "-c", str(config))
    (row,) = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and row["session_id"] == sid and row["agent_id"] == "ops_openai"
    assert row["status"] == "idle" and row["turns"] == 1 and row["first_message"] == "hi"
    assert row["last_activity_at"].endswith("Z")
    code, out, _ = await subs("sessions", "events", sid, "--from", "2", "-c", str(config))
    events = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and events[0]["seq"] == 3 and events[-1]["payload"]["type"] == "turn.completed"
    code, _, err = await subs("sessions", "events", "nope", "-c", str(config))
    assert code == 1 and "no session" in err


async def test_chat_keeps_one_session_and_joins_continued_lines(config, vendor):
    vendor.push(Text("First answer."), Text("Second answer."))
    stdin = b"hello\\\nthere\nand again\n"
    code, out, err = await subs("chat", "ops_openai", "-c", str(config), stdin=stdin)
    assert code == 0, err
    assert "First answer." in out and "Second answer." in out
    sent = [m["content"] for m in vendor.requests[1].body["messages"]]
    assert sent == ["You are terse.", "hello\nthere", "First answer.", "and again"]
    assert session_of(err)


async def test_sessions_dead_names_an_input_the_engine_could_not_apply(config, vendor):
    vendor.push(Text("first"), Text("second"))
    code, _, err = await subs("run", "-o", "pretty", "ops_openai", "hi", "-c", str(config))
    assert code == 0, err
    sid = session_of(err)
    with EmbeddedRedis(config.parent / ".subs") as server:
        redis = connect(server.url)
        await (await Store.open(redis)).enqueue(sid, {"kind": "from-the-future"}, None)
        await redis.aclose()
    code, _, err = await subs(
        "run", "-o", "pretty", "ops_openai", "again", "--session", sid, "-c", str(config)
    )
    assert code == 0, err
    code, out, _ = await subs("sessions", "dead", "-c", str(config))
    assert code == 0
    (line,) = out.splitlines()
    assert sid in line and "from-the-future (1x)" in line and "unknown input kind" in line
    code, out, _ = await subs("sessions", "events", sid, "-o", "jsonl", "-c", str(config))
    events = [json.loads(line) for line in out.splitlines()]
    rejected = [e for e in events if e["payload"]["type"] == "input.rejected"]
    assert rejected and rejected[0]["payload"]["input_kind"] == "from-the-future"


async def test_sessions_cancel_and_delete_in_process_and_over_http(
    config, vendor, redis_url, serve_processes
):
    serve = await serve_processes()
    vendor.push(ToolCalls([("confirm", {"question": "sure?"})]))
    message = {"role": "user", "content": "start"}
    body = {"input": {"type": "client.message", "agent_id": "ops_openai", "message": message}}
    async with httpx.AsyncClient(base_url=serve.api, timeout=10) as http:
        reply = (await http.post(INPUT, json=body)).json()
        sid = reply["session_id"]
        await read_stream(http, sid, key=None, stop=of_type("tool.call.dispatched"))
    local = ("-c", str(config), "--redis", redis_url)

    code, _, err = await subs("sessions", "delete", sid, *local)
    assert code == 1 and f"subs sessions cancel {sid}" in err, err
    code, _, err = await subs("sessions", "cancel", sid, "--reason", "typo", *local)
    assert code == 0 and f"cancelled turn {reply['turn_id']}" in err, err
    code, _, err = await subs("sessions", "cancel", sid, "--url", serve.api)
    assert code == 1 and "no running turn" in err and "Traceback" not in err, err
    code, _, err = await subs("sessions", "delete", sid, "--url", serve.api)
    assert code == 0 and f"deleted session {sid}" in err, err
    code, out, _ = await subs("sessions", "list", *local)
    assert code == 0 and sid not in out
    code, _, err = await subs("sessions", "delete", sid, *local)
    assert code == 1 and "does not exist" in err, err


async def test_a_run_prints_its_console_link_at_the_public_url_only(config, vendor):
    """Without --url the engine runs in the process: the link is the one `[serve]
    public_url` names, or none (the first test of this file checks the none)."""
    config.write_text(config.read_text() + '\n[serve]\npublic_url = "https://subs.example.com"\n')
    vendor.push(Text("Quiet."))
    code, _, err = await subs("run", "-o", "pretty", "ops_openai", "hi", "-c", str(config))
    assert code == 0, err
    assert f"console: https://subs.example.com/console/sessions/{session_of(err)}\n" in err


def broken_mcp_toml(vendor_url: str) -> str:
    """An agent whose one MCP server exits at start: its one try logs a warning."""
    server = json.dumps([sys.executable, "-c", "import sys; sys.exit(3)"])
    return (
        f'name = "t"\n[llm.openai]\ntype = "openai"\nbase_url = "{vendor_url}/v1"\n'
        f"[mcp.broken]\ncommand = {server}\n"
        '[agent.oncall]\nllm = "openai"\nmodel = "m"\nmcp = ["mcp.broken"]\n'
        "retry = { connector = { max_attempts = 1 } }\n"
    )


async def test_a_logged_warning_is_a_subs_line_unless_subs_log_asks_for_records(tmp_path, vendor):
    config = tmp_path / "subs.toml"
    config.write_text(broken_mcp_toml(vendor.url))
    vendor.push(Text("Without the tools, then."), Text("Again without."))
    code, out, err = await subs("run", "-o", "pretty", "oncall", "hi", "-c", str(config))
    assert code == 0, err
    assert out.strip().endswith("Without the tools, then."), out
    assert "subs: mcp.broken: its server exited with code 3" in err, err
    assert "WARNING:" not in out + err and "Traceback" not in err, err

    code, _, err = await subs(
        "run", "-o", "pretty", "oncall", "hi", "-c", str(config), env={"SUBS_LOG": "INFO"}
    )
    assert code == 0, err
    assert "WARNING:subs.mcp:mcp.broken: its server exited with code 3" in err, err


def test_a_logged_exception_is_one_scrubbed_line():
    """What a traceback-carrying record (a library's `log.exception`) prints by default."""
    redactor = Redactor(["s3cr3t-token"])
    try:
        raise ValueError("refused s3cr3t-token\nat the door")
    except ValueError:
        record = logging.LogRecord(
            "x", logging.ERROR, __file__, 1, "sync of %s\nfailed", ("s3cr3t-token",), sys.exc_info()
        )
    assert redactor.filter(record)
    assert OneLine(redactor.scrub).format(record) == (
        "subs: sync of *** failed (ValueError: refused *** at the door); "
        "SUBS_LOG=INFO prints the traceback"
    )
    record.levelno = logging.WARNING  # a fault, not a bug: no pointer to a traceback
    assert OneLine(redactor.scrub).format(record) == (
        "subs: sync of *** failed (ValueError: refused *** at the door)"
    )


async def test_check_refuses_a_watch_match_that_is_no_regular_expression(tmp_path, vendor):
    config = tmp_path / "subs.toml"
    config.write_text(
        project_toml(vendor.url)
        + '\n[agent.ops_openai.slack]\n[[agent.ops_openai.slack.watch]]\nchannel = "C0ALERTS"\n'
        'match = "[FIRING"\n'
    )
    code, out, err = await subs("check", "-c", str(config))
    assert (code, out) == (2, ""), err
    assert "agent.ops_openai.slack.watch.0.match: not a valid regular expression" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
