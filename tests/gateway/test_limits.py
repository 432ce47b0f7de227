"""Limits shared through the store, and each replica's own while the store does not answer."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest
from prometheus_client import generate_latest
from pydantic import SecretStr

from gateway.limits import LimitStore, StoreHealth
from gateway.metrics import GatewayMetrics
from gateway.ratelimit import Limits
from gateway.sharedlimits import SharedBuckets
from spotgate.process import free_port
from spotgate.registry import CreatedApiKey, Registry
from spotgate.settings import GatewaySettings, LimitStoreSettings
from spotgate.tokens import SigningKey
from stack.emulator import AwsEmulator
from stack.redis_server import RedisServer
from tests.gateway.conftest import MODEL, Gateway, replicas
from tests.support.agents import AgentFactory, wait_for
from tests.support.clocks import FakeClock
from tests.support.metrics import metric_value
from tests.support.wsclient import connect, generate, receive, run_streams, send

NOW = 1_800_000_000.0
ONE_RPM = Limits(rpm=1)


@pytest.mark.parametrize(
    ("failed_at", "now", "usable"),
    [
        (None, 0.0, True),  # never failed
        (10.0, 10.0, False),  # just failed
        (10.0, 11.9, False),  # inside the retry interval
        (10.0, 12.0, True),  # the interval is over: ask again
    ],
)
def test_a_failed_store_is_asked_again_after_the_retry_interval(
    failed_at: float | None, now: float, usable: bool
) -> None:
    assert StoreHealth(2.0, failed_at).usable(now) is usable


def test_health_reports_transitions_once() -> None:
    health = StoreHealth(2.0)
    assert health.failed("ConnectionError", 1.0)
    assert not health.failed("ConnectionError", 4.0)  # still failing: no new transition
    assert health.answered()
    assert not health.answered()


@pytest.fixture
def own_server() -> Iterator[RedisServer]:
    """A store of this test's own, to stop and pause."""
    server = RedisServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def monotonic() -> FakeClock:
    return FakeClock(0.0)


@pytest.fixture
async def store(own_server: RedisServer, monotonic: FakeClock) -> AsyncIterator[LimitStore]:
    # The store's own timeout (2 s): a shorter one, on a loaded machine, is an outage now and
    # then, and the replica decides alone what the test means the store to decide.
    settings = GatewaySettings(limit_store=own_server.settings())
    async with SharedBuckets.open(settings.limit_store) as shared:
        yield LimitStore(settings, GatewayMetrics(), shared, monotonic)


def metric(store: LimitStore, sample: str) -> float:
    return metric_value(generate_latest(store.metrics.registry).decode(), sample)


def shared_gauge(store: LimitStore) -> float:
    return metric(store, "spotgate_gateway_limits_shared")


def store_errors(store: LimitStore) -> float:
    return metric(store, "spotgate_gateway_limit_store_errors_total")


async def test_without_a_store_each_replica_keeps_its_own_buckets() -> None:
    own = LimitStore(GatewaySettings(), GatewayMetrics())
    assert own.status == "per-replica"
    assert shared_gauge(own) == 0
    assert (await own.admit("k", ONE_RPM, NOW)).admitted
    assert not (await own.admit("k", ONE_RPM, NOW)).admitted


async def test_two_replicas_share_one_budget(store: LimitStore) -> None:
    other = LimitStore(store.settings, GatewayMetrics(), store.shared)
    first = await store.admit("k", ONE_RPM, NOW)
    assert first.admitted
    assert first.lease is not None
    refused = await other.admit("k", ONE_RPM, NOW)
    assert not refused.decision.admitted
    assert refused.decision.reason == "over 1 requests per minute"
    assert store.status == "shared"
    assert shared_gauge(store) == 1


async def test_a_prompt_charged_at_admission_holds_back_other_replicas_until_settled(
    store: LimitStore,
) -> None:
    other = LimitStore(store.settings, GatewayMetrics(), store.shared)
    limits = Limits(tpm=600)
    first = await store.admit("k", limits, NOW, tokens=900)
    assert first.admitted
    assert first.tokens_charged == 900
    refused = await other.admit("k", limits, NOW, tokens=10)
    assert refused.decision.reason == "over 600 tokens per minute"
    await store.finish(first, 100, NOW)  # the agent counted 100: 800 come back
    assert (await other.admit("k", limits, NOW, tokens=10)).admitted


async def test_an_unreachable_store_falls_back_and_recovers_by_itself(
    store: LimitStore, own_server: RedisServer, monotonic: FakeClock
) -> None:
    assert (await store.admit("k", ONE_RPM, NOW)).admitted  # the shared budget is spent
    own_server.stop()

    local = await store.admit("k", ONE_RPM, NOW)
    assert local.admitted  # this replica's own bucket, still full
    assert local.lease is None
    assert store.status == "local"
    assert store.health.error is not None
    assert shared_gauge(store) == 0
    assert not (await store.admit("k", ONE_RPM, NOW)).admitted  # its own bucket is a bucket
    assert store_errors(store) == 1  # inside the retry interval the store is not asked

    own_server.start()  # same port, empty
    await store.finish(local, 0, NOW)  # released where it was admitted: locally
    monotonic.advance(store.settings.limit_store.retry_seconds)
    # The store's new bucket is charged what this replica gave meanwhile: it is spent.
    refused = await store.admit("k", ONE_RPM, NOW)
    assert refused.decision.reason == "over 1 requests per minute"
    assert store.status == "shared"
    assert shared_gauge(store) == 1
    assert (await store.admit("k", ONE_RPM, NOW + 60)).admitted  # a minute on: refilled


async def test_a_restarted_store_answers_the_very_next_call_on_a_fresh_connection(
    store: LimitStore, own_server: RedisServer
) -> None:
    """Pooled connections to the old process fail once each: sent again, not a fallback."""
    limits = Limits(rpm=100)
    admitted = await asyncio.gather(*(store.admit(f"k{n}", limits, NOW) for n in range(5)))
    assert all(admission.lease is not None for admission in admitted)  # five connections
    own_server.stop()
    own_server.start()  # same port, empty
    again = await asyncio.gather(*(store.admit(f"k{n}", limits, NOW) for n in range(5)))
    assert all(admission.lease is not None for admission in again)
    assert store.status == "shared"
    assert store_errors(store) == 0


async def test_what_each_replica_gave_alone_is_charged_once_the_store_is_back(
    store: LimitStore, own_server: RedisServer, monotonic: FakeClock
) -> None:
    """Three replicas, an outage, a restart: the key's budget is what it really used."""
    rpm = 10
    limits = Limits(rpm=rpm)
    replicas = [store] + [
        LimitStore(store.settings, GatewayMetrics(), store.shared, monotonic) for _ in range(2)
    ]
    own_server.stop()
    during = [await replica.admit("k", limits, NOW) for replica in replicas for _ in range(rpm)]
    assert all(admission.admitted and admission.lease is None for admission in during)
    own_server.start()  # same port, empty
    monotonic.advance(store.settings.limit_store.retry_seconds)
    after = [await replica.admit("k", limits, NOW) for replica in replicas]
    assert not any(admission.admitted for admission in after)
    assert {replica.status for replica in replicas} == {"shared"}
    # 30 given against a budget of 10: the bucket owes 20 and takes 2.1 minutes to refill.
    assert after[-1].decision.retry_after == pytest.approx((1 + 2 * rpm) * 60 / rpm)


async def test_a_store_that_hangs_costs_one_timeout_then_is_not_waited_on(
    store: LimitStore, own_server: RedisServer
) -> None:
    own_server.pause()
    try:
        assert (await store.auth_check("10.0.0.1", "key", NOW)).admitted
        assert "Timeout" in (store.health.error or "")
        for _ in range(store.settings.failed_auth_per_client_per_minute):
            await store.auth_failed("10.0.0.1", None, NOW)
            assert (await store.admit("k", ONE_RPM, NOW)).lease is None
        assert store_errors(store) == 1  # the rest were decided here, without asking
        assert store.failed_auth.tracked == 1
        assert not (await store.auth_check("10.0.0.1", None, NOW)).admitted
    finally:
        own_server.resume()


async def statuses(
    http: aiohttp.ClientSession, gateways: list[Gateway], api_key: str, requests: int
) -> list[int]:
    """Send `requests` one-token completions, one after another, round robin over `gateways`."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 1}
    headers = {"Authorization": f"Bearer {api_key}"}
    seen = []
    for index in range(requests):
        url = f"{gateways[index % len(gateways)].url}/v1/chat/completions"
        async with http.post(url, json=body, headers=headers) as response:
            seen.append(response.status)
    return seen


RPM = 12


@pytest.mark.parametrize(
    ("count", "shared", "admitted"),
    [
        (1, True, (RPM, RPM // 2)),
        (3, True, (RPM, RPM // 2)),  # the same: one budget, whichever replica is asked
        (3, False, (3 * RPM, 3 * RPM // 2)),  # what each replica's own buckets would allow
    ],
)
async def test_a_key_at_its_rpm_limit_is_refused_at_the_same_rate_through_any_replicas(
    aws: AwsEmulator,
    gateway_key: SigningKey,
    start_agent: AgentFactory,
    limit_store: LimitStoreSettings,
    clock: FakeClock,
    count: int,
    shared: bool,
    admitted: tuple[int, int],
) -> None:
    store = limit_store if shared else LimitStoreSettings()
    async with Registry.open(aws.settings()) as registry:
        key = await registry.create_key("busy", rpm=RPM)
    async with (
        replicas(
            aws, gateway_key, count, start_agent, clock=clock, models=(MODEL,), limit_store=store
        ) as gateways,
        aiohttp.ClientSession() as http,
    ):
        burst = await statuses(http, gateways, key.api_key, 4 * RPM)
        clock.advance(30)  # half a minute: half the budget back
        later = await statuses(http, gateways, key.api_key, 4 * RPM)
    assert set(burst + later) == {200, 429}
    assert (burst.count(200), later.count(200)) == admitted


async def test_concurrent_streams_and_failed_auth_budgets_hold_across_replicas(
    aws: AwsEmulator,
    gateway_key: SigningKey,
    start_agent: AgentFactory,
    limit_store: LimitStoreSettings,
    api_key: CreatedApiKey,
) -> None:
    async with replicas(
        aws,
        gateway_key,
        3,
        start_agent,
        models=(MODEL,),
        limit_store=limit_store,
        max_streams_per_key=2,
    ) as gateways:
        first, second, third = gateways
        long = {"max_tokens": 1_000}  # 50 s at this agent's pace: still running at the end
        async with (
            connect(first.ws_url, api_key.api_key) as one,
            connect(second.ws_url, api_key.api_key) as two,
            connect(third.ws_url, api_key.api_key) as three,
        ):
            await send(one, generate("a", MODEL, **long))
            await send(two, generate("b", MODEL, **long))
            for ws in (one, two):
                assert (await receive(ws))["type"] == "start"
            refused = (await run_streams(three, generate("c", MODEL, **long)))["c"][-1]
        assert refused["code"] == "rate_limited"
        assert refused["message"] == "at most 2 concurrent streams"

        per_client = first.state.settings.failed_auth_per_client_per_minute
        async with aiohttp.ClientSession() as http:
            wrong = {"Authorization": "Bearer not-a-key"}
            answers = []
            for index in range(per_client + 1):
                url = f"{gateways[index % 3].url}/v1/chat/completions"
                async with http.post(url, headers=wrong, json={}) as response:
                    answers.append(response.status)
        assert answers == [401] * per_client + [429]  # one budget over the three replicas
        for gateway in gateways:
            assert gateway.state.limits.status == "shared"


async def test_a_keys_own_concurrency_holds_across_replicas_beside_the_default(
    aws: AwsEmulator,
    gateway_key: SigningKey,
    start_agent: AgentFactory,
    limit_store: LimitStoreSettings,
) -> None:
    """`spotgate keys create --max-streams 2`: two at once over every replica; others: 64."""
    async with Registry.open(aws.settings()) as registry:
        narrow = await registry.create_key("narrow", max_streams=2)
        wide = await registry.create_key("wide")
    long = {"max_tokens": 1_000}  # 50 s at this agent's pace: still running at the end
    async with replicas(
        aws, gateway_key, 3, start_agent, models=(MODEL,), limit_store=limit_store
    ) as gateways:
        ends = {}
        for key in (narrow, wide):
            async with contextlib.AsyncExitStack() as sockets:
                opened = [
                    await sockets.enter_async_context(connect(gateway.ws_url, key.api_key))
                    for gateway in gateways
                ]
                for index, ws in enumerate(opened[:2]):
                    await send(ws, generate(f"s{index}", MODEL, **long))
                    assert (await receive(ws))["type"] == "start"
                third = await run_streams(opened[2], generate("s2", MODEL, max_tokens=3))
                ends[key.record.name] = third["s2"][-1]
    assert ends["narrow"]["code"] == "rate_limited"
    assert ends["narrow"]["message"] == "at most 2 concurrent streams"
    assert ends["wide"]["type"] == "done"


async def test_a_cluster_endpoint_nobody_answers_falls_back_too() -> None:
    """No node of a cluster-mode endpoint reachable is not a `RedisError`: still a fallback."""
    nowhere = LimitStoreSettings(url=SecretStr(f"redis://127.0.0.1:{free_port()}"), cluster=True)
    settings = GatewaySettings(limit_store=nowhere)
    async with SharedBuckets.open(settings.limit_store) as shared:
        store = LimitStore(settings, GatewayMetrics(), shared)
        assert (await store.auth_check("10.0.0.1", "k", NOW)).admitted
        assert (await store.admit("k", ONE_RPM, NOW)).admitted
    assert store.status == "local"
    assert store.health.error == "RedisClusterException"  # the class only, no host names


async def test_a_slot_goes_back_to_the_store_even_inside_the_retry_interval(
    store: LimitStore,
) -> None:
    one = Limits(max_concurrent=1)
    held = await store.admit("k", one, NOW)
    assert held.lease is not None
    store.health.failed("TimeoutError", store.monotonic())  # a blip, just now
    await store.finish(held, 0, NOW)  # asked all the same: the store holds the slot
    assert store.status == "shared"
    assert (await store.admit("k", one, NOW)).lease is not None  # the slot is free again


async def test_a_store_restarted_under_load_holds_the_keys_rpm_from_the_moment_it_is_shared(
    aws: AwsEmulator,
    gateway_key: SigningKey,
    start_agent: AgentFactory,
    own_server: RedisServer,
    clock: FakeClock,
) -> None:
    """Three replicas: what they gave alone is charged back before they say `shared` again."""
    async with Registry.open(aws.settings()) as registry:
        key = await registry.create_key("busy", rpm=RPM)
    store = own_server.settings()
    async with (
        replicas(
            aws, gateway_key, 3, start_agent, clock=clock, models=(MODEL,), limit_store=store
        ) as gateways,
        aiohttp.ClientSession() as http,
    ):
        before = await statuses(http, gateways, key.api_key, 2 * RPM)
        own_server.stop()
        during = await statuses(http, gateways, key.api_key, 2 * RPM)
        own_server.start()  # same port, empty

        async def all_shared() -> bool:
            return all(gateway.state.limits.status == "shared" for gateway in gateways)

        await wait_for(all_shared)
        after = await statuses(http, gateways, key.api_key, 2 * RPM)
        clock.advance(60)  # a minute on: the key still owes what the outage gave it
        owing = await statuses(http, gateways, key.api_key, RPM)
        clock.advance(120)  # paid back, and refilled
        later = await statuses(http, gateways, key.api_key, 2 * RPM)
    assert before.count(200) == RPM
    assert during.count(200) == 2 * RPM  # each replica alone: its own bucket
    assert after.count(200) == 0
    assert owing.count(200) == 0
    assert later.count(200) == RPM
    # Over the three minutes the key got what its rpm allows: a full bucket and three refills.
    got = before.count(200) + during.count(200) + later.count(200)
    assert got == RPM + 3 * RPM
