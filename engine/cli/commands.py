"""From parsed arguments (engine/cli/parser.py) to the command that runs them.

Every failure a person can fix ends here as one line naming the problem and what to
do next, with a non-zero exit: 2 for a mistake on the command line, 1 for the rest.
Each command's module is imported only when it runs: a light command loads no other.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from engine.cli.common import REDACTOR
from engine.cli.logs import start_logging
from engine.errors import SubsError
from engine.redact import env_secrets

Command = Callable[[argparse.Namespace], Coroutine[Any, Any, int]]


def _command(name: str) -> Command:
    """The coroutine function of an asyncio command, its module imported only now."""
    if name == "serve":
        from engine.cli.serve import serve

        return serve
    if name == "sessions":
        from engine.cli.sessions import sessions

        return sessions
    from engine.cli.run import chat, run

    return chat if name == "chat" else run


def _redis_errors() -> tuple[type[Exception], ...]:
    """Redis's error class once the store is loaded; none before, when nothing can raise it."""
    store = sys.modules.get("engine.store.store")
    return () if store is None else (store.RedisError,)


def run_command(args: argparse.Namespace) -> int:
    """Run the parsed command; every failure a person can act on is one line on stderr."""
    REDACTOR.add(env_secrets(os.environ))
    try:
        start_logging()
        if args.command == "check":
            from engine.cli.check import check

            return check(args)
        if args.command == "manifest":
            from engine.cli.manifest import manifest

            return manifest(args)
        loop = None
        if args.command == "serve":
            from engine.runtime.engine import new_event_loop

            loop = new_event_loop
        with asyncio.Runner(loop_factory=loop) as runner:
            return runner.run(_command(args.command)(args))
    except SubsError as err:  # ConfigError and Usage exit 2, the rest 1
        print(f"subs: {REDACTOR.scrub(str(err))}", file=sys.stderr)
        return err.exit_status
    except _redis_errors() as err:
        print(
            f"subs: Redis failed: {REDACTOR.scrub(str(err)) or type(err).__name__}; "
            "check that it runs, then try again",
            file=sys.stderr,
        )
        return 1
    except KeyboardInterrupt:
        return 130
