"""`subs manifest`: the Slack app manifest asks for exactly what the bot uses (SPEC §14)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bot.slack.manifest import events_path, manifest, to_yaml
from engine.cli.parser import main
from engine.config import AgentDecl, parse_project

ROOT = Path(__file__).resolve().parent.parent
URL = "https://subs.example.com/slack/bot/events"


def _agent(
    answers: str, commands: list[str], agent_id: str = "bot", *, files: bool = True
) -> AgentDecl:
    text = f"""
[agent.{agent_id}]
worker = "http://127.0.0.1:9/"
[agent.{agent_id}.slack]
name = "Bot"
description = "Helps."
answers = "{answers}"
commands = {json.dumps(commands)}
files = {json.dumps(files)}
"""
    return parse_project(text, "subs.toml", env={}).agents[agent_id]


BASE = ["chat:write", "reactions:write", "users:read", "files:read", "files:write"]
SCOPES = {
    "dm": [*BASE, "im:history"],
    "channels": [
        *BASE,
        "app_mentions:read",
        "channels:history",
        "groups:history",
    ],
    "both": [
        *BASE,
        "app_mentions:read",
        "channels:history",
        "groups:history",
        "im:history",
    ],
}
# Channel messages too: follow-ups (`follow`, on by default) arrive without a mention.
CHANNEL_MESSAGES = ["message.channels", "message.groups"]
EVENTS = {
    "dm": ["message.im"],
    "channels": ["app_mention", *CHANNEL_MESSAGES],
    "both": ["app_mention", "message.im", *CHANNEL_MESSAGES],
}


@pytest.mark.parametrize("answers", ["dm", "channels", "both"])
@pytest.mark.parametrize("socket_mode", [True, False])
@pytest.mark.parametrize("commands", [[], ["/bot", "/bot-reset"]])
def test_scopes_events_and_transport(answers: str, socket_mode: bool, commands: list[str]):
    m = manifest(
        _agent(answers, commands), socket_mode=socket_mode, request_url=None if socket_mode else URL
    )
    scopes = m["oauth_config"]["scopes"]["bot"]
    expected = SCOPES[answers] + (["commands"] if commands else [])
    if commands:  # a resumed command looks for its root message in the channel's history
        expected += [s for s in ("channels:history", "groups:history") if s not in expected]
    assert scopes == expected
    settings = m["settings"]
    assert settings["event_subscriptions"]["bot_events"] == EVENTS[answers]
    assert settings["socket_mode_enabled"] is socket_mode
    url = {} if socket_mode else {"request_url": URL}
    assert settings["interactivity"] == {"is_enabled": True, **url}
    assert settings["event_subscriptions"] == {**url, "bot_events": EVENTS[answers]}
    assert m["features"]["app_home"]["messages_tab_enabled"] is (answers != "channels")
    assert m["features"]["app_home"]["messages_tab_read_only_enabled"] is False
    if not commands:
        assert "slash_commands" not in m["features"]
        return
    assert m["features"]["slash_commands"] == [
        {
            "command": command,
            **({} if socket_mode else {"url": URL}),
            "description": "Helps.",
            "usage_hint": "[request]",
            "should_escape": False,
        }
        for command in commands
    ]


def test_files_false_asks_for_no_file_scopes():
    """`files = false`: the app neither downloads nor uploads, so no files:* scope."""
    m = manifest(_agent("both", [], files=False), socket_mode=True, request_url=None)
    scopes = m["oauth_config"]["scopes"]["bot"]
    assert not [s for s in scopes if s.startswith("files:")]
    assert scopes == [s for s in SCOPES["both"] if not s.startswith("files:")]


def _slack_block(answers: str, extra: str) -> AgentDecl:
    text = (
        f'[agent.bot]\nworker = "http://127.0.0.1:9/"\n[agent.bot.slack]\nanswers = "{answers}"\n'
        + extra
    )
    return parse_project(text, "subs.toml", env={}).agents["bot"]


WATCH = '[[agent.bot.slack.watch]]\nchannel = "C0ALERTS"\nfrom = ["Alertmanager"]\n'


@pytest.mark.parametrize(
    ("answers", "extra", "events", "history"),
    [
        ("channels", "follow = false\n", ["app_mention"], True),  # mentions only
        ("dm", "", ["message.im"], False),  # follow-ups are for channels
        ("dm", WATCH, ["message.im", *CHANNEL_MESSAGES], True),  # alerts need no mention
        ("channels", "follow = false\n" + WATCH, ["app_mention", *CHANNEL_MESSAGES], True),
    ],
    ids=["no-follow", "dm-only", "dm-and-watch", "watch-no-follow"],
)
def test_channel_messages_are_subscribed_when_follow_or_watch_needs_them(
    answers: str, extra: str, events: list[str], history: bool
):
    m = manifest(_slack_block(answers, extra), socket_mode=True, request_url=None)
    assert m["settings"]["event_subscriptions"]["bot_events"] == events
    scopes = m["oauth_config"]["scopes"]["bot"]
    assert ({"channels:history", "groups:history"} <= set(scopes)) is history
    assert len(scopes) == len(set(scopes))


def test_display_information_and_bot_user():
    m = manifest(_agent("both", []), socket_mode=True, request_url=None)
    assert m["display_information"] == {"name": "Bot", "description": "Helps."}
    assert m["features"]["bot_user"] == {"display_name": "Bot", "always_online": True}


def test_http_mode_needs_a_url():
    with pytest.raises(ValueError, match="request_url"):
        manifest(_agent("both", []), socket_mode=False, request_url=None)


def test_yaml_is_json_and_round_trips_awkward_strings():
    m = manifest(_agent("both", ["/bot"]), socket_mode=False, request_url=URL)
    odd = 'Café 🚀 "quoted" #no-comment: key\\ \u007f\u0085\u009f\ufffe\n: - [x]'
    m["display_information"]["description"] = odd
    text = to_yaml(m)
    assert text.endswith("}\n")
    assert json.loads(text) == m
    # YAML's printable set excludes these; they must travel as escapes, not raw.
    for raw in ("\u007f", "\u009f", "\ufffe"):
        assert raw not in text
    assert "\\u007f" in text and "🚀" in text and "\u0085" in text


def _subs(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["manifest", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_checked_in_manifest_is_what_the_command_prints(capsys):
    """manifest.yml can't drift from subs.toml and the generator."""
    text = (ROOT / "manifest.yml").read_text()
    url = json.loads(text)["settings"]["event_subscriptions"]["request_url"]
    base = url.removesuffix(events_path("oncall"))
    assert base != url
    code, out, err = _subs(capsys, "oncall", "-c", str(ROOT / "subs.toml"), "--url", base)
    assert (code, err) == (0, "")
    assert out == text


_TOML = """
[serve]
host = "10.0.0.5"
port = 9090

[agent.on-call]
worker = "http://127.0.0.1:9/"
[agent.on-call.slack]
answers = "dm"

[agent.plain]
worker = "http://127.0.0.1:9/"
"""


@pytest.fixture
def config(tmp_path, monkeypatch):
    for var in ("SLACK_APP_TOKEN_ON_CALL", "SUBS_PORT", "SUBS_REDIS"):
        monkeypatch.delenv(var, raising=False)
    path = tmp_path / "subs.toml"
    path.write_text(_TOML)
    return path


def test_default_transport_follows_the_app_token(capsys, config, monkeypatch):
    code, out, err = _subs(capsys, "on-call", "-c", str(config))
    assert code == 0
    settings = json.loads(out)["settings"]
    assert settings["socket_mode_enabled"] is False
    assert (
        settings["event_subscriptions"]["request_url"]
        == "http://10.0.0.5:9090/slack/on-call/events"
    )
    assert "https" in err  # Slack won't call a plain-http URL: say so

    monkeypatch.setenv("SLACK_APP_TOKEN_ON_CALL", "set")
    code, out, err = _subs(capsys, "on-call", "-c", str(config))
    assert (code, err) == (0, "")
    settings = json.loads(out)["settings"]
    assert settings["socket_mode_enabled"] is True
    assert "request_url" not in settings["event_subscriptions"]

    # An explicit choice beats the environment.
    code, out, _ = _subs(capsys, "on-call", "-c", str(config), "--url", "https://h.example/")
    assert code == 0
    settings = json.loads(out)["settings"]
    assert settings["interactivity"]["request_url"] == "https://h.example/slack/on-call/events"
    monkeypatch.delenv("SLACK_APP_TOKEN_ON_CALL")
    code, out, _ = _subs(capsys, "on-call", "-c", str(config), "--socket-mode")
    assert code == 0 and json.loads(out)["settings"]["socket_mode_enabled"] is True


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["ghost"], "no agent 'ghost'"),
        (["plain"], "has no [agent.plain.slack] block"),
        (["on-call", "--url", "ftp://h"], "--url must be an http(s) URL"),
    ],
)
def test_command_line_mistakes_exit_2(capsys, config, argv, message):
    code, out, err = _subs(capsys, *argv, "-c", str(config))
    assert code == 2 and out == ""
    assert message in err and "Traceback" not in err


def test_socket_mode_and_url_are_exclusive(capsys, config):
    with pytest.raises(SystemExit) as exit_:
        main(["manifest", "on-call", "-c", str(config), "--socket-mode", "--url", "https://h"])
    assert exit_.value.code == 2
    assert "not allowed with" in capsys.readouterr().err


def test_a_user_group_among_the_approvers_asks_for_usergroups_read() -> None:
    text = (
        '[llm.x]\ntype = "openai"\n[agent.bot]\nllm = "x"\nmodel = "m"\n'
        'approvers = ["U0DAVE"]\n[agent.bot.slack]\n'
    )
    people = parse_project(text, "subs.toml", env={}).agents["bot"]
    groups = parse_project(
        text.replace('["U0DAVE"]', '["U0DAVE", "S0LEADS"]'), "subs.toml", env={}
    ).agents["bot"]
    scopes = [
        manifest(a, socket_mode=True, request_url=None)["oauth_config"]["scopes"]["bot"]
        for a in (people, groups)
    ]
    assert "usergroups:read" not in scopes[0]
    assert "usergroups:read" in scopes[1]
