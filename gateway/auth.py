"""Who is calling: an API key (`sg-…`) or a token the gateway issued, on every route.

Key checks are cached so a busy key does not cost a DynamoDB read per request, and are
refreshed ahead: a record older than `KEY_FRESH_SECONDS` is still used while it is re-read in
the background, so a busy key's requests never wait on DynamoDB; only a record older than
`KEY_CACHE_SECONDS` must be read again first. Disabling a key therefore takes effect within
`KEY_CACHE_SECONDS` (tokens already issued to it live until they expire, at most 15 minutes).
While DynamoDB is unreachable, keys checked in the last `KEY_STALE_MAX_SECONDS` still work;
other keys get 503 with `Retry-After`, never a wrong 401.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from botocore.exceptions import BotoCoreError, ClientError

from gateway.ratelimit import Limits
from spotgate.admission import Grant
from spotgate.apikeys import looks_like_api_key
from spotgate.logging import get_logger
from spotgate.registry import ApiKeyDisabled, ApiKeyRecord, ApiKeyRejected, Registry
from spotgate.tenancy import tenant_of
from spotgate.tokens import AGENT_AUDIENCE, KeyRing, TokenError, verify
from spotgate.wsserver import AuthRefused, AuthUnavailable

KEY_FRESH_SECONDS = 5.0
KEY_CACHE_SECONDS = 10.0
KEY_STALE_MAX_SECONDS = 300.0

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller: its key and what the key allows."""

    key_id: str
    limits: Limits
    models: frozenset[str]
    max_tokens: int | None
    # Whose prefix cache the caller's streams share (`spotgate.tenancy.tenant_of`).
    tenant: str
    expires_at: float | None = None  # set when authenticated by a token
    weight: float = 1.0  # its tenant's share of a full model's queue (`gateway.fair_queue`)

    @property
    def grant(self) -> Grant:
        """What the key allows, for admission (`spotgate.admission`)."""
        return Grant(self.models, self.max_tokens, self.expires_at)


def principal_of(
    record: ApiKeyRecord, max_concurrent: int, expires_at: float | None = None
) -> Principal:
    """The principal a key record stands for (`max_concurrent`: unless the key sets its own)."""
    streams = record.max_streams if record.max_streams is not None else max_concurrent
    return Principal(
        key_id=record.key_id,
        limits=Limits(rpm=record.rpm, tpm=record.tpm, max_concurrent=streams),
        models=record.models,
        max_tokens=record.max_tokens,
        expires_at=expires_at,
        tenant=tenant_of(record.key_id, record.tenant),
        weight=float(record.weight),
    )


Record = TypeVar("Record")

REGISTRY_FAILURES = (BotoCoreError, ClientError, OSError, TimeoutError)
"""What a registry read raises when DynamoDB cannot answer (as opposed to a refused key)."""


class RefreshAheadCache(Generic[Record]):
    """Registry reads by key, cached, refreshed in the background, single-flight.

    `load` raises `AuthRefused` for a credential that is no good (nothing is cached then)
    and a `REGISTRY_FAILURES` error when the registry cannot answer.
    """

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._entries: dict[str, tuple[float, Record]] = {}
        self._loading: dict[str, asyncio.Future[Record]] = {}

    def holds(self, key: str) -> bool:
        """Whether a record for `key` was read lately enough to be served without a read."""
        entry = self._entries.get(key)
        return entry is not None and self._clock() - entry[0] < KEY_CACHE_SECONDS

    def put(self, key: str, record: Record) -> None:
        """Hold a record just read another way (the same key found through another cache)."""
        self._entries[key] = (self._clock(), record)

    async def get(self, key: str, load: Callable[[], Awaitable[Record]]) -> Record:
        """The record for `key`, from the cache when it is recent enough."""
        entry = self._entries.get(key)
        age = self._clock() - entry[0] if entry is not None else None
        if entry is not None and age is not None and age < KEY_CACHE_SECONDS:
            if age >= KEY_FRESH_SECONDS:
                self._load(key, load)  # refresh ahead; this request does not wait
            return entry[1]
        try:
            return await asyncio.shield(self._load(key, load))
        except REGISTRY_FAILURES as err:
            if entry is not None and age is not None and age < KEY_STALE_MAX_SECONDS:
                log.warning("registry unreachable; using a cached key record", error=str(err))
                return entry[1]
            raise AuthUnavailable(
                "cannot check credentials right now (the registry is unreachable); retry"
            ) from err

    async def settled(self) -> None:
        """Wait for the reads in flight (background refreshes included) to land."""
        await asyncio.gather(*self._loading.values(), return_exceptions=True)

    async def close(self) -> None:
        """Cancel the reads in flight (the registry client is about to close under them)."""
        pending = list(self._loading.values())
        for future in pending:
            future.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    def _load(self, key: str, load: Callable[[], Awaitable[Record]]) -> asyncio.Future[Record]:
        pending = self._loading.get(key)
        if pending is None:
            pending = asyncio.ensure_future(load())
            self._loading[key] = pending
            pending.add_done_callback(lambda done: self._loaded(key, done))
        return pending

    def _loaded(self, key: str, done: asyncio.Future[Record]) -> None:
        self._loading.pop(key, None)
        if done.cancelled():
            return
        error = done.exception()
        if error is None:
            self._entries[key] = (self._clock(), done.result())
        elif isinstance(error, AuthRefused):
            self._entries.pop(key, None)  # refused now: no longer served from the cache


def _digest(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()


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
        self._by_key = RefreshAheadCache[ApiKeyRecord](clock)
        self._by_id = RefreshAheadCache[ApiKeyRecord](clock)

    def recognises(self, credential: str) -> bool:
        """Whether `credential` is an API key this gateway found valid moments ago: no guess."""
        return looks_like_api_key(credential) and self._by_key.holds(_digest(credential))

    async def api_key(self, api_key: str) -> ApiKeyRecord:
        """The record of a valid, enabled API key; `AuthRefused` otherwise."""
        digest = _digest(api_key)

        async def load() -> ApiKeyRecord:
            try:
                return await self._registry.verify_key(api_key)
            except ApiKeyRejected as err:
                raise AuthRefused("invalid API key") from err
            except ApiKeyDisabled as err:
                raise AuthRefused("this API key is disabled") from err

        record = await self._by_key.get(digest, load)
        self._by_id.put(record.key_id, record)  # what `revoked` reads, fresh now
        return record

    async def revoked(self, principal: Principal) -> str | None:
        """Why the key behind an authenticated caller no longer works, or None if it does.

        A socket authenticates once; this is asked again for each stream on it, from the
        cache (refreshed ahead), so a key disabled or deleted stops within `KEY_CACHE_SECONDS`
        on sockets already open too. While the registry cannot answer, a socket keeps the
        key it was opened with: an outage of the registry stops no stream.
        """
        try:
            await self._key_by_id(principal.key_id)
        except AuthUnavailable:
            return None
        except AuthRefused:
            return "this API key was disabled or deleted"
        return None

    async def settled(self) -> None:
        """Wait for key reads in flight, background refreshes included."""
        await self._by_key.settled()
        await self._by_id.settled()

    async def close(self) -> None:
        """Cancel key reads in flight; call before the registry closes."""
        await self._by_key.close()
        await self._by_id.close()

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
        return principal_of(record, self._max_streams_per_key, expires_at=claims.exp)

    async def _key_by_id(self, key_id: str) -> ApiKeyRecord:
        async def load() -> ApiKeyRecord:
            record = await self._registry.get_key(key_id)
            if record is None or record.disabled:
                raise AuthRefused("the key this token was issued to is disabled or gone")
            return record

        return await self._by_id.get(key_id, load)
