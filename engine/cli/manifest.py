"""`subs manifest`: the Slack app manifest for an agent's `[agent.<id>.slack]` block."""

from __future__ import annotations

import argparse
import os
import sys

from engine.cli.common import Usage, project_from


def manifest(args: argparse.Namespace) -> int:
    """Print the agent's Slack app manifest; the transport follows the environment by default."""
    from bot.slack.manifest import events_path, manifest, to_yaml
    from engine.config import slack_env_suffix

    project = project_from(args)
    agent = project.agents.get(args.agent)
    if agent is None:
        declared = ", ".join(sorted(project.agents)) or "none"
        raise Usage(f"no agent {args.agent!r} in {project.path}; declared: {declared}")
    if agent.slack is None:
        raise Usage(f"agent {agent.id!r} has no [agent.{agent.id}.slack] block in {project.path}")
    socket_mode = args.socket_mode
    if socket_mode is None:
        socket_mode = args.url is None and bool(
            os.environ.get(f"SLACK_APP_TOKEN_{slack_env_suffix(agent.id)}")
        )
    url = None
    if not socket_mode:
        base = args.url or f"http://{project.serve.host}:{project.serve.port}"
        scheme = base.partition("://")[0]
        if scheme not in ("http", "https") or not base.partition("://")[2]:
            raise Usage(f"--url must be an http(s) URL, got {base!r}")
        if scheme != "https":
            print(f"subs: {_not_https(base, given=args.url is not None)}", file=sys.stderr)
        url = base.rstrip("/") + events_path(agent.id)
    print(to_yaml(manifest(agent, socket_mode=socket_mode, request_url=url)), end="")
    return 0


def _not_https(base: str, *, given: bool) -> str:
    """The manifest's request URLs are not https: Slack will refuse them. Says so of
    the URL the person gave, or of the default they did not choose."""
    if given:
        return (
            f"Slack only calls public https URLs, and --url {base} is not one: "
            "give the https address that reaches this serve (a proxy or tunnel)"
        )
    return (
        f"the request URLs point at {base} ([serve] host and port), and Slack only calls "
        "public https URLs: pass --url https://<the address that reaches this serve>"
    )
