"""Redaction: URLs printed on purpose, and the logging filter that scrubs every record."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

from engine.config import parse_project, project_secrets
from engine.redact import Redactor, env_secrets, redact_url, url_secrets

URLS = [
    ("redis://:secret@h:6379/0", "redis://:***@h:6379/0"),
    ("redis://user:pw@host", "redis://user:***@host"),
    ("rediss://user:p@ss@host:1/2", "rediss://user:***@host:1/2"),
    ("http://user:pw@worker:8000/decide", "http://user:***@worker:8000/decide"),
    ("http://tok3n@worker/", "http://***@worker/"),
    ("http://w/d?token=abc&x=1", "http://w/d?token=***&x=1"),
    ("http://w/d?x=1&api_key=k&sig=s#f", "http://w/d?x=1&api_key=***&sig=***#f"),
    ("unix://:pw@/tmp/r.sock?db=0&password=p", "unix://:***@/tmp/r.sock?db=0&password=***"),
    # Nothing to hide: unchanged, to the byte.
    ("unix:///tmp/r.sock", "unix:///tmp/r.sock"),
    ("redis://h:6379/0", "redis://h:6379/0"),
    ("http://w/d?q=a%20b&page=2", "http://w/d?q=a%20b&page=2"),
]


@pytest.mark.parametrize(("url", "shown"), URLS)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


@pytest.fixture
def logged() -> Iterator[tuple[logging.Logger, io.StringIO, Redactor]]:
    """A logger whose one handler writes to a buffer through a Redactor."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    redactor = Redactor(["xoxb-slack-token", "sk-vendor-key"])
    handler.addFilter(redactor)
    logger = logging.getLogger("test_redact")
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    try:
        yield logger, out, redactor
    finally:
        logger.removeHandler(handler)


def test_the_filter_scrubs_messages_arguments_and_tracebacks(logged) -> None:
    logger, out, redactor = logged
    logger.info("token %s and key %r", "xoxb-slack-token", "sk-vendor-key")
    logger.warning("redis %s, worker http://u:wpass@w/d?access_token=qtok", "redis://:rpass@h")
    try:
        raise RuntimeError("failed with sk-vendor-key at redis://:tbpass@h")
    except RuntimeError:
        logger.exception("call failed")
    redactor.add(["late-secret"])  # a project's secrets, known once its file is read
    logger.info("now late-secret too")
    logger.info("short values stay: %s", "pw")
    text = out.getvalue()
    for secret in ("xoxb-slack-token", "sk-vendor-key", "rpass", "wpass", "qtok", "tbpass"):
        assert secret not in text
    assert "late-secret" not in text
    assert "token *** and key '***'" in text
    assert "redis redis://:***@h, worker http://u:***@w/d?access_token=***" in text
    assert "RuntimeError: failed with *** at redis://:***@h" in text
    assert "short values stay: pw" in text


def test_the_secrets_a_project_and_its_environment_name(tmp_path) -> None:
    text = (
        'redis = "redis://:filepw@h:1/0"\n'
        '[llm.o]\ntype = "openai"\n'
        '[llm.c]\ntype = "anthropic"\napi_key_env = "CLAUDE_CRED"\n'
        '[agent.a]\nllm = "o"\nmodel = "m"\n'
        '[agent.w]\nworker = "http://u:wpw@w/d?token=wtok"\nsigning_secret_env = "W_SIGN"\n'
        '[agent.w2]\nllm = "c"\nmodel = "m"\n'
        '[mcp.t]\nurl = "http://t/mcp"\ntoken_env = "T_TOKEN"\n'
        '[mcp.s]\ncommand = ["srv"]\nenv_from = ["GH_TOKEN"]\n'
        '[mcp.v]\ncommand = ["srv", "--dsn", "${DB_DSN}"]\n'
    )
    env = {
        "OPENAI_API_KEY": "openai-key",
        "CLAUDE_CRED": "claude-key",
        "W_SIGN": "sign-secret",
        "SLACK_BOT_TOKEN_A": "xoxb-1",
        "SLACK_APP_TOKEN_A": "xapp-1",
        "SLACK_SIGNING_SECRET_A": "slack-sign",
        "SUBS_API_KEYS": " k-one , k-two:own,k-three:read,,",
        "SUBS_API_KEY": "client-key",
        "HOME": "/home/me",
        "T_TOKEN": "mcp-bearer",
        "GH_TOKEN": "gh-handed-on",
        "DB_DSN": "postgres-dsn-pw",
    }
    project = parse_project(text, str(tmp_path / "subs.toml"), env=env)
    found = set(env_secrets(env)) | set(project_secrets(project, env, "redis://:argpw@h"))
    expected = {
        "openai-key",
        "claude-key",
        "sign-secret",
        "xoxb-1",
        "xapp-1",
        "slack-sign",
        "k-one",
        "k-two",
        "k-three",  # a KEY:read entry: the key, not its scope
        "client-key",
        "filepw",
        "argpw",
        "wpw",
        "wtok",
        "mcp-bearer",
        "gh-handed-on",
        "postgres-dsn-pw",  # a ${VAR} of an MCP command line
    }
    assert expected <= found
    assert "/home/me" not in found and "u" not in found


def test_url_secrets_are_found_as_written_and_decoded() -> None:
    assert set(url_secrets("redis://u:p%40ss@h/0?token=t")) == {"p%40ss", "p@ss", "t"}
    assert url_secrets("redis://default@h/0") == []  # a lone user is a name, often
    assert url_secrets("http://[::1") == []
