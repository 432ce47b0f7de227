"""Tokens themselves: their claims, `issue()`, `verify()`, and why a token is refused.

`verify` is a pure function of the ring, the token and the clock reading it is given, and
every way a token can be wrong has its own exception.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import jwt

from spotgate.admission import Grant, model_allowed
from spotgate.settings import TOKEN_TTL_MAX_SECONDS
from spotgate.tokens.keys import ALGORITHM, KeyRing, b64url_decode

AGENT_AUDIENCE = "spotgate-agent"
GATEWAY_SUBJECT_PREFIX = "gateway:"
"""`sub` of the tokens a gateway presents to agents (key ids are hex, so they never collide)."""
DEFAULT_TTL_SECONDS = 60
DEFAULT_LEEWAY_SECONDS = 5.0
MAX_TOKEN_CHARS = 8 * 1024
"""A real token is a few hundred characters; anything this long is refused before parsing."""


class TokenError(Exception):
    """A token was refused; `reason` names why in one word (safe to show a client)."""

    reason = "invalid"


class MalformedToken(TokenError):
    """Not a compact JWS with a JSON header and the claims spotgate requires."""

    reason = "malformed"


class WrongAlgorithm(TokenError):
    """The header names an algorithm other than EdDSA (`none`, HS256, RS256…)."""

    reason = "wrong_algorithm"


class UnknownKid(TokenError):
    """The header's `kid` names no key in the ring."""

    reason = "unknown_kid"


class BadSignature(TokenError):
    """The signature does not match the header and payload under the named key."""

    reason = "bad_signature"


class TokenExpired(TokenError):
    """`exp` is in the past (beyond the leeway)."""

    reason = "expired"


class TokenNotYetValid(TokenError):
    """`nbf` (or `iat`) is in the future (beyond the leeway)."""

    reason = "not_yet_valid"


class BadAudience(TokenError):
    """`aud` is not the audience this verifier serves."""

    reason = "bad_audience"


class BadIssuer(TokenError):
    """`iss` is not the gateway this verifier trusts."""

    reason = "bad_issuer"


@dataclass(frozen=True, slots=True)
class Claims:
    """The verified claims of a spotgate token."""

    iss: str
    aud: str
    sub: str
    iat: int
    nbf: int
    exp: int
    jti: str
    mdl: tuple[str, ...] | None = None
    mtk: int | None = None
    tnt: str | None = None
    """The tenant of the key when it names one (`spotgate.tenancy`); None: the key is its own."""

    def to_payload(self) -> dict[str, Any]:
        """The JWT payload, optional claims left out when unset."""
        payload: dict[str, Any] = {
            "iss": self.iss,
            "aud": self.aud,
            "sub": self.sub,
            "iat": self.iat,
            "nbf": self.nbf,
            "exp": self.exp,
            "jti": self.jti,
        }
        if self.mdl is not None:
            payload["mdl"] = list(self.mdl)
        if self.mtk is not None:
            payload["mtk"] = self.mtk
        if self.tnt is not None:
            payload["tnt"] = self.tnt
        return payload

    @property
    def grant(self) -> Grant:
        """What the token allows, for admission (`spotgate.admission`)."""
        return Grant(
            models=frozenset(self.mdl or ()), max_tokens=self.mtk, expires_at=float(self.exp)
        )

    def allows_model(self, model: str) -> bool:
        """Whether the token lets its holder use `model` (no `mdl` claim means any)."""
        return model_allowed(self.mdl or (), model)


@dataclass(frozen=True, slots=True)
class IssuedToken:
    """A signed token and what it says."""

    token: str
    claims: Claims

    @property
    def expires_at(self) -> int:
        """Epoch seconds after which the token is refused."""
        return self.claims.exp


def issue(
    ring: KeyRing,
    *,
    subject: str,
    issuer: str,
    now: float,
    ttl_seconds: int = DEFAULT_TTL_SECONDS,
    audience: str = AGENT_AUDIENCE,
    models: Iterable[str] | None = None,
    max_tokens: int | None = None,
    tenant: str | None = None,
) -> IssuedToken:
    """Sign a token for `subject` (an API key id) valid for `ttl_seconds` from `now`."""
    if not 1 <= ttl_seconds <= TOKEN_TTL_MAX_SECONDS:
        raise ValueError(f"ttl_seconds must be within 1..{TOKEN_TTL_MAX_SECONDS}")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError("max_tokens must be positive")
    mdl = tuple(models) if models is not None else None
    if mdl == ():  # an empty claim would read as "every model"
        raise ValueError("models must name at least one model (None: every model)")
    issued_at = int(now)
    claims = Claims(
        iss=issuer,
        aud=audience,
        sub=subject,
        iat=issued_at,
        nbf=issued_at,
        exp=issued_at + ttl_seconds,
        jti=secrets.token_urlsafe(12),
        mdl=mdl,
        mtk=max_tokens,
        tnt=tenant,
    )
    key = ring.signing_key
    token = jwt.encode(
        claims.to_payload(),
        key.private_key,
        algorithm=ALGORITHM,
        headers={"kid": key.kid, "typ": "JWT"},
    )
    return IssuedToken(token=token, claims=claims)


# Signature only: the claims are checked below against the clock reading given to `verify`.
_SIGNATURE_ONLY: Any = {
    "verify_signature": True,
    "verify_exp": False,
    "verify_nbf": False,
    "verify_iat": False,
    "verify_aud": False,
    "verify_iss": False,
    "verify_sub": False,
    "verify_jti": False,
    "require": [],
}


def verify(
    ring: KeyRing,
    token: str,
    *,
    issuer: str,
    now: float,
    audience: str = AGENT_AUDIENCE,
    leeway_seconds: float = DEFAULT_LEEWAY_SECONDS,
) -> Claims:
    """Check a token's form, algorithm, key, signature and claims; raise a `TokenError` if bad."""
    if not isinstance(token, str) or not token or len(token) > MAX_TOKEN_CHARS:
        raise MalformedToken("token is empty, not text, or too long")
    header = _unverified_header(token)
    if header.get("alg") != ALGORITHM:
        raise WrongAlgorithm(f"algorithm must be {ALGORITHM}")
    kid = header.get("kid")
    if not isinstance(kid, str):
        raise MalformedToken("token header has no 'kid'")
    key = ring.get(kid)
    if key is None:
        raise UnknownKid("token is signed by a key this verifier does not know")
    try:
        payload = jwt.decode(token, key.public_key, algorithms=[ALGORITHM], options=_SIGNATURE_ONLY)
    except jwt.InvalidSignatureError as err:
        raise BadSignature("token signature does not verify") from err
    except jwt.InvalidTokenError as err:
        raise MalformedToken("token cannot be decoded") from err
    return validate_claims(
        payload, issuer=issuer, audience=audience, now=now, leeway_seconds=leeway_seconds
    )


def _unverified_header(token: str) -> dict[str, Any]:
    """The JOSE header, read only to pick the key; pyjwt then checks the whole token strictly.

    (`jwt.get_unverified_header` would validate every segment a second time: it doubled the
    cost of `verify`.)
    """
    encoded, dot, _rest = token.partition(".")
    try:
        header = json.loads(b64url_decode(encoded)) if dot else None
    except (ValueError, RecursionError) as err:  # binascii.Error is a ValueError
        raise MalformedToken("token is not a compact JWS") from err
    if not isinstance(header, dict):
        raise MalformedToken("token is not a compact JWS")
    return header


def validate_claims(
    payload: Mapping[str, Any],
    *,
    issuer: str,
    audience: str,
    now: float,
    leeway_seconds: float = DEFAULT_LEEWAY_SECONDS,
) -> Claims:
    """Check a signature-verified payload's claims at time `now`; return them typed."""
    claims = _typed_claims(payload)
    if claims.aud != audience:
        raise BadAudience("token is not meant for this audience")
    if claims.iss != issuer:
        raise BadIssuer("token was issued by an untrusted issuer")
    if claims.exp - claims.iat > TOKEN_TTL_MAX_SECONDS or claims.exp < claims.nbf:
        raise MalformedToken("token lifetime is out of bounds")
    if now >= claims.exp + leeway_seconds:
        raise TokenExpired("token has expired")
    if now < max(claims.nbf, claims.iat) - leeway_seconds:
        raise TokenNotYetValid("token is not valid yet")
    return claims


def _string_claim(payload: Mapping[str, Any], name: str) -> str:
    value = payload.get(name)
    if not isinstance(value, str) or not value:
        raise MalformedToken(f"claim '{name}' must be a non-empty string")
    return value


def _time_claim(payload: Mapping[str, Any], name: str) -> int:
    value = payload.get(name)
    if not isinstance(value, int) or isinstance(value, bool):
        raise MalformedToken(f"claim '{name}' must be an integer time")
    return value


def _typed_claims(payload: Mapping[str, Any]) -> Claims:
    """Claims with the right types, or `MalformedToken` naming what is missing or wrong."""
    models = payload.get("mdl")
    if models is not None and not (
        isinstance(models, list) and models and all(isinstance(model, str) for model in models)
    ):
        # An empty list would read as "every model" (`spotgate.admission.model_allowed`).
        raise MalformedToken("claim 'mdl' must be a non-empty list of model names")
    max_tokens = payload.get("mtk")
    if max_tokens is not None and (
        not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1
    ):
        raise MalformedToken("claim 'mtk' must be a positive integer")
    tenant = payload.get("tnt")
    if tenant is not None and not (isinstance(tenant, str) and tenant):
        raise MalformedToken("claim 'tnt' must be a non-empty string")
    return Claims(
        iss=_string_claim(payload, "iss"),
        aud=_string_claim(payload, "aud"),
        sub=_string_claim(payload, "sub"),
        jti=_string_claim(payload, "jti"),
        iat=_time_claim(payload, "iat"),
        nbf=_time_claim(payload, "nbf"),
        exp=_time_claim(payload, "exp"),
        mdl=tuple(models) if models is not None else None,
        mtk=max_tokens,
        tnt=tenant,
    )
