"""The `subs` command: argument parsing (light), the commands, the terminal view, and
the client of a remote engine's HTTP API."""

from engine.cli.parser import main

__all__ = ["main"]
