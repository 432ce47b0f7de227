from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from gateway.signing import publish_jwks
from gpu_agent.auth import HttpJwks, SsmJwks, TokenVerifier
from spotgate.process import serving_on_loopback
from spotgate.settings import GatewaySettings
from spotgate.tokens import KeyRing, SigningKey, UnknownKid, issue
from stack.emulator import AwsEmulator

ISSUER = "http://gw.test"


class Fetches(list[int]):
    """The JWKS fetches so far; `made` is set at each one."""

    def __init__(self) -> None:
        super().__init__()
        self.made = asyncio.Event()

    def count(self) -> None:  # type: ignore[override]
        self.append(1)
        self.made.set()


@pytest.fixture
async def jwks_server() -> AsyncIterator[tuple[str, KeyRing, Fetches]]:
    """A gateway stand-in that publishes its JWKS and counts the fetches."""
    ring = KeyRing([SigningKey.generate()])
    fetches = Fetches()

    async def jwks(_request: web.Request) -> web.Response:
        fetches.count()
        return web.json_response(ring.jwks())

    app = web.Application()
    app.router.add_get("/.well-known/jwks.json", jwks)
    async with serving_on_loopback(app) as url:
        yield f"{url}/.well-known/jwks.json", ring, fetches


async def test_rotated_gateway_key_is_picked_up_on_first_unknown_kid(
    jwks_server: tuple[str, KeyRing, Fetches],
) -> None:
    url, ring, fetches = jwks_server
    async with aiohttp.ClientSession() as http:
        verifier = TokenVerifier(
            issuer=ISSUER, leeway_seconds=5, jwks=HttpJwks(url, http), refresh_min_seconds=0
        )
        assert await verifier.refresh()
        first = issue(ring, subject="k", issuer=ISSUER, now=time.time()).token
        assert (await verifier.verify(first)).sub == "k"
        assert len(fetches) == 1  # verified locally, no call per request

        ring.rotate(SigningKey.generate())
        rotated = issue(ring, subject="k2", issuer=ISSUER, now=time.time()).token

        assert (await verifier.verify(rotated)).sub == "k2"
        assert len(fetches) == 2


async def test_unknown_kids_cannot_hammer_the_jwks(
    jwks_server: tuple[str, KeyRing, Fetches],
) -> None:
    url, _ring, fetches = jwks_server
    stranger = KeyRing([SigningKey.generate()])
    async with aiohttp.ClientSession() as http:
        verifier = TokenVerifier(issuer=ISSUER, leeway_seconds=5, jwks=HttpJwks(url, http))
        await verifier.refresh()
        for _ in range(20):
            forged = issue(stranger, subject="x", issuer=ISSUER, now=time.time()).token
            with pytest.raises(UnknownKid):
                await verifier.verify(forged)
    assert len(fetches) == 1


async def test_a_key_retired_from_the_jwks_is_no_longer_trusted_once_refreshed(
    jwks_server: tuple[str, KeyRing, Fetches],
) -> None:
    url, ring, _fetches = jwks_server
    pinned = SigningKey.generate()
    async with aiohttp.ClientSession() as http:
        verifier = TokenVerifier(
            issuer=ISSUER,
            leeway_seconds=5,
            jwks=HttpJwks(url, http),
            refresh_min_seconds=0,
            pinned_public_key=pinned.verify_key.to_pem(),
        )
        await verifier.refresh()
        retired = ring.signing_key
        old = issue(ring, subject="k", issuer=ISSUER, now=time.time()).token
        assert (await verifier.verify(old)).sub == "k"

        ring.rotate(SigningKey.generate())
        ring.remove(retired.kid)
        new = issue(ring, subject="k2", issuer=ISSUER, now=time.time()).token
        assert (await verifier.verify(new)).sub == "k2"  # an unknown kid: the JWKS is re-read

        with pytest.raises(UnknownKid):
            await verifier.verify(old)
        by_pin = issue(KeyRing([pinned]), subject="p", issuer=ISSUER, now=time.time()).token
        assert (await verifier.verify(by_pin)).sub == "p"  # the pinned key stays trusted


async def test_a_retired_key_is_dropped_by_the_periodic_read_with_no_successor_token_seen(
    jwks_server: tuple[str, KeyRing, Fetches],
) -> None:
    url, ring, fetches = jwks_server
    async with aiohttp.ClientSession() as http:
        verifier = TokenVerifier(issuer=ISSUER, leeway_seconds=5, jwks=HttpJwks(url, http))
        await verifier.refresh()
        retired = ring.signing_key
        old = issue(ring, subject="k", issuer=ISSUER, now=time.time()).token
        ring.rotate(SigningKey.generate())
        ring.remove(retired.kid)  # the gateway retired it; nobody sends the new key's tokens
        reading = asyncio.create_task(verifier.refresh_forever(interval_seconds=0.01))
        try:  # a periodic read is done once the next one has begun
            async with asyncio.timeout(30):
                while len(fetches) < 3:
                    fetches.made.clear()
                    await fetches.made.wait()
        finally:
            reading.cancel()
        with pytest.raises(UnknownKid):
            await verifier.verify(old)


async def test_agents_read_the_keys_the_gateways_publish_in_ssm(aws: AwsEmulator) -> None:
    """In AWS the public keys do not cross the internet: an IAM-guarded parameter holds them."""
    ring = KeyRing([SigningKey.generate()])
    settings = GatewaySettings(shared=aws.settings(), jwks_parameter="/spotgate/gateway-jwks")
    await publish_jwks(settings, ring)
    verifier = TokenVerifier(
        issuer=ISSUER,
        leeway_seconds=5,
        jwks=SsmJwks("/spotgate/gateway-jwks", aws.settings().aws),
        refresh_min_seconds=0,
    )
    assert await verifier.refresh()
    old = issue(ring, subject="k", issuer=ISSUER, now=time.time()).token
    assert (await verifier.verify(old)).sub == "k"

    retired = ring.signing_key
    ring.rotate(SigningKey.generate())
    ring.remove(retired.kid)
    await publish_jwks(settings, ring)  # the gateways restarted with the new key only
    new = issue(ring, subject="k2", issuer=ISSUER, now=time.time()).token
    assert (await verifier.verify(new)).sub == "k2"
    with pytest.raises(UnknownKid):
        await verifier.verify(old)


async def test_an_unreadable_parameter_keeps_the_keys_held(aws: AwsEmulator) -> None:
    ring = KeyRing([SigningKey.generate()])
    verifier = TokenVerifier(
        issuer=ISSUER,
        leeway_seconds=5,
        jwks=SsmJwks("/spotgate/never-published", aws.settings().aws),
        pinned_public_key=ring.signing_key.verify_key.to_pem(),
    )
    assert not await verifier.refresh()  # logged, not raised
    token = issue(ring, subject="p", issuer=ISSUER, now=time.time()).token
    assert (await verifier.verify(token)).sub == "p"
