"""API key format, hashing and constant-time checking (ARCHITECTURE.md), without I/O.

A key is shown to its owner once as `sg-<key_id>-<secret>`; only SHA-256(secret) is stored.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

KEY_PREFIX = "sg-"
KEY_ID_HEX_CHARS = 12
SECRET_BYTES = 32
MAX_API_KEY_CHARS = 256

_KEY_RE = re.compile(r"sg-([0-9a-f]{12})-([A-Za-z0-9_\-]{16,128})")

# Compared against when a key id is unknown, so a miss costs what a hit costs.
_DECOY_HASH = hashlib.sha256(b"spotgate-decoy").hexdigest()


class MalformedApiKey(ValueError):
    """The text is not shaped like a spotgate API key."""


@dataclass(frozen=True, slots=True)
class ParsedApiKey:
    """The two halves of an API key."""

    key_id: str
    secret: str


def looks_like_api_key(text: str) -> bool:
    """Whether a bearer credential is an API key (rather than a JWT)."""
    return text.startswith(KEY_PREFIX)


def new_api_key() -> tuple[str, ParsedApiKey]:
    """A fresh random key: the full text to show once, and its halves."""
    parsed = ParsedApiKey(
        key_id=secrets.token_hex(KEY_ID_HEX_CHARS // 2), secret=secrets.token_urlsafe(SECRET_BYTES)
    )
    return f"{KEY_PREFIX}{parsed.key_id}-{parsed.secret}", parsed


def parse_api_key(text: str) -> ParsedApiKey:
    """Split `sg-<key_id>-<secret>`; raise `MalformedApiKey` on anything else."""
    if len(text) > MAX_API_KEY_CHARS:
        raise MalformedApiKey("API key is too long")
    match = _KEY_RE.fullmatch(text)
    if match is None:
        raise MalformedApiKey("API key must look like sg-<key id>-<secret>")
    return ParsedApiKey(key_id=match.group(1), secret=match.group(2))


def hash_secret(secret: str) -> str:
    """SHA-256 of the secret, hex: what the keys table stores."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def secret_matches(stored_hash: str | None, secret: str) -> bool:
    """Constant-time comparison of a secret with a stored hash; `None` (unknown key) fails."""
    expected = stored_hash if stored_hash is not None else _DECOY_HASH
    matched = hmac.compare_digest(expected.encode("ascii"), hash_secret(secret).encode("ascii"))
    return matched and stored_hash is not None
