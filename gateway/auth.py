"""Who is calling: an API key (`sg-…`) or a token the gateway issued, on every route.

Key checks are cached for `KEY_CACHE_SECONDS` so a busy key does not cost a DynamoDB read
per request; disabling a key therefore takes effect within that time (and tokens already
issued to it live until they expire, at most 15 minutes).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass

from gateway.ratelimit import Limits
from spotgate.apikeys import looks_like_api_key
from spotgate.registry import ApiKeyDisabled, ApiKeyRecord, ApiKeyRejected, Registry
from spotgate.tokens import AGENT_AUDIENCE, KeyRing, TokenError, verify
from spotgate.wsserver import AuthRefused

KEY_CACHE_SECONDS = 10.0


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller: its key and what the key allows."""

    key_id: str
    limits: Limits
    models: frozenset[str]
    max_tokens: int | None
    expires_at: float | None = None  # set when authenticated by a token

    def allows_model(self, model: str) -> bool:
        """Whether the key may use `model`."""
        return not self.models or model in self.models


def principal_of(
    record: ApiKeyRecord, max_concurrent: int, expires_at: float | None = None
) -> Principal:
    """The principal a key record stands for."""
    return Principal(
        key_id=record.key_id,
        limits=Limits(rpm=record.rpm, tpm=record.tpm, max_concurrent=max_concurrent),
        models=record.models,
        max_tokens=record.max_tokens,
        expires_at=expires_at,
    )


class Authenticator:
    """Checks API keys against the registry and tokens against the gateway's own keys."""

    def __init__(
        self,
        registry: Registry,
        ring: KeyRing,
        issuer: str,
        leeway_seconds: float,
        max_streams_per_key: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._registry = registry
        self._max_streams_per_key = max_streams_per_key
        self._ring = ring
        self._issuer = issuer
        self._leeway_seconds = leeway_seconds
        self._clock = clock
        self._by_key: dict[str, tuple[float, ApiKeyRecord]] = {}
        self._verifying: dict[str, asyncio.Future[ApiKeyRecord]] = {}
        self._by_id: dict[str, tuple[float, ApiKeyRecord | None]] = {}

    async def api_key(self, api_key: str) -> ApiKeyRecord:
        """The record of a valid, enabled API key; `AuthRefused` otherwise."""
        digest = hashlib.sha256(api_key.encode()).hexdigest()
        cached = self._by_key.get(digest)
        now = self._clock()
        if cached is not None and cached[0] > now:
            return cached[1]
        # One registry read per key at a time: a burst of new connections shares it.
        pending = self._verifying.get(digest)
        if pending is None:
            pending = asyncio.ensure_future(self._registry.verify_key(api_key))
            self._verifying[digest] = pending
            pending.add_done_callback(lambda _done: self._verifying.pop(digest, None))
        try:
            record = await asyncio.shield(pending)
        except ApiKeyRejected as err:
            raise AuthRefused("invalid API key") from err
        except ApiKeyDisabled as err:
            raise AuthRefused("this API key is disabled") from err
        self._by_key[digest] = (now + KEY_CACHE_SECONDS, record)
        return record

    async def authenticate(self, credential: str) -> Principal:
        """The principal behind an API key or a gateway token."""
        if looks_like_api_key(credential):
            return principal_of(await self.api_key(credential), self._max_streams_per_key)
        try:
            claims = verify(
                self._ring,
                credential,
                issuer=self._issuer,
                audience=AGENT_AUDIENCE,
                now=self._clock(),
                leeway_seconds=self._leeway_seconds,
            )
        except TokenError as err:
            raise AuthRefused(f"token refused: {err.reason}") from err
        record = await self._key_by_id(claims.sub)
        if record is None or record.disabled:
            raise AuthRefused("the key this token was issued to is disabled or gone")
        return principal_of(record, self._max_streams_per_key, expires_at=claims.exp)

    async def _key_by_id(self, key_id: str) -> ApiKeyRecord | None:
        now = self._clock()
        cached = self._by_id.get(key_id)
        if cached is not None and cached[0] > now:
            return cached[1]
        record = await self._registry.get_key(key_id)
        self._by_id[key_id] = (now + KEY_CACHE_SECONDS, record)
        return record
