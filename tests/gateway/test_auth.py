from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from gateway.auth import (
    KEY_CACHE_SECONDS,
    KEY_FRESH_SECONDS,
    KEY_STALE_MAX_SECONDS,
    Authenticator,
    principal_of,
)
from spotgate.admission import Grant
from spotgate.protocol import ErrorCode
from spotgate.registry import ApiKeyRecord, Registry
from spotgate.tokens import KeyRing, SigningKey, issue
from spotgate.wsserver import AuthRefused, AuthUnavailable
from stack.emulator import AwsEmulator
from tests.support.clocks import FakeClock

ISSUER = "http://gw"


def authenticator(
    registry: Registry, clock: Callable[[], float], ring: KeyRing | None = None
) -> Authenticator:
    """An authenticator as a gateway makes one (5 s leeway, 64 streams per key), on `clock`."""
    ring = ring if ring is not None else KeyRing([SigningKey.generate()])
    return Authenticator(registry, ring, ISSUER, 5.0, 64, clock=clock)


class CountingRegistry(Registry):
    """The real registry, counting key reads."""

    reads = 0

    async def verify_key(self, api_key: str) -> ApiKeyRecord:
        self.reads += 1
        return await super().verify_key(api_key)


async def test_a_burst_of_new_connections_shares_one_key_read(aws: AwsEmulator) -> None:
    async with CountingRegistry.open(aws.settings()) as registry:
        await registry.create_tables()
        created = await registry.create_key("burst")
        auth = authenticator(registry, time.time)

        principals = await asyncio.gather(*(auth.authenticate(created.api_key) for _ in range(50)))

        assert {p.key_id for p in principals} == {created.record.key_id}
        assert registry.reads == 1
        with pytest.raises(AuthRefused, match="invalid API key"):
            await auth.authenticate(created.api_key[:-2] + "zz")
        assert registry.reads == 2


async def test_a_busy_key_is_refreshed_ahead_and_a_disabled_key_stops_within_the_cache_time(
    aws: AwsEmulator,
) -> None:
    clock = FakeClock()
    async with CountingRegistry.open(aws.settings()) as registry:
        await registry.create_tables()
        created = await registry.create_key("busy")
        auth = authenticator(registry, clock)
        await auth.authenticate(created.api_key)
        assert registry.reads == 1

        # Past the fresh time: answered from the cache at once, and re-read behind it.
        clock.advance(KEY_FRESH_SECONDS + 1)
        await registry.disable_key(created.record.key_id)
        principal = await auth.authenticate(created.api_key)
        assert principal.key_id == created.record.key_id
        await auth.settled()
        assert registry.reads == 2

        with pytest.raises(AuthRefused, match="disabled"):
            await auth.authenticate(created.api_key)


async def test_registry_outage_serves_recent_keys_and_answers_503_for_unchecked_ones(
    aws: AwsEmulator,
) -> None:
    clock = FakeClock()
    async with CountingRegistry.open(aws.settings()) as registry:
        await registry.create_tables()
        known = await registry.create_key("known")
        unchecked = await registry.create_key("unchecked")
        auth = authenticator(registry, clock)
        await auth.authenticate(known.api_key)
        aws.stop()
        try:
            clock.advance(KEY_CACHE_SECONDS + 1)  # past the cache: a read is tried, and fails
            principal = await auth.authenticate(known.api_key)
            with pytest.raises(AuthUnavailable) as refused:
                await auth.authenticate(unchecked.api_key)
        finally:
            aws.start()
    assert principal.key_id == known.record.key_id
    assert refused.value.code == ErrorCode.NO_CAPACITY
    assert refused.value.retry_after is not None


async def test_a_socket_open_before_its_key_was_disabled_loses_it_within_the_cache_time(
    aws: AwsEmulator,
) -> None:
    clock = FakeClock()
    ring = KeyRing([SigningKey.generate()])
    async with Registry.open(aws.settings()) as registry:
        await registry.create_tables()
        created = await registry.create_key("socket")
        auth = authenticator(registry, clock, ring)
        token = issue(ring, subject=created.record.key_id, issuer=ISSUER, now=clock.now)
        by_key = await auth.authenticate(created.api_key)
        by_token = await auth.authenticate(token.token)
        assert await auth.revoked(by_key) is None
        await registry.disable_key(created.record.key_id)

        assert await auth.revoked(by_key) is None  # within the cache time
        clock.advance(KEY_CACHE_SECONDS + 1)
        for principal in (by_key, by_token):
            assert await auth.revoked(principal) == "this API key was disabled or deleted"


async def test_while_the_registry_cannot_answer_an_open_socket_keeps_its_key(
    aws: AwsEmulator,
) -> None:
    clock = FakeClock()
    async with Registry.open(aws.settings()) as registry:
        await registry.create_tables()
        created = await registry.create_key("socket")
        auth = authenticator(registry, clock)
        principal = await auth.authenticate(created.api_key)
        aws.stop()
        try:
            clock.advance(KEY_STALE_MAX_SECONDS + 1)  # nothing cached is usable any more
            assert await auth.revoked(principal) is None
        finally:
            aws.start()


class StallingRegistry(Registry):
    """The real registry, whose key reads can be held up."""

    stall = False
    stalled = asyncio.Event()
    cancelled = asyncio.Event()

    async def verify_key(self, api_key: str) -> ApiKeyRecord:
        if self.stall:
            self.stalled.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
        return await super().verify_key(api_key)


async def test_close_cancels_a_background_refresh_before_the_registry_closes(
    aws: AwsEmulator,
) -> None:
    clock = FakeClock()
    async with StallingRegistry.open(aws.settings()) as registry:
        await registry.create_tables()
        created = await registry.create_key("refreshing")
        auth = authenticator(registry, clock)
        await auth.api_key(created.api_key)
        registry.stall = True
        clock.advance(KEY_FRESH_SECONDS)  # the next use refreshes ahead, in the background
        assert (await auth.api_key(created.api_key)).key_id == created.record.key_id
        await registry.stalled.wait()
        await auth.close()
        assert registry.cancelled.is_set()


def test_a_principal_grants_its_keys_models_and_max_tokens_and_its_tokens_expiry() -> None:
    record = ApiKeyRecord(key_id="k", name="ci", models=frozenset({"m"}), max_tokens=8)
    assert principal_of(record, 4).grant == Grant(frozenset({"m"}), 8, None)
    assert principal_of(record, 4, expires_at=1234.0).grant == Grant(frozenset({"m"}), 8, 1234.0)
