"""Token verification on the agent: local checks against the gateway's JWKS or a pinned key.

No call per request: the JWKS is fetched at start, every `JWKS_REFRESH_SECONDS`, and when a
token names a `kid` the agent does not know (at most once per `JWKS_REFRESH_MIN_SECONDS`), so
a gateway key rotation reaches agents at once and a flood of forged kids cannot hammer the
gateway. A fetched JWKS replaces the one before it (a pinned key stays): a key the gateway
retired is no longer trusted once a token signed by its successor has been seen, or at the
next periodic read at the latest.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import aiohttp

from spotgate.logging import get_logger
from spotgate.tokens import (
    AGENT_AUDIENCE,
    Claims,
    KeyFormatError,
    KeyRing,
    UnknownKid,
    VerifyKey,
    verify,
)

JWKS_REFRESH_MIN_SECONDS = 10.0
JWKS_REFRESH_SECONDS = 300.0
JWKS_FETCH_TIMEOUT_SECONDS = 5.0

log = get_logger(__name__)


class TokenVerifier:
    """Verifies bearer JWTs for one agent."""

    def __init__(
        self,
        *,
        issuer: str,
        leeway_seconds: float,
        pinned_public_key: str | None = None,
        jwks_url: str | None = None,
        session: aiohttp.ClientSession | None = None,
        clock: Callable[[], float] = time.time,
        refresh_min_seconds: float = JWKS_REFRESH_MIN_SECONDS,
    ) -> None:
        self._issuer = issuer
        self._leeway_seconds = leeway_seconds
        self._jwks_url = jwks_url
        self._session = session
        self._clock = clock
        self._refresh_min_seconds = refresh_min_seconds
        self._last_refresh = float("-inf")
        self._pinned = [VerifyKey.from_pem(pinned_public_key)] if pinned_public_key else []
        self.ring = KeyRing(verify_keys=self._pinned)

    async def refresh(self) -> bool:
        """Fetch the JWKS now (if one is configured); False when it could not be read."""
        if self._jwks_url is None or self._session is None:
            return False
        self._last_refresh = time.monotonic()
        try:
            timeout = aiohttp.ClientTimeout(total=JWKS_FETCH_TIMEOUT_SECONDS)
            async with self._session.get(self._jwks_url, timeout=timeout) as response:
                response.raise_for_status()
                document = await response.json()
            published = KeyRing.from_jwks(document)
            ring = KeyRing(verify_keys=self._pinned)
            ring.merge(published)
            self.ring = ring
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyFormatError) as err:
            log.warning("jwks fetch failed", url=self._jwks_url, error=str(err))
            return False
        return True

    async def refresh_forever(self, interval_seconds: float = JWKS_REFRESH_SECONDS) -> None:
        """Read the JWKS again every `interval_seconds`; a failed read keeps the keys held."""
        if self._jwks_url is None:
            return
        while True:
            await asyncio.sleep(interval_seconds)
            await self.refresh()

    async def verify(self, token: str) -> Claims:
        """Claims of a valid token; a `TokenError` subclass says why one is refused."""
        try:
            return self._verify(token)
        except UnknownKid:
            if time.monotonic() - self._last_refresh < self._refresh_min_seconds:
                raise
            if not await self.refresh():
                raise
            return self._verify(token)

    def _verify(self, token: str) -> Claims:
        return verify(
            self.ring,
            token,
            issuer=self._issuer,
            audience=AGENT_AUDIENCE,
            now=self._clock(),
            leeway_seconds=self._leeway_seconds,
        )
