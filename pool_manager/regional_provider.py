"""One provider over several regions: each call goes to the region of its zone or instance.

The policy places in zones, and a zone's name says its region (`spotgate.regions.zone_region`),
so a pool spans regions with no change to the policy: this provider sends each launch to its
region's provider (an EC2 client each) and merges what they list.

A region whose API fails degrades to the others and never stalls the pass. Its listing is
the last it gave, so none of its instances is taken for gone and replaced (nor one of its
warm pool forgotten); until it answers a listing again, a launch into it is refused as for
capacity, so the policy places in another region. A region that never answered lists
nothing: its instances, once it answers, are the pool's again (a surplus is drained as any).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TypeVar

from pool_manager.pool_view import Launch, PlacementKey
from pool_manager.provider import (
    CapacityRefused,
    Instance,
    Provider,
    ProviderError,
    StoppedInstance,
)
from spotgate.logging import get_logger
from spotgate.regions import zone_region

log = get_logger(__name__)

T = TypeVar("T")

REGION_LISTING_SECONDS_MAX = 30.0
"""How long one region's listing may take before the pass goes on with its last one: EC2's
client retries a connection three times, 5 s each, before it gives up on its own."""


class RegionalProvider:
    """`Provider` over one provider per region, each call sent to the region it concerns."""

    def __init__(self, providers: Mapping[str, Provider]) -> None:
        if not providers:
            raise ValueError("a regional provider needs at least one region")
        self._providers = dict(providers)
        self._running: dict[str, list[Instance]] = {region: [] for region in providers}
        self._stopped: dict[str, list[StoppedInstance]] = {region: [] for region in providers}
        self._region_of: dict[str, str] = {}  # instance id → its region
        self.failing: dict[str, str] = {}
        """Region → why its API failed, while it has not answered a listing since."""

    @property
    def regions(self) -> tuple[str, ...]:
        """The regions the pool places in."""
        return tuple(self._providers)

    def _region_of_zone(self, zone: str) -> str:
        region = zone_region(zone)
        if region not in self._providers:
            raise ProviderError(
                f"zone {zone} is in {region}, not in the pool's regions "
                f"({', '.join(self._providers)})"
            )
        return region

    def _provider_of(self, instance_id: str) -> Provider:
        region = self._region_of.get(instance_id)
        if region is None:
            raise ProviderError(f"instance {instance_id} is in none of the regions listed")
        return self._providers[region]

    def _failed(self, region: str, error: str) -> None:
        if region not in self.failing:
            log.warning("region's API failed; placing in the others", region=region, error=error)
        self.failing[region] = error

    async def _listing(
        self, read: Callable[[Provider], Awaitable[list[T]]], last: dict[str, list[T]]
    ) -> list[T]:
        """Every region's listing, read at once; a failing region's is its last."""

        async def one(region: str) -> None:
            try:
                async with asyncio.timeout(REGION_LISTING_SECONDS_MAX):
                    last[region] = await read(self._providers[region])
            except ProviderError as err:
                self._failed(region, str(err))
            except TimeoutError:
                self._failed(region, f"no listing within {REGION_LISTING_SECONDS_MAX:.0f} s")
            else:
                if self.failing.pop(region, None) is not None:
                    log.info("region's API answers again", region=region)

        await asyncio.gather(*(one(region) for region in self._providers))
        return [item for region in self._providers for item in last[region]]

    async def launch(self, model: str, launch: Launch) -> Instance:
        """Launch in the placement's region; refused as for capacity while that one fails."""
        region = self._region_of_zone(launch.zone)
        if region in self.failing:
            raise CapacityRefused(launch, f"{region}'s API is failing: {self.failing[region]}")
        try:
            instance = await self._providers[region].launch(model, launch)
        except CapacityRefused:
            raise
        except ProviderError as err:
            self._failed(region, str(err))
            raise
        self._listed(region, instance)
        return instance

    def _listed(self, region: str, instance: Instance) -> None:
        """Count a launched or started instance in its region's last listing."""
        self._region_of[instance.instance_id] = region
        self._forget(instance.instance_id)
        self._running[region].append(instance)

    def _forget(self, instance_id: str) -> None:
        """Take an instance out of its region's last listings."""
        region = self._region_of.get(instance_id)
        if region is not None:
            self._running[region] = [
                i for i in self._running[region] if i.instance_id != instance_id
            ]
            self._stopped[region] = [
                s for s in self._stopped[region] if s.instance_id != instance_id
            ]

    async def instances(self) -> list[Instance]:
        """Every region's pending and running instances (a failing region's last listed)."""
        listed = await self._listing(lambda provider: provider.instances(), self._running)
        self._region_of.update({i.instance_id: zone_region(i.zone) for i in listed})
        return listed

    async def stopped(self) -> list[StoppedInstance]:
        """Every region's warm pools (a failing region's last listed)."""
        listed = await self._listing(lambda provider: provider.stopped(), self._stopped)
        self._region_of.update({s.instance_id: zone_region(s.zone) for s in listed})
        return listed

    async def terminate(self, instance_id: str) -> None:
        """Terminate it in its region."""
        await self._provider_of(instance_id).terminate(instance_id)
        self._forget(instance_id)
        del self._region_of[instance_id]  # gone for good: the map holds no ended instance

    async def stop(self, instance_id: str) -> None:
        """Stop it in its region (its region's next listing counts it stopped)."""
        await self._provider_of(instance_id).stop(instance_id)
        self._forget(instance_id)

    async def start(self, stopped: StoppedInstance) -> Instance:
        """Start it in its region."""
        region = self._region_of_zone(stopped.zone)
        instance = await self._providers[region].start(stopped)
        self._listed(region, instance)
        return instance

    async def interruption_noticed(self, instance_id: str, deadline: float) -> None:
        """Tell its region's provider."""
        await self._provider_of(instance_id).interruption_noticed(instance_id, deadline)

    async def spot_prices(self, placements: Sequence[PlacementKey]) -> dict[PlacementKey, float]:
        """Each region's prices for its placements; a failing region's are left out."""
        by_region: dict[str, list[PlacementKey]] = {}
        for placement in placements:
            by_region.setdefault(self._region_of_zone(placement[1]), []).append(placement)

        async def one(region: str, wanted: list[PlacementKey]) -> dict[PlacementKey, float]:
            try:
                return await self._providers[region].spot_prices(wanted)
            except ProviderError as err:
                log.warning("spot prices unread in a region", region=region, error=str(err))
                return {}

        answers = await asyncio.gather(*(one(r, wanted) for r, wanted in by_region.items()))
        return {key: price for answer in answers for key, price in answer.items()}
