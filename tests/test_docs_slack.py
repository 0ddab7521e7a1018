"""docs/slack.md against the code it describes: the variables, `subs check`'s line and the
manifest's scopes it shows are the ones the code uses."""

from __future__ import annotations

import re

from bot.rendering.message_text import attributed
from bot.slack.manifest import manifest
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
