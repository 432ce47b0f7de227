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
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from spotgate.logging import get_logger
from spotgate.registry import aws_session
from spotgate.settings import AwsSettings
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


class JwksSource(Protocol):
    """Where an agent reads the gateway's public keys."""

    @property
    def where(self) -> str:
        """Named in logs."""

    async def read(self) -> Any:
        """The JWKS document."""


@dataclass(frozen=True)
class HttpJwks:
    """The gateway's `/.well-known/jwks.json`, in local mode.

    In AWS a path through the internet could be written to (a key added), so the CDK app
    has agents read `SsmJwks`.
    """

    where: str
    session: aiohttp.ClientSession

    async def read(self) -> Any:
        """GET the document."""
        timeout = aiohttp.ClientTimeout(total=JWKS_FETCH_TIMEOUT_SECONDS)
        async with self.session.get(self.where, timeout=timeout) as response:
            response.raise_for_status()
            return await response.json()


@dataclass(frozen=True)
class SsmJwks:
    """An SSM parameter the gateways publish their JWKS to (`gateway.signing.publish_jwks`).

    Read with the agent's IAM role; only the gateways' role may write it.
    """

    where: str
    aws: AwsSettings

    async def read(self) -> Any:
        """Read the parameter."""
        config = Config(connect_timeout=JWKS_FETCH_TIMEOUT_SECONDS, retries={"max_attempts": 2})
        session = aws_session(self.aws)
        async with session.client("ssm", endpoint_url=self.aws.endpoint_url, config=config) as ssm:
            response = await ssm.get_parameter(Name=self.where)
        return json.loads(response["Parameter"]["Value"])


JWKS_READ_FAILURES = (
    aiohttp.ClientError,
    BotoCoreError,
    ClientError,
    TimeoutError,
    ValueError,
    KeyError,
    KeyFormatError,
)


class TokenVerifier:
    """Verifies bearer JWTs for one agent."""

    def __init__(
        self,
        *,
        issuer: str,
        leeway_seconds: float,
        pinned_public_key: str | None = None,
        jwks: JwksSource | None = None,
        clock: Callable[[], float] = time.time,
        refresh_min_seconds: float = JWKS_REFRESH_MIN_SECONDS,
    ) -> None:
        self._issuer = issuer
        self._leeway_seconds = leeway_seconds
        self._jwks = jwks
        self._clock = clock
        self._refresh_min_seconds = refresh_min_seconds
        self._last_refresh = float("-inf")
        self._pinned = [VerifyKey.from_pem(pinned_public_key)] if pinned_public_key else []
        self.ring = KeyRing(verify_keys=self._pinned)

    async def refresh(self) -> bool:
        """Read the JWKS now (if a source is configured); False when it could not be read."""
        if self._jwks is None:
            return False
        self._last_refresh = time.monotonic()
        try:
            published = KeyRing.from_jwks(await self._jwks.read())
        except JWKS_READ_FAILURES as err:
            log.warning("jwks read failed", source=self._jwks.where, error=str(err))
            return False
        ring = KeyRing(verify_keys=self._pinned)
        ring.merge(published)
        self.ring = ring
        return True

    async def refresh_forever(self, interval_seconds: float = JWKS_REFRESH_SECONDS) -> None:
        """Read the JWKS again every `interval_seconds`; a failed read keeps the keys held."""
        if self._jwks is None:
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
