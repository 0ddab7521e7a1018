"""docs/slack.md against the code it describes: the variables, `subs check`'s line and the
manifest's scopes it shows are the ones the code uses."""

from __future__ import annotations

import re

from bot.rendering.message_text import attributed
from bot.slack.manifest import manifest
from bot.turns.watch import Watch
from engine.config import load_project, parse_project
from tests.engine_helpers import ROOT
from tests.fakes.slack import alerts

DOC = (ROOT / "docs" / "slack.md").read_text()


def test_the_variables_and_the_check_line_are_the_ones_subs_uses() -> None:
    project = load_project(ROOT / "subs.toml", env={})
    assert project.missing_env({"OPENROUTER_API_KEY": "set"}) == []  # Slack's: not needed
    (off,) = project.slack_off({"SLACK_BOT_TOKEN_ONCALL": "xoxb-1"})
    names = re.findall(r"SLACK_[A-Z_]+ONCALL", off.why)
    assert set(names) == {
        "SLACK_BOT_TOKEN_ONCALL",
        "SLACK_APP_TOKEN_ONCALL",
        "SLACK_SIGNING_SECRET_ONCALL",
    }
    for var in names:
        assert f"| `{var}` |" in DOC, f"docs/slack.md has no row for {var}"
    assert f"\n{off.why}\n" in DOC  # the check line the page shows


def test_the_scopes_named_are_the_manifests() -> None:
    [toml] = re.findall(r"^```toml\n(\[agent\.oncall\.slack\].*?)^```", DOC, re.M | re.S)
    text = '[llm.x]\ntype = "openai"\n[agent.oncall]\nllm = "x"\nmodel = "m"\n' + toml
    agent = parse_project(text, "subs.toml", env={}).agents["oncall"]
    made = manifest(agent, socket_mode=True, request_url=None)
    [paragraph] = [p for p in DOC.split("\n\n") if p.startswith("The manifest asks for")]
    named = set(re.findall(r"`([a-z_.]+(?::[a-z_]+)?)`", paragraph))
    assert named == {
        *made["oauth_config"]["scopes"]["bot"],
        *made["settings"]["event_subscriptions"]["bot_events"],
    }


def test_the_alert_shown_is_the_one_the_renderer_gives() -> None:
    [section] = re.findall(r"^## What the model sees\n(.*?)^## ", DOC, re.M | re.S)
    shown = re.findall(r"^```text\n(.*?)\n```", section, re.M | re.S)
    alert = {**alerts.ALERTMANAGER_FIRING, "subtype": "bot_message", "bot_id": "B1"}
    assert shown[0] == attributed(alert, {})


def test_the_on_call_example_watches_the_alert_it_shows() -> None:
    """The watch entry loads, and takes the alert the page shows as the model sees it."""
    [section] = re.findall(r"^## On call: .*?\n(.*?)^## ", DOC, re.M | re.S)
    [toml] = re.findall(r"^ *```toml\n(.*?)^ *```", section, re.M | re.S)
    text = '[llm.x]\ntype = "openai"\n[agent.oncall]\nllm = "x"\nmodel = "m"\n'
    text += "[agent.oncall.slack]\n" + "\n".join(line.strip() for line in toml.splitlines())
    slack = parse_project(text, "subs.toml", env={}).agents["oncall"].slack
    assert slack is not None
    [entry] = slack.watch
    assert entry.channel_var == "ONCALL_ALERTS_CHANNEL"
    alert = {**alerts.ALERTMANAGER_TEMPLATED, "subtype": "bot_message", "bot_id": "B1"}
    alert["channel"] = "C0123ABCD"
    watch = Watch.of("C0123ABCD", entry.posters, entry.match)
    assert watch.admits(alert)
    assert not watch.admits({**alert, **alerts.ALERTMANAGER_RESOLVED})
    [shown] = re.findall(r"^```text\n(.*?)\n```", section, re.M | re.S)
    assert shown == attributed(alert, {})
    made = manifest(
        parse_project(text, "subs.toml", env={}).agents["oncall"],
        socket_mode=True,
        request_url=None,
    )
    assert {"message.channels", "message.groups"} <= set(
        made["settings"]["event_subscriptions"]["bot_events"]
    )


def test_the_example_s_commented_watch_entry_loads_once_uncommented() -> None:
    text = (ROOT / "subs.toml").read_text()
    entry = re.compile(r"^# (\[\[agent\.oncall\.slack\.watch\]\]|(?:channel|from|match) = .*)$")
    lines = [m.group(1) if (m := entry.match(line)) else line for line in text.splitlines()]
    assert lines != text.splitlines()
    project = parse_project("\n".join(lines), "subs.toml", env={})
    slack = project.agents["oncall"].slack
    assert slack is not None
    [watch] = slack.watch
    assert watch.channel_var == "ONCALL_ALERTS_CHANNEL" and watch.match == "FIRING"
    missing = project.missing_env({"OPENROUTER_API_KEY": "set", "ONCALL_REPO": "."})
    assert [m.var for m in missing] == ["ONCALL_ALERTS_CHANNEL"]
