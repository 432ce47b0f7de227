"""One pool over two regions of moto's server: an EC2 client each, one pure policy."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import pytest
from botocore.exceptions import EndpointConnectionError

from pool_manager.controller import PassReport, PoolController
from pool_manager.ec2_provider import Ec2Provider
from pool_manager.pool_view import Launch, PlacementOption, PolicySettings
from pool_manager.provider import CapacityRefused, ProviderError
from pool_manager.regional_provider import RegionalProvider
from spotgate.registry import Registry
from spotgate.settings import Ec2PoolSettings, PoolSettings, SharedSettings
from stack.emulator import AwsEmulator
from tests.pool_manager.test_ec2_provider import (
    GPU_TYPE,
    POOL,
    TEMPLATE,
    WrappedClient,
    create_network,
    no_spot_capacity,
)
from tests.support.clocks import FakeClock

MODEL = "m"
EAST, WEST = "us-east-1", "us-west-2"
ZONES = {EAST: ("us-east-1a", "us-east-1b"), WEST: ("us-west-2a", "us-west-2b")}
# Spot is cheaper in the east: the policy tries there first.
PLACEMENTS = tuple(
    PlacementOption(GPU_TYPE, zone, 0.3 if region == EAST else 0.5, 1.0)
    for region, zones in ZONES.items()
    for zone in zones
)
SETTINGS = PolicySettings(
    placements=PLACEMENTS,
    min_agents=2,
    max_agents=8,
    spot_overprovision=0,
    on_demand_fallback=False,
    on_demand_hold_seconds=0,
)


class Region:
    """What a test does to one region's EC2: refuse spot, or stop answering at all."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.spot_refused = False
        self.unreachable = False

    def _unreachable(self) -> EndpointConnectionError:
        return EndpointConnectionError(endpoint_url=f"https://ec2.{self.name}.amazonaws.com/")

    def wrap(self, client: Any) -> Any:
        """The region's real client, answering as AWS does when capacity or the API is gone."""
        region = self

        class Paginator:
            def __init__(self, name: str) -> None:
                self._real = client.get_paginator(name)

            async def paginate(self, **request: Any) -> AsyncIterator[Any]:
                if region.unreachable:
                    raise region._unreachable()
                async for page in self._real.paginate(**request):
                    yield page

        async def create_fleet(**request: Any) -> Any:
            if region.unreachable:
                raise region._unreachable()
            if region.spot_refused:
                return no_spot_capacity(request)
            return await client.create_fleet(**request)

        return WrappedClient(client, create_fleet=create_fleet, get_paginator=Paginator)


@pytest.fixture
def clock() -> FakeClock:
    """At the emulator's time: it dates each instance's launch by the wall clock."""
    return FakeClock(time.time())


@pytest.fixture
def regions() -> dict[str, Region]:
    return {name: Region(name) for name in ZONES}


@asynccontextmanager
async def regional_provider(
    shared: SharedSettings, regions: dict[str, Region], clock: FakeClock
) -> AsyncIterator[RegionalProvider]:
    """An `Ec2Provider` per region (each with its own network and template) under one."""
    subnets: dict[str, str] = {}
    for name in regions:
        subnets |= (await create_network(shared.in_region(name), ZONES[name])).subnets
    settings = PoolSettings(
        shared=shared,
        provider="ec2",
        regions=tuple(regions),
        ec2=Ec2PoolSettings(pool_name=POOL, launch_template=TEMPLATE, subnets=subnets),
    )
    async with AsyncExitStack() as stack:
        providers = {
            name: await stack.enter_async_context(
                Ec2Provider.open(
                    shared.in_region(name), settings, clock=clock, wrap_client=region.wrap
                )
            )
            for name, region in regions.items()
        }
        yield RegionalProvider(providers)


@pytest.fixture
async def pool(
    aws: AwsEmulator, regions: dict[str, Region], clock: FakeClock
) -> AsyncIterator[RegionalProvider]:
    async with regional_provider(aws.settings(), regions, clock) as provider:
        yield provider


def controller_of(registry: Registry, pool: RegionalProvider, clock: FakeClock) -> PoolController:
    return PoolController(
        registry=registry, provider=pool, settings=SETTINGS, models=(MODEL,), clock=clock
    )


def launched_zones(report: PassReport) -> list[str]:
    return sorted(action.zone for action in report.actions if isinstance(action, Launch))


async def test_a_region_with_no_spot_left_is_filled_from_the_other(
    registry: Registry, pool: RegionalProvider, regions: dict[str, Region], clock: FakeClock
) -> None:
    regions[EAST].spot_refused = True

    report = await controller_of(registry, pool, clock).reconcile()

    # Both eastern zones refused (tried first: cheaper), then the west took the target.
    assert sorted(launch.zone for launch in report.refused) == list(ZONES[EAST])
    assert launched_zones(report) == list(ZONES[WEST])
    instances = await pool.instances()
    assert sorted(i.zone for i in instances) == list(ZONES[WEST])
    # Each agent's id is its instance's ARN, in the region it runs in.
    assert all(i.agent_id.startswith(f"arn:aws:ec2:{WEST}:") for i in instances)
    assert pool.failing == {}


async def test_a_region_whose_api_fails_keeps_its_instances_and_the_others_take_the_launches(
    registry: Registry, pool: RegionalProvider, regions: dict[str, Region], clock: FakeClock
) -> None:
    controller = controller_of(registry, pool, clock)
    first = await controller.reconcile()
    assert launched_zones(first) == ["us-east-1a", "us-east-1b"]  # the cheaper region

    regions[EAST].unreachable = True
    await registry.set_pool_target(MODEL, 4)
    clock.advance(10)
    second = await controller.reconcile()

    # The east's instances are not taken for gone (no replacement for them): its last listing
    # stands, and the two more agents asked for are launched in the west.
    assert set(pool.failing) == {EAST}
    assert "EndpointConnectionError" in pool.failing[EAST] or "connect" in pool.failing[EAST]
    assert launched_zones(second) == list(ZONES[WEST])
    assert sorted(i.zone for i in await pool.instances()) == sorted([*ZONES[EAST], *ZONES[WEST]])
    with pytest.raises(CapacityRefused, match=f"{EAST}'s API is failing"):
        await pool.launch(MODEL, Launch(GPU_TYPE, "us-east-1a", "spot"))

    regions[EAST].unreachable = False
    clock.advance(10)
    third = await controller.reconcile()
    assert pool.failing == {}
    assert launched_zones(third) == []  # the pool is at its target: nothing lost, nothing twice
    assert len(await pool.instances()) == 4


async def test_a_zone_outside_the_pools_regions_is_refused_naming_them(
    pool: RegionalProvider,
) -> None:
    with pytest.raises(ProviderError, match=r"eu-west-1a is in eu-west-1, not in the pool's"):
        await pool.launch(MODEL, Launch(GPU_TYPE, "eu-west-1a", "spot"))


def test_a_regional_provider_needs_a_region() -> None:
    with pytest.raises(ValueError, match="at least one region"):
        RegionalProvider({})
