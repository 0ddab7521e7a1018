"""`subs check`: the project file validated, and what it needs that this place lacks."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from typing import Any

from engine.cli.common import priced_project


def check(args: argparse.Namespace) -> int:
    """Exit 1 when the file is wrong, an environment variable it needs is missing, or a
    Slack app has some of its variables but not enough (none at all is an API-only set-up:
    a note, like an MCP connection that is off).

    With a Redis URL configured (--redis, SUBS_REDIS, `redis`) that names a node of a
    Redis Cluster, it also says the cluster's shape; a Redis it cannot reach is not an
    error here (check validates the file, and runs where Redis may not be reachable)."""
    project = priced_project(args)
    missing = project.missing_env(os.environ)
    off = project.connections_off(os.environ)
    slack = project.slack_off(os.environ)
    exposed = {b.path: why for b in project.mcp.values() if (why := b.secret_in_command())}
    shape = _cluster_shape(args.redis or project.redis)
    if sys.stdout.isatty():
        agents = ", ".join(
            f"{a.id} ({'worker' if a.worker else 'engine'})" for a in project.agents.values()
        )
        print(f"{project.path}: ok; agents: {agents or 'none'}")
        if shape is not None:
            print(
                f"redis: cluster {shape['state']}: {shape['masters']} masters, "
                f"{shape['replicas']} replicas, {shape['slots']} of 16384 slots served, "
                f"{shape['failing']} nodes failing"
            )
        for m in missing:
            print(f"missing {m.var}: needed by {m.needed_by} ({m.why})")
        for path, why in off.items():
            print(f"{path} is off: {why}; its agents run without its tools")
        for app in slack:
            print(app.why)
        for path, why in exposed.items():
            print(f"warning: {path}: {why}")
    else:
        if shape is not None:
            print(json.dumps({"redis_cluster": shape}))
        for m in missing:
            print(json.dumps({"missing": m.var, "needed_by": m.needed_by, "why": m.why}))
        for path, why in off.items():
            print(json.dumps({"off": path, "why": why}))
        for app in slack:
            print(json.dumps({"slack_off": app.agent, "why": app.why, "partial": app.partial}))
        for path, why in exposed.items():
            print(json.dumps({"warning": path, "why": why}))
    return 1 if missing or any(app.partial for app in slack) else 0


def _cluster_shape(url: str | None) -> dict[str, Any] | None:
    """The shape of the cluster `url` names; None when it names none (or no URL is set)."""
    from engine.store.store import RedisError, cluster_shape

    if url is None:
        return None
    try:
        shape = cluster_shape(url)
    except (RedisError, OSError):
        return None
    return None if shape is None else dataclasses.asdict(shape)
