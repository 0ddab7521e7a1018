"""Who may call the API: `SUBS_API_KEYS` parsed into keys, the caller a bearer key names
and what it owns, and where the API may listen with no key set (SPEC §13). Plain data and
hashing, no HTTP: the auth middleware asks this module, `commands` checks the bind."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.errors import SubsError


@dataclass(frozen=True)
class Principal:
    """Who is calling: `key_id` is None when the API runs open. A scoped caller is a
    `KEY:own` key (subject issuer "api", its id the key's) or a client token (issuer
    "app", its id the token's `sub`, with the token's metadata): both act only on the
    sessions their subject owns and end only client-handled calls."""

    key_id: str | None
    full: bool
    read_only: bool = False  # a `KEY:read` key: sees every session, changes nothing
    issuer: str = "api"
    metadata: Mapping[str, str] = field(default_factory=dict, hash=False)

    @property
    def token(self) -> bool:
        """A client token's caller (the Frontend caller of upstream's auth page)."""
        return self.issuer != "api"

    @property
    def caller(self) -> str:
        """The name its streams are counted under: a key's id, or a token's subject."""
        return f"{self.issuer}:{self.key_id}"

    def owns(self, identity: Mapping[str, Any] | None) -> bool:
        """Full access owns everything; a scoped caller owns what its subject created."""
        if self.full:
            return True
        subject = (identity or {}).get("subject") or {}
        return subject.get("issuer") == self.issuer and subject.get("id") == self.key_id

    def identity(self) -> dict[str, Any]:
        """The identity a new session created by this caller records."""
        if self.key_id is None:
            return {"metadata": {}}
        subject = {"issuer": self.issuer, "id": self.key_id}
        return {"subject": subject, "metadata": dict(self.metadata)}


@dataclass(frozen=True)
class ApiKey:
    """One configured key, kept only as its digest; `key_id` names it in logs and owners."""

    digest: bytes = field(repr=False)  # sha256 of the key: compared instead, so lengths never leak
    key_id: str
    scoped: bool
    read_only: bool = False


class ApiKeysError(SubsError):
    """A bad `SUBS_API_KEYS` entry. The message names its position and the mistake, never
    the key: it is printed, and the key is a secret. Exits 2, as a bad flag does."""

    code = "invalid_config"
    exit_status = 2


@dataclass(frozen=True)
class ApiKeys:
    """The configured bearer keys. None configured means the API runs open."""

    keys: tuple[ApiKey, ...] = ()

    @classmethod
    def parse(cls, text: str) -> ApiKeys:
        """Comma-separated entries: `KEY` (full access), `KEY:own` (own sessions only) or
        `KEY:read` (reads everything, changes nothing: an operator's console).

        Empty text configures no key. Otherwise every entry must be good: one that is not
        would otherwise leave the API with fewer keys than meant, or open.

        Raises:
            ApiKeysError: the first bad entry, by position (1-based).
        """
        if not text:
            return cls()
        return cls(tuple(_api_key(raw.strip(), n) for n, raw in enumerate(text.split(","), 1)))

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ApiKeys:
        """The keys `SUBS_API_KEYS` lists; none when it is unset."""
        return cls.parse(env.get("SUBS_API_KEYS", ""))

    @property
    def open(self) -> bool:
        """No keys configured: the API answers without authentication."""
        return not self.keys

    def authenticate(self, authorization: str | None) -> Principal | None:
        """The caller a `Bearer` header names, or None. Every key is compared, always."""
        if self.open:
            return Principal(None, full=True)
        scheme, _, token = (authorization or "").partition(" ")
        digest = hashlib.sha256(token.strip().encode()).digest()
        found: ApiKey | None = None
        for key in self.keys:
            if hmac.compare_digest(digest, key.digest) and found is None:
                found = key
        if found is None or scheme.lower() != "bearer":
            return None
        return Principal(found.key_id, full=not found.scoped, read_only=found.read_only)


_SCOPES = frozenset({"own", "read"})


def _api_key(entry: str, position: int) -> ApiKey:
    where = f"SUBS_API_KEYS entry {position}"
    if not entry:
        raise ApiKeysError(f"{where}: empty (separate keys with single commas)")
    secret, sep, scope = entry.rpartition(":")
    if not sep:
        secret, scope = entry, ""
    elif scope not in _SCOPES:
        # A word after ':' is a suffix typo; anything else may be part of the key: not shown.
        shown = f"':{scope}'" if scope.isalpha() and len(scope) <= 12 else "after ':'"
        raise ApiKeysError(f"{where}: unknown suffix {shown} (use KEY, KEY:own or KEY:read)")
    if not secret:
        raise ApiKeysError(f"{where}: empty key before ':{scope}'")
    if any(c.isspace() for c in secret):
        raise ApiKeysError(f"{where}: whitespace inside the key")
    digest = hashlib.sha256(secret.encode()).digest()
    return ApiKey(digest, digest.hex()[:12], scoped=scope == "own", read_only=scope == "read")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, keys: ApiKeys) -> str | None:
    """Why the API must not listen on `host` (SPEC §13), or None when it may."""
    if keys.open and not _is_loopback(host):
        return (
            f"refusing to serve the API on {host} without keys: set SUBS_API_KEYS "
            "or bind to 127.0.0.1"
        )
    return None


def bind_warning(host: str, keys: ApiKeys) -> str | None:
    """The one line to print at start when the API runs open on loopback."""
    if keys.open and _is_loopback(host):
        return f"the API on {host} is open: no SUBS_API_KEYS set, any local process may call it"
    return None


def unauthorized(authorization: str | None) -> str:
    """What was wrong with the credential, and where a good one comes from (the setting and
    the header); never the key that was sent."""
    fix = 'send "Authorization: Bearer <key>" with a key from SUBS_API_KEYS'
    if not authorization:
        return f"missing API key: {fix}"
    scheme = authorization.partition(" ")[0]
    if scheme.lower() != "bearer":
        return f"the Authorization header is not a Bearer key: {fix}"
    return f"unknown API key: {fix}"


def read_only_refusal(method: str, path: str) -> str:
    """Why a `KEY:read` key may not send this request, or "" when it may (it may read)."""
    if method in ("GET", "HEAD", "OPTIONS"):
        return ""
    return f"{method} {path}: this key is read-only (a KEY:read entry in SUBS_API_KEYS)"
