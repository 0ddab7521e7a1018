"""What every `subs` command shares: the usage error, the redactor, the project as
loaded and the knobs the environment turns."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from engine.errors import SubsError
from engine.redact import Redactor, redact_url

if TYPE_CHECKING:
    from engine.config import Project


REDACTOR = Redactor()


class Usage(SubsError):
    """A command-line mistake: exit 2 with this message."""

    code = "usage"
    exit_status = 2


def project_from(args: argparse.Namespace) -> Project:
    """The project, its secrets (and those in `--redis`) known to the redactor from now on."""
    from engine.config import load_project, project_secrets

    redis = getattr(args, "redis", None)
    if redis is not None and urlsplit(redis).scheme not in ("redis", "rediss", "unix"):
        raise Usage(
            f"--redis must be a redis://, rediss:// or unix:// URL, got {redact_url(redis)!r} "
            "(e.g. --redis redis://127.0.0.1:6379/0)"
        )
    project = load_project(args.config)
    REDACTOR.add(project_secrets(project, os.environ, redis))
    return project


def priced_project(args: argparse.Namespace) -> Project:
    """The project to serve or check: an agent with a limit in USD needs its model's price
    (a cost it cannot count would never stop it), so one without is a ConfigError."""
    from engine.config import ConfigError
    from engine.effects.llm.prices import unpriced

    project = project_from(args)
    for key, why in unpriced(project):
        raise ConfigError(why, file=project.path, key=key)
    return project


def http_url(url: str) -> str:
    """`--url` as given, when it is one: a bare `host:port` would fail later, less clearly."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise Usage(
            f"--url must start with http:// or https://, got {url!r} "
            f"(e.g. --url http://{url if '://' not in url else '127.0.0.1:8080'})"
        )
    return url


def lease_ms() -> int:
    """Lease length; short in tests that kill engines on purpose."""
    raw = os.environ.get("SUBS_LEASE_MS", "10000")
    if not raw.isdigit() or int(raw) < 100:
        raise Usage(f"SUBS_LEASE_MS must be a whole number of milliseconds >= 100, got {raw!r}")
    return int(raw)


def wants_jsonl(output: str | None) -> bool:
    """JSON lines when asked, or by default when stdout is not a terminal."""
    return output == "jsonl" or (output is None and not sys.stdout.isatty())
