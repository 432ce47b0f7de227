"""Fair turns across replicas: the rule, and two replicas sharing one agent through the store."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import openai
import pytest

from gateway.fair_queue import Waiter
from gateway.fair_share import (
    FairShare,
    TenantLoad,
    decode_loads,
    encode_loads,
    holds_back,
    summed,
    waiting_elsewhere,
)
from spotgate.registry import AgentState, CreatedApiKey
from spotgate.settings import LimitStoreSettings, QueueSettings
from spotgate.tokens import SigningKey
from stack.emulator import AwsEmulator
from tests.gateway.conftest import MODEL, Gateway, running_gateway
from tests.gateway.test_batches import interactive_beside_flex
from tests.support.agents import AgentFactory, synthetic, wait_for, wait_ready

HEAVY, LIGHT, OTHER = "heavy", "light", "other"


@pytest.mark.parametrize(
    ("loads", "held"),
    [
        ({HEAVY: TenantLoad(10, 4)}, False),  # alone: nobody to let go to
        ({HEAVY: TenantLoad(10, 4), LIGHT: TenantLoad(1, 1)}, True),  # 6 run, light's 0 wait
        ({HEAVY: TenantLoad(10, 4), LIGHT: TenantLoad(1, 0)}, False),  # light waits no more
        ({HEAVY: TenantLoad(10, 4), LIGHT: TenantLoad(8, 1)}, False),  # light runs more
        # a slot just freed: neither runs, the lighter goes first and the heavier waits
        ({HEAVY: TenantLoad(10, 10), LIGHT: TenantLoad(1, 1)}, True),
        ({HEAVY: TenantLoad(1, 1), LIGHT: TenantLoad(1, 1)}, False),  # alike: both try
        # weights: 6 running of weight 3 are 2 a weight, against light's 2
        ({HEAVY: TenantLoad(9, 3, 3.0), LIGHT: TenantLoad(3, 1)}, False),
        ({HEAVY: TenantLoad(10, 3, 3.0), LIGHT: TenantLoad(3, 1)}, True),
        ({}, False),
    ],
)
def test_a_tenant_lets_a_slot_go_to_a_waiting_one_that_runs_fewer_for_its_weight(
    loads: dict[str, TenantLoad], held: bool
) -> None:
    assert holds_back(HEAVY, loads) is held
    if held:  # never both: one of any two goes
        assert not holds_back(LIGHT, loads)


def test_loads_travel_as_the_store_keeps_them_and_add_up_over_replicas() -> None:
    loads = {HEAVY: TenantLoad(3, 1, 2.0), LIGHT: TenantLoad(1, 1)}
    assert decode_loads(encode_loads(loads)) == loads
    assert decode_loads("not json") == decode_loads("[1]") == decode_loads('{"x": 1}') == {}
    other = {HEAVY: TenantLoad(2, 2), OTHER: TenantLoad(1, 0)}
    assert summed([loads, other]) == {
        HEAVY: TenantLoad(5, 3, 2.0),
        LIGHT: TenantLoad(1, 1),
        OTHER: TenantLoad(1, 0),
    }


def test_a_replica_counts_its_open_and_waiting_interactive_streams_per_model() -> None:
    share = FairShare()
    for _ in range(3):
        share.opened(MODEL, HEAVY)
    share.opened(MODEL, LIGHT)
    share.closed(MODEL, LIGHT)
    waiting = {MODEL: [Waiter(False, tenant=HEAVY), Waiter(False, flex=True, tenant=HEAVY)]}
    assert share.local(waiting, {HEAVY: 2.0}) == {MODEL: {HEAVY: TenantLoad(3, 1, 2.0)}}


STREAMS = 12
QUEUE = QueueSettings(max_pending_per_model=2 * STREAMS, deadline_seconds=60.0)
STREAM_TOKENS = 10  # half a second each at 20 tokens/s


@pytest.fixture
async def two_replicas(
    aws: AwsEmulator,
    gateway_key: SigningKey,
    limit_store: LimitStoreSettings,
    start_agent: AgentFactory,
) -> AsyncIterator[tuple[Gateway, Gateway]]:
    """Two replicas sharing a limit store, and one agent that runs one stream at a time."""
    async with contextlib.AsyncExitStack() as stack:
        shared: dict[str, Any] = {"limit_store": limit_store, "queue": QUEUE}
        first = await stack.enter_async_context(running_gateway(aws, gateway_key, **shared))
        second = await stack.enter_async_context(
            running_gateway(aws, gateway_key, token_issuer=first.url, **shared)
        )
        engine = synthetic(20.0, model=MODEL, ttft_seconds=0.01, capacity=1)
        agent = await wait_ready(
            await start_agent(
                engine, pinned_public_key=gateway_key.verify_key.to_pem(), token_issuer=first.url
            )
        )
        agent_id = agent.runtime.identity.agent_id  # type: ignore[union-attr]

        async def routable_on_both() -> bool:
            records = [g.state.dispatcher.view.record(agent_id) for g in (first, second)]
            return all(r is not None and r.state is AgentState.READY for r in records)

        await wait_for(routable_on_both)
        yield first, second


async def test_a_tenant_on_another_replica_gets_a_turn_before_a_backlog_held_elsewhere_drains(
    two_replicas: tuple[Gateway, Gateway],
    api_key: CreatedApiKey,
    openai_client: Callable[..., openai.AsyncOpenAI],
) -> None:
    first, second = two_replicas
    light_key = await first.state.registry.create_key("light")
    finished: list[str] = []

    async def chat(gateway: Gateway, key: str, name: str) -> None:
        client = openai_client(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0)
        await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": name}],
            max_tokens=STREAM_TOKENS,
        )
        finished.append(name)

    # One tenant's backlog, all on the first replica (as one websocket would carry it).
    heavy = [
        asyncio.create_task(chat(first, api_key.api_key, f"heavy {n}")) for n in range(STREAMS)
    ]

    async def backlog_queued() -> bool:
        return first.state.dispatcher.waiting(MODEL) >= STREAMS - 2

    await wait_for(backlog_queued)
    await chat(second, light_key.api_key, "light")
    await asyncio.gather(*heavy)

    # Served within a few of the backlog's turns, not behind all of them.
    assert finished.index("light") <= STREAMS // 2, finished


def test_models_with_interactive_streams_waiting_on_other_replicas() -> None:
    others = {
        "a": {HEAVY: TenantLoad(3, 0)},
        "b": {HEAVY: TenantLoad(3, 0), LIGHT: TenantLoad(1, 1)},
    }
    assert waiting_elsewhere(others) == ["b"]


async def test_an_interactive_stream_on_one_replica_stops_a_flex_stream_running_on_another(
    two_replicas: tuple[Gateway, Gateway],
    api_key: CreatedApiKey,
    openai_client: Callable[..., openai.AsyncOpenAI],
) -> None:
    first, second = two_replicas
    flex_client = openai_client(base_url=f"{second.url}/v1", api_key=api_key.api_key)
    client = openai_client(base_url=f"{first.url}/v1", api_key=api_key.api_key)

    await interactive_beside_flex(flex_client, client, second)
    assert second.state.metrics.preemptions._value.get() >= 1


def test_only_tenants_waiting_on_other_replicas_hold_a_stream_back_and_never_for_long() -> None:
    share = FairShare(others={MODEL: {LIGHT: TenantLoad(1, 1)}})
    share.opened(MODEL, HEAVY)
    share.opened(MODEL, HEAVY)
    share.opened(MODEL, OTHER)
    heavy, other = Waiter(False, tenant=HEAVY), Waiter(False, tenant=OTHER)
    waiting = {MODEL: [heavy, other]}  # `other`, lighter, waits here: the fair queue's turn

    def held(waiter: Waiter, now: float, **kind: bool) -> bool:
        arguments = {"under_way": False, "flex": False, **kind}
        return share.held(MODEL, waiter.tenant, waiting, {}, waiter=waiter, now=now, **arguments)

    assert held(heavy, now=100.0)  # light waits on another replica and runs none
    assert held(heavy, now=101.9)
    assert not held(heavy, now=102.0)  # held long enough: it takes the slot
    assert not held(Waiter(True, tenant=HEAVY), now=100.0, under_way=True)  # mid-reply
    assert held(Waiter(False, flex=True, tenant=HEAVY), now=100.0, flex=True)
    assert not FairShare().held(MODEL, HEAVY, waiting, {}, under_way=False, flex=False,
                                waiter=None, now=0.0)  # fmt: skip
    assert not holds_back(HEAVY, {HEAVY: TenantLoad(2, 1), OTHER: TenantLoad(1, 1)}, waiting={})
