"""Client tokens (upstream's docs/190-auth.md, "Client tokens"): short-lived HS256 JWTs a
backend mints with its API key (`POST /api/machine/client-tokens`) and hands a browser,
which then calls the client API and the AG-UI channel as the token's `sub`, never with a
key. Made and checked by PyJWT, never by hand: the algorithm is pinned to HS256 (so
`alg: none` and key confusion are refused), and issuer, audience, `exp`, `iat` and `sub`
are required. The secret is `CLIENT_TOKEN_HS256_SECRET`, upstream's variable name."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import jwt

from engine.errors import SubsError

SECRET_ENV = "CLIENT_TOKEN_HS256_SECRET"
# The subject issuer a token's owner is recorded under (spec Issuer: "app", an app's own
# users): a machine submit's `identity.id` records the same, so a token for `user_42`
# owns the sessions the backend started for `user_42`.
APP_ISSUER = "app"
MAX_TTL = 86_400  # a day: a client token is short-lived (upstream: "short-lived")
_MIN_SECRET = 32  # bytes: RFC 7518 §3.2, an HS256 key at least as long as the hash


class ClientTokenError(SubsError):
    """A bearer token the API refuses: 401, the reason PyJWT found, never the token."""

    code = "invalid_token"
    status = 401


class TokenConfigError(SubsError):
    """A bad `CLIENT_TOKEN_HS256_SECRET`: `subs serve` exits 2, as for a bad flag."""

    code = "invalid_config"
    exit_status = 2


@dataclass(frozen=True)
class TokenClaims:
    """What a verified token says: its owner and the metadata the backend gave it."""

    sub: str
    metadata: Mapping[str, str] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class ClientTokens:
    """The minting and checking of client tokens; `secret` None: tokens are off."""

    secret: bytes | None = field(default=None, repr=False)
    issuer: str = "subs"
    audience: str = "subs-client"
    leeway: float = 5.0  # seconds of clock skew allowed on exp, nbf and iat

    @classmethod
    def from_env(
        cls, env: Mapping[str, str], *, issuer: str = "subs", audience: str = "subs-client"
    ) -> ClientTokens:
        """Tokens signed with `CLIENT_TOKEN_HS256_SECRET`; off when it is unset or empty.

        Raises:
            TokenConfigError: a secret shorter than 32 bytes (a guessable HS256 key).
        """
        raw = env.get(SECRET_ENV, "")
        if not raw:
            return cls(None, issuer, audience)
        secret = raw.encode()
        if len(secret) < _MIN_SECRET:
            raise TokenConfigError(
                f"{SECRET_ENV} is {len(secret)} bytes; an HS256 secret needs at least "
                f"{_MIN_SECRET} (for example: openssl rand -hex 32)"
            )
        return cls(secret, issuer, audience)

    @property
    def enabled(self) -> bool:
        """Whether a secret is set: without one no token is minted or accepted."""
        return self.secret is not None

    def mint(
        self, sub: str, metadata: Mapping[str, str], ttl_seconds: int, now: float
    ) -> tuple[str, int]:
        """A signed token for `sub` and its expiry in Unix seconds."""
        assert self.secret is not None, "mint needs a secret (check `enabled`)"
        iat = int(now)
        exp = iat + ttl_seconds
        claims = {
            "iss": self.issuer,
            "aud": self.audience,
            "sub": sub,
            "iat": iat,
            "nbf": iat,
            "exp": exp,
            "metadata": dict(metadata),
        }
        return jwt.encode(claims, self.secret, algorithm="HS256"), exp

    def verify(self, token: str) -> TokenClaims:
        """The claims of a good token.

        Raises:
            ClientTokenError: why the token is refused (expired, not yet valid, another
                audience or issuer, a bad signature, another algorithm, no `sub`...).
        """
        if self.secret is None:
            raise ClientTokenError(
                f"client tokens are off on this server ({SECRET_ENV} is not set); "
                "send an API key instead"
            )
        try:
            claims = jwt.decode(
                token,
                self.secret,
                algorithms=["HS256"],
                audience=self.audience,
                issuer=self.issuer,
                leeway=self.leeway,
                options={"require": ["exp", "iat", "sub", "iss", "aud"]},
            )
        except jwt.ExpiredSignatureError:
            raise ClientTokenError("client token expired: mint a new one") from None
        except jwt.ImmatureSignatureError:
            raise ClientTokenError(
                "client token not yet valid (its nbf or iat is in the future)"
            ) from None
        except jwt.InvalidAudienceError:
            raise ClientTokenError(
                f"client token has the wrong audience (this server takes {self.audience!r})"
            ) from None
        except jwt.InvalidIssuerError:
            raise ClientTokenError(
                f"client token has the wrong issuer (this server takes {self.issuer!r})"
            ) from None
        except jwt.InvalidSignatureError:
            raise ClientTokenError("client token signature does not match") from None
        except jwt.InvalidAlgorithmError:
            raise ClientTokenError("client token is not signed with HS256") from None
        except jwt.MissingRequiredClaimError as err:
            raise ClientTokenError(f"client token has no {err.claim!r} claim") from None
        except jwt.InvalidTokenError as err:
            raise ClientTokenError(f"client token is invalid: {err}") from None
        sub = claims.get("sub")
        if not isinstance(sub, str) or not sub:
            raise ClientTokenError("client token has no 'sub' claim")
        metadata = claims.get("metadata") or {}
        if not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
        ):
            raise ClientTokenError("client token metadata is not an object of strings")
        return TokenClaims(sub, metadata)


def looks_like_jwt(credential: str) -> bool:
    """Three dot-separated parts: worth verifying as a token rather than as a key."""
    return credential.count(".") == 2
