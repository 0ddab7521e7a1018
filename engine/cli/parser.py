"""The `subs` command (SPEC §15): arguments and help only.

Parsing imports nothing heavy, so `subs --help` and a mistyped flag answer at once;
the commands (engine, Redis, Slack) are imported once the arguments are good.
"""

from __future__ import annotations

import argparse
import gc
import sys
from typing import NoReturn

_LOCAL = "Redis URL (default: the file's, else an embedded server under .subs/)"
_REMOTE_HELP = "a remote engine's base URL, e.g. http://127.0.0.1:8080 (key from SUBS_API_KEY)"


class _Parser(argparse.ArgumentParser):
    """Usage mistakes as one line that names the fix, like every other error of `subs`."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see '{self.prog} --help')\n")


def _command(
    sub: argparse._SubParsersAction[_Parser], name: str, summary: str, about: str, examples: str
) -> _Parser:
    """A subcommand whose --help says what it does and shows it in use."""
    return sub.add_parser(
        name,
        help=summary,
        description=f"{summary[0].upper()}{summary[1:]}. {about}".strip(),
        epilog="examples:\n" + "\n".join(f"  {line}" for line in examples.strip().splitlines()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def _whole(text: str, least: int, most: int | None = None) -> int:
    """A whole number from `least` (to `most`): a bad value is argparse's one-line usage error."""
    try:
        number: int | None = int(text)
    except ValueError:
        number = None
    if number is None or number < least or (most is not None and number > most):
        bound = f"from {least} to {most}" if most is not None else f"of at least {least}"
        raise argparse.ArgumentTypeError(f"expected a whole number {bound}, got {text!r}")
    return number


def _port(text: str) -> int:
    return _whole(text, 0, 65535)


def _count(text: str) -> int:
    return _whole(text, 1)


def _seq(text: str) -> int:
    return _whole(text, 0)


def _project(command: argparse.ArgumentParser, *, redis: bool = True) -> None:
    command.add_argument("-c", "--config", default="subs.toml", help="the project file")
    if redis:
        command.add_argument("--redis", help=_LOCAL)


def _output(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "-o",
        "--output",
        choices=["pretty", "jsonl"],
        help="default: pretty on a terminal, else JSON lines",
    )


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("subs")
    except PackageNotFoundError:
        return "unknown (not installed)"


def parser() -> argparse.ArgumentParser:
    """Every command and flag of `subs`; imports nothing heavy, so `--help` is instant."""
    top = _Parser(
        prog="subs",
        description="A durable agent engine: run agents from subs.toml, in Slack and over HTTP.",
        epilog='examples:\n  subs check\n  subs run oncall "what\'s paging?"\n  subs serve\n'
        "\nEach command has its own --help.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    top.add_argument("--version", action="version", version=f"subs {_version()}")
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = _command(
        sub,
        "run",
        "run one turn and stream the reply",
        "Sends a message (or a ClientInput) to an agent and prints the reply as it "
        "streams; client tools are answered at the keyboard. Exits 1 when the turn fails. "
        "Ctrl-C leaves at once (the turn is kept) and prints the command that picks the "
        "session up. With --session, a question the session's turn waits on (a client tool, "
        "an interrupt) is asked again first; a message given too is sent once that turn "
        "ends, as the next turn; with no message, the running turn is followed to its end. "
        "With --url, an engine that stops answering is said and retried until it is back.",
        """
subs run oncall "what's paging?"
subs run oncall "and now?" --session ses_0123
subs run oncall --session ses_0123    # asks what its turn waits on, then follows it
subs run oncall --input '{"type": "client.message", "message": {"role": "user", "content": "hi"}}'
SUBS_API_KEY=... subs run oncall "hi" --url http://127.0.0.1:8080""",
    )
    run.add_argument("agent", help="an agent declared in the project file")
    run.add_argument("message", nargs="?", help="what to say (or use --input)")
    run.add_argument(
        "--session",
        help="continue this session, first asking what its turn waits on (default: a new one)",
    )
    run.add_argument("--input", help="a ClientInput as JSON instead of a message")
    _output(run)
    _project(run)
    run.add_argument("--url", help=_REMOTE_HELP)

    chat = _command(
        sub,
        "chat",
        "talk to an agent interactively",
        "One session, one line per message (end a line with \\ to continue it). "
        "Ctrl-C while a reply streams stops watching it (the turn goes on); at a question "
        "or at you> it leaves, printing the command that picks the session up. Ctrl-D "
        "leaves. With --session, a question the session's turn waits on is asked again "
        "first. With --url, an engine that stops answering is said and retried.",
        """
subs chat oncall
subs chat oncall --session ses_0123""",
    )
    chat.add_argument("agent", help="an agent declared in the project file")
    chat.add_argument("--session", help="continue this session (default: start a new one)")
    _project(chat)
    chat.add_argument("--url", help=_REMOTE_HELP)

    check = _command(
        sub,
        "check",
        "validate subs.toml and list missing env vars",
        "Exits 1 when the file is wrong or a variable it needs is unset. When the Redis "
        "URL names a node of a Redis Cluster, also says its shape (masters, replicas, "
        "slots served).",
        """
subs check
subs check -c deploy/subs.toml
subs check --redis redis://10.0.0.5:7000""",
    )
    _project(check)

    sessions = _command(
        sub,
        "sessions",
        "list, read, cancel or delete sessions",
        "Reads the project's Redis, or a remote engine with --url.",
        """
subs sessions list
subs sessions events ses_0123 --follow
subs sessions cancel ses_0123 --reason "wrong question"
subs sessions delete ses_0123""",
    )
    sessions_sub = sessions.add_subparsers(dest="sessions_command", required=True, metavar="ACTION")
    listing = _command(
        sessions_sub,
        "list",
        "sessions, latest activity first",
        "One row each: id, agent, status, last activity, turns and the first words. "
        "Subagents' sessions are left out. When more follow, the command for the next "
        "page is said on stderr.",
        """
subs sessions list --limit 10
subs sessions list --limit 10 --cursor eyJ...
subs sessions list -o jsonl | jq .session_id""",
    )
    listing.add_argument("--limit", type=_count, default=50, help="at most this many (default 50)")
    listing.add_argument("--cursor", help="go on from here (the cursor a previous page gave)")
    _output(listing)
    dead = _command(
        sessions_sub,
        "dead",
        "inputs the engine could not apply, newest first",
        "Each failed its session's turn; the input is kept for a person to read.",
        "subs sessions dead --limit 10",
    )
    dead.add_argument("--limit", type=_count, default=100, help="at most this many (default 100)")
    events = _command(
        sessions_sub,
        "events",
        "print a session's events",
        "",
        """
subs sessions events ses_0123
subs sessions events ses_0123 --from 40 --follow -o jsonl""",
    )
    events.add_argument("session", help="the session id")
    events.add_argument("--from", dest="after", type=_seq, default=0, help="after this seq")
    events.add_argument("--follow", action="store_true", help="keep printing new events")
    _output(events)
    cancel = _command(
        sessions_sub,
        "cancel",
        "end a session's running turn",
        "The turn fails (error code handler_error, detail.cancelled); its calls are "
        "abandoned and the next queued message runs.",
        'subs sessions cancel ses_0123 --reason "asked the wrong thing"',
    )
    cancel.add_argument("session", help="the session id")
    cancel.add_argument("--reason", help="recorded in the turn's error")
    delete = _command(
        sessions_sub,
        "delete",
        "remove a session and its history",
        "Refused while a turn runs: cancel it first.",
        "subs sessions delete ses_0123",
    )
    delete.add_argument("session", help="the session id")
    export = _command(
        sessions_sub,
        "export",
        "write a session's log to an archive file",
        "The format retention's sweep archives in (docs/archive.md): gzip JSON lines.",
        """
subs sessions export ses_0123
subs sessions export ses_0123 -o postmortem.jsonl.gz""",
    )
    export.add_argument("session", help="the session id")
    export.add_argument(
        "-o", dest="file", help="where to write it (default: <session id>.jsonl.gz here)"
    )
    restore = _command(
        sessions_sub,
        "import",
        "put an archived session back into Redis",
        "The same id and log, its snapshot folded again; refused while a session with that "
        "id is in Redis. Reads the store directly (no --url).",
        "subs sessions import .subs/archive/2026-11-05/ses_0123.jsonl.gz",
    )
    restore.add_argument("file", help="an archive file (subs sessions export, or the sweep's)")
    _project(restore)
    for command in (listing, dead, events, cancel, delete, export):
        _project(command)
        command.add_argument("--url", help=_REMOTE_HELP)

    serve = _command(
        sub,
        "serve",
        "run the engine, the HTTP API and the Slack apps",
        "Runs until SIGTERM or Ctrl-C. Without a Redis URL it keeps its data in an "
        "embedded server under .subs/ beside the project file (one serve per folder).",
        """
subs serve
subs serve --port 0
SUBS_API_KEYS=... subs serve --host 0.0.0.0 --redis redis://db:6379""",
    )
    _project(serve)
    serve.add_argument("--host", help="address to bind (default: [serve] host)")
    serve.add_argument("--port", type=_port, help="port to bind, 0 for any (default: [serve] port)")

    man = _command(
        sub,
        "manifest",
        "print an agent's Slack app manifest",
        "Paste it at https://api.slack.com/apps (Create New App, From a manifest).",
        """
subs manifest oncall --socket-mode
subs manifest oncall --url https://bot.example.com""",
    )
    man.add_argument("agent", help="an agent with a [agent.<id>.slack] block")
    _project(man, redis=False)
    transport = man.add_mutually_exclusive_group()
    transport.add_argument(
        "--socket-mode",
        action="store_true",
        default=None,
        help="default when SLACK_APP_TOKEN_<AGENT> is set",
    )
    transport.add_argument(
        "--url", help="public base URL for request URLs (default: http://[serve] host:port)"
    )
    return top


def main(argv: list[str] | None = None) -> int:
    """`subs` itself: parse, then load the engine only for a command that needs it."""
    args = parser().parse_args(argv)
    from engine.cli.commands import run_command  # the engine, Redis and Slack: only now

    try:
        return run_command(args)
    finally:
        # The interpreter's last collections at exit walk every object the imports made
        # (the SDKs' models): 0.5-1 s after the work is done. Frozen, they are skipped.
        gc.freeze()


if __name__ == "__main__":
    sys.exit(main())
