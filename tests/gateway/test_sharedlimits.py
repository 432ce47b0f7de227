"""The limit store's scripts on a real `redis-server`: the same decisions as one replica's buckets.

Run on a standalone server and on a cluster-mode one (what ElastiCache Serverless speaks).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from redis.asyncio import Redis, RedisCluster

from gateway.authlimit import FailedAuthLimiter
from gateway.ratelimit import Decision, Limits, RateLimiter
from gateway.sharedlimits import SharedBuckets, key_names
from spotgate.settings import LimitStoreSettings
from stack.redis_server import RedisServer
from tests.support.agents import wait_for

NOW = 1_800_000_000.0
LIMITS = (
    Limits(rpm=3),
    Limits(tpm=50),
    Limits(rpm=5, tpm=100, max_concurrent=2),
    Limits(max_concurrent=1),
)


@pytest.fixture(scope="module")
def redis_cluster() -> Iterator[RedisServer]:
    server = RedisServer(cluster=True)
    server.start()
    yield server
    server.stop()


@pytest.fixture(params=["standalone", "cluster"])
def store_settings(request: pytest.FixtureRequest, redis_server: RedisServer) -> LimitStoreSettings:
    server = (
        redis_server if request.param == "standalone" else request.getfixturevalue("redis_cluster")
    )
    return server.settings()


@pytest.fixture
async def buckets(store_settings: LimitStoreSettings) -> AsyncIterator[SharedBuckets]:
    async with SharedBuckets.open(store_settings) as opened:
        yield opened


def same(local: Decision, shared: Decision) -> bool:
    return (
        local.admitted == shared.admitted
        and local.reason == shared.reason
        and shared.retry_after == pytest.approx(local.retry_after, rel=1e-9, abs=1e-9)
    )


@dataclass(frozen=True)
class Admit:
    key: int
    prompt_tokens: int


@dataclass(frozen=True)
class Finish:
    key: int
    tokens: int


@dataclass(frozen=True)
class Advance:
    seconds: float


Step = Admit | Finish | Advance
steps = st.lists(
    st.one_of(
        st.builds(Admit, st.integers(0, len(LIMITS) - 1), st.integers(0, 80)),
        st.builds(Finish, st.integers(0, len(LIMITS) - 1), st.integers(-80, 120)),
        st.builds(Advance, st.floats(0.0, 15.0)),
    ),
    max_size=40,
)


async def replay_rate_limits(settings: LimitStoreSettings, script: list[Step]) -> None:
    local = RateLimiter()
    prefix = secrets.token_hex(4)  # examples share the server: each its own keys
    leases: dict[int, list[str]] = {index: [] for index in range(len(LIMITS))}
    now = NOW
    async with SharedBuckets.open(settings) as shared:
        for step in script:
            if isinstance(step, Advance):
                now += step.seconds
                continue
            key_id, limits = f"{prefix}-{step.key}", LIMITS[step.key]
            if isinstance(step, Admit):
                lease = secrets.token_hex(4)
                expected = local.admit(key_id, limits, now, step.prompt_tokens)
                decided = await shared.admit(key_id, limits, now, lease, step.prompt_tokens)
                assert same(expected, decided), (step, expected, decided)
                if decided.admitted:
                    leases[step.key].append(lease)
            elif leases[step.key]:  # a stream ends only after it was admitted
                local.finish(key_id, step.tokens, now)
                lease = leases[step.key].pop(0)
                await shared.finish(key_id, limits, step.tokens, now, lease)


@hypothesis_settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(script=steps)
def test_rate_limits_decide_as_one_replicas_buckets(
    store_settings: LimitStoreSettings, script: list[Step]
) -> None:
    asyncio.run(replay_rate_limits(store_settings, script))


@dataclass(frozen=True)
class Check:
    client: int
    key: int | None


@dataclass(frozen=True)
class Fail:
    client: int
    key: int | None


AuthStep = Check | Fail | Advance
auth_steps = st.lists(
    st.one_of(
        st.builds(Check, st.integers(0, 1), st.none() | st.integers(0, 1)),
        st.builds(Fail, st.integers(0, 1), st.none() | st.integers(0, 1)),
        st.builds(Advance, st.floats(0.0, 30.0)),
    ),
    max_size=60,
)
PER_CLIENT, PER_KEY = 4, 6


async def replay_failed_auth(settings: LimitStoreSettings, script: list[AuthStep]) -> None:
    local = FailedAuthLimiter(PER_CLIENT, PER_KEY)
    prefix = secrets.token_hex(4)
    now = NOW
    async with SharedBuckets.open(settings) as shared:
        for step in script:
            if isinstance(step, Advance):
                now += step.seconds
                continue
            client = f"{prefix}-10.0.0.{step.client}"
            key_id = None if step.key is None else f"{prefix}-key{step.key}"
            if isinstance(step, Check):
                expected = local.check(client, key_id, now)
                decided = await shared.auth_check(client, key_id, now, PER_CLIENT, PER_KEY)
                assert same(expected, decided), (step, expected, decided)
            else:
                local.failed(client, key_id, now)
                await shared.auth_failed(client, key_id, now, PER_CLIENT, PER_KEY)


@hypothesis_settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(script=auth_steps)
def test_failed_auth_budgets_decide_as_one_replicas_buckets(
    store_settings: LimitStoreSettings, script: list[AuthStep]
) -> None:
    asyncio.run(replay_failed_auth(store_settings, script))


async def test_a_lease_not_renewed_frees_its_slot(
    buckets: SharedBuckets, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The slots of a replica that died come back once their leases lapse."""
    monkeypatch.setattr("gateway.sharedlimits.STREAM_LEASE_SECONDS", 0.3)
    one = Limits(max_concurrent=1)
    assert (await buckets.admit("dead-replica", one, NOW, "orphan")).admitted
    assert not (await buckets.admit("dead-replica", one, NOW, "next")).admitted

    async def slot_free() -> bool:
        return (await buckets.admit("dead-replica", one, NOW, "next")).admitted

    await wait_for(slot_free)


async def test_renewal_moves_a_lease_and_never_brings_back_a_finished_one(
    buckets: SharedBuckets, monkeypatch: pytest.MonkeyPatch
) -> None:
    one = Limits(max_concurrent=1)
    assert (await buckets.admit("live", one, NOW, "held")).admitted
    monkeypatch.setattr("gateway.sharedlimits.STREAM_LEASE_SECONDS", 0.0)
    await buckets.renew({"live": ["held"]})  # renewed to lapse at once
    assert (await buckets.admit("live", one, NOW, "after")).admitted

    await buckets.finish("live", one, 0, NOW, "after")
    monkeypatch.setattr("gateway.sharedlimits.STREAM_LEASE_SECONDS", 60.0)
    await buckets.renew({"live": ["after"]})  # a renewal racing the stream's end
    assert (await buckets.admit("live", one, NOW, "third")).admitted


async def test_idle_buckets_expire_once_they_would_be_full(
    buckets: SharedBuckets, store_settings: LimitStoreSettings
) -> None:
    limits = Limits(rpm=60, tpm=600)
    assert (await buckets.admit("idle", limits, NOW, "lease")).admitted
    await buckets.finish("idle", limits, 300, NOW, "lease")
    rpm_key, tpm_key, streams_key = key_names("idle")
    url = store_settings.url
    assert url is not None
    client = (RedisCluster if store_settings.cluster else Redis).from_url(url.get_secret_value())
    try:
        # One request refills in 1 s, 300 tokens in 30 s: each bucket lives about that long.
        assert 1_000 <= await client.pttl(rpm_key) <= 2_000
        assert 30_000 <= await client.pttl(tpm_key) <= 31_000
        assert await client.exists(streams_key) == 0  # no stream left
    finally:
        await client.aclose()
