"""The policies spotgate's is compared with in the simulator: SpotHedge and three baselines."""

from __future__ import annotations

from dataclasses import dataclass, replace

from pool_manager.placement import (
    cheapest_on_demand,
    live_agents,
    shed_agents,
    spread_spot_launches,
)
from pool_manager.pool_view import (
    Launch,
    PolicySettings,
    PoolAction,
    PoolSnapshot,
)
from pool_manager.warm_pool import without_warm_pool


@dataclass(frozen=True)
class SpotHedge:
    """SpotHedge as the spot traces' README states it, for comparison.

    Target + 1 spot agents spread over zones that have not just failed; max(0, min(target,
    target + 1 - ready spot)) on-demand ones, dropped as soon as spot recovers. The margin is
    `spot_overprovision` (1 there).
    """

    name: str = "spothedge"

    def decide(self, snapshot: PoolSnapshot, settings: PolicySettings) -> list[PoolAction]:
        """Keep target + margin spot; on-demand for each ready spot agent short of that."""
        target = snapshot.target
        spot = live_agents(snapshot.agents, "spot")
        on_demand = live_agents(snapshot.agents, "on-demand")
        spot_goal = target + settings.spot_overprovision if target > 0 else 0
        actions: list[PoolAction] = [*without_warm_pool(snapshot)]
        if len(spot) < spot_goal:
            actions += spread_spot_launches(spot_goal - len(spot), spot, snapshot, settings)
        elif len(spot) > spot_goal:
            actions += shed_agents(spot, len(spot) - spot_goal, "more spot than the target needs")
        ready_spot = sum(1 for a in spot if a.phase == "ready")
        od_goal = max(0, min(target, spot_goal - ready_spot))
        placement = cheapest_on_demand(snapshot, settings)
        if len(on_demand) < od_goal and placement is not None:
            launch = Launch(placement.instance_type, placement.zone, "on-demand")
            actions += [launch] * (od_goal - len(on_demand))
        elif len(on_demand) > od_goal:
            actions += shed_agents(on_demand, len(on_demand) - od_goal, "spot recovered")
        return actions


@dataclass(frozen=True)
class OnDemandOnly:
    """Baseline: the target on on-demand instances, nothing on spot."""

    name: str = "on-demand-only"

    def decide(self, snapshot: PoolSnapshot, settings: PolicySettings) -> list[PoolAction]:
        """Keep exactly `target` on-demand agents."""
        actions: list[PoolAction] = [*without_warm_pool(snapshot)]
        on_demand = live_agents(snapshot.agents, "on-demand")
        placement = cheapest_on_demand(snapshot, settings)
        if len(on_demand) < snapshot.target and placement is not None:
            launch = Launch(placement.instance_type, placement.zone, "on-demand")
            return actions + [launch] * (snapshot.target - len(on_demand))
        return actions + shed_agents(on_demand, len(on_demand) - snapshot.target, "above target")


@dataclass(frozen=True)
class SpotCheapestZone:
    """Baseline: the target on spot in the single cheapest placement, no fallback."""

    name: str = "spot-cheapest-zone"

    def decide(self, snapshot: PoolSnapshot, settings: PolicySettings) -> list[PoolAction]:
        """Keep `target` spot agents in the cheapest placement, retrying it when refused."""
        actions: list[PoolAction] = [*without_warm_pool(snapshot)]
        spot = live_agents(snapshot.agents, "spot")
        cheapest = min(settings.placements, key=snapshot.spot_price, default=None)
        if cheapest is None or len(spot) >= snapshot.target:
            return actions + shed_agents(spot, len(spot) - snapshot.target, "above target")
        launch = Launch(cheapest.instance_type, cheapest.zone, "spot")
        return actions + [launch] * (snapshot.target - len(spot))


@dataclass(frozen=True)
class EvenSpread:
    """Baseline: target + a fixed margin of spot, spread evenly, never avoiding a placement."""

    name: str = "even-spread"

    def decide(self, snapshot: PoolSnapshot, settings: PolicySettings) -> list[PoolAction]:
        """Keep target + over-provision spot agents, each launch where we hold fewest."""
        actions: list[PoolAction] = [*without_warm_pool(snapshot)]
        spot = live_agents(snapshot.agents, "spot")
        goal = snapshot.target + settings.spot_overprovision if snapshot.target > 0 else 0
        if len(spot) >= goal:
            return actions + shed_agents(spot, len(spot) - goal, "above target")
        blind = replace(snapshot, risky_until={})
        return actions + spread_spot_launches(goal - len(spot), spot, blind, settings)
