"""Credentials out of everything `subs` prints or logs.

Secrets reach text two ways: inside URLs (`redis://:pw@host`, `http://user:pw@worker`,
`?token=…`), and as bare values that some library or error message happens to echo (an API
key, a Slack token). `redact_url` masks a URL we print on purpose; `Redactor` is a logging
filter that scrubs both kinds from every record's final text, tracebacks included, so a
line nobody thought about cannot leak either.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

MASK = "***"
MIN_SECRET = 4  # shorter values would mask common words and numbers, and guard nothing
# Query parameters whose value is a credential: token, api_key, sig, password, auth, ...
_SECRET_PARAM = re.compile(r"key|token|secret|sig|pass|pwd|auth|cred", re.IGNORECASE)
# `scheme://user:password@` or `scheme://token@` anywhere in free text (up to the last '@').
_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)([^\s/?#]*)@")
# `?name=value` / `&name=value` where the name says credential.
_QUERY_SECRET = re.compile(
    r"([?&;][^\s=&#]*(?:key|token|secret|sig|pass|pwd|auth|cred)[^\s=&#]*=)[^\s&#'\"]+",
    re.IGNORECASE,
)
_SLACK_SECRET_VARS = ("SLACK_BOT_TOKEN_", "SLACK_APP_TOKEN_", "SLACK_SIGNING_SECRET_")


def redact_url(url: str) -> str:
    """`url` with its password (or a lone user, which is usually a token) and credential
    query values masked: `redis://:pw@h:6379/0` -> `redis://:***@h:6379/0`."""
    try:
        parts = urlsplit(url)
    except ValueError:  # not parseable as a URL: mask what looks like one inside it
        return _scrub_urls(url)
    if "@" in parts.netloc:  # the last '@' ends the userinfo: a password may hold one too
        userinfo, _, host = parts.netloc.rpartition("@")
        user, sep, _ = userinfo.partition(":")
        netloc = f"{user}:{MASK}@{host}" if sep else f"{MASK}@{host}"
        url = url.replace(parts.netloc, netloc, 1)  # the first match is the authority itself
    return _QUERY_SECRET.sub(rf"\g<1>{MASK}", url)


def _scrub_urls(text: str) -> str:
    def userinfo(match: re.Match[str]) -> str:
        user, sep, _ = match.group(2).partition(":")
        return f"{match.group(1)}{user}:{MASK}@" if sep else f"{match.group(1)}{MASK}@"

    return _QUERY_SECRET.sub(rf"\g<1>{MASK}", _USERINFO.sub(userinfo, text))


class Redactor(logging.Filter):
    """Scrubs known secret values and URL credentials from every record that passes.

    Install it on the handlers (a filter on a logger misses its children's records).
    Values are added as they become known: the environment's at start, a project's once
    its file is read.
    """

    def __init__(self, values: Iterable[str] = ()) -> None:
        super().__init__()
        self._values: set[str] = set()
        self._pattern: re.Pattern[str] | None = None
        self.add(values)

    def add(self, values: Iterable[str]) -> None:
        """Mask these values from now on (too short ones would mask common words)."""
        fresh = {v for v in values if len(v) >= MIN_SECRET} - self._values
        if not fresh:
            return
        self._values |= fresh
        longest_first = sorted(self._values, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, longest_first)))

    def scrub(self, text: str) -> str:
        """`text` with every known secret and every URL credential masked."""
        if self._pattern is not None:
            text = self._pattern.sub(MASK, text)
        return _scrub_urls(text)

    def filter(self, record: logging.LogRecord) -> bool:
        """As a logging filter: scrub the record's final text; never drops a record."""
        try:
            message = record.getMessage()
        except Exception:  # bad format arguments: the handler reports it; show nothing raw
            message = str(record.msg)
        record.msg, record.args = self.scrub(message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.scrub(record.exc_text)
        if record.stack_info:
            record.stack_info = self.scrub(record.stack_info)
        return True

    def install(self) -> None:
        """On every handler of the root logger (call after `logging.basicConfig`)."""
        for handler in logging.getLogger().handlers:
            if self not in handler.filters:
                handler.addFilter(self)


def env_secrets(env: Mapping[str, str]) -> list[str]:
    """The secrets the environment holds whatever the project: API keys, the client
    token secret and Slack's."""
    values = [v for k, v in env.items() if k.startswith(_SLACK_SECRET_VARS)]
    values.append(env.get("SUBS_API_KEY", ""))
    values.append(env.get("CLIENT_TOKEN_HS256_SECRET", ""))  # signs client tokens
    for entry in env.get("SUBS_API_KEYS", "").split(","):
        values.append(entry.strip().removesuffix(":own").removesuffix(":read"))
    return values


def scrubbed(value: Any, scrub: Callable[[str], str]) -> Any:
    """`value` (JSON-like: dicts, lists, strings) with every string in it scrubbed."""
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, dict):
        return {k: scrubbed(v, scrub) for k, v in value.items()}
    if isinstance(value, list):
        return [scrubbed(v, scrub) for v in value]
    return value


def url_secrets(url: str) -> list[str]:
    """The password and credential query values inside `url`, as written and decoded.

    A lone user is left out: often a plain name (`default`) that masking everywhere would
    garble; inside a URL the text scrub masks it anyway."""
    try:
        parts = urlsplit(url)
        query = parse_qsl(parts.query, keep_blank_values=True)
    except ValueError:
        return []
    found = [v for k, v in query if _SECRET_PARAM.search(k)]
    if parts.password:
        found += [parts.password, unquote(parts.password)]
    return found
