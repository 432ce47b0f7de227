"""What the pool should launch, drain and terminate: pure functions over plain data.

The live manager and the simulator both call `Policy.decide` with a `PoolSnapshot` and carry
out the returned actions; nothing here does I/O or reads the clock. Sizing (how many agents a
model needs) and placement (which spot or on-demand capacity holds them) are separate steps:

- `size_pool` turns demand into a target with hysteresis: up at once, down only after demand
  stayed lower for `scale_down_idle_seconds` (so the pool never flaps, and drains rather than
  cuts when it shrinks).
- `HedgedSpotPolicy` (spotgate's own) keeps target + over-provision (+ the batch backlog's
  `batch_spot`, which nothing on-demand ever covers) spot agents spread over
  (type, zone) placements that have not just preempted or refused, runs on-demand agents only
  for the part of the target that ready spot agents cannot hold, and drains them once spot
  holds the target with its margin ready, or has held the target for `on_demand_hold_seconds`
  (zones that just came back often go again: the margin absorbs the next loss).
  With `on_demand_margin`, the spot margin is covered on-demand too while spot has nowhere
  to place it and its loss is likely (`margin_cover`).
  With a warm pool (`warm_pool_size`), on-demand cover comes from stopped instances that
  booted once (`StartWarm`, a warm start) before any launch; an idle on-demand agent it no
  longer needs is stopped back into the pool (`StopToWarm`) while the pool has room; the
  pool is topped up with on-demand agents that boot once and stop (`Launch.for_warm_pool`)
  and trimmed (`TerminateWarm`). Only on-demand instances are stopped: EC2 does not stop spot
  instances that serve, as Auto Scaling warm pools take no spot.
- `SpotHedge` is the policy SpotHedge (EuroSys '25) runs, as the spot traces' README states it.
- `OnDemandOnly`, `SpotCheapestZone` and `EvenSpread` are the simulator's baselines.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from pool_manager.baselines import EvenSpread, OnDemandOnly, SpotCheapestZone, SpotHedge
from pool_manager.liveness import dead_reason, is_drained
from pool_manager.placement import live_agents, shed_agents, spread_spot_launches
from pool_manager.pool_view import (
    PolicySettings,
    PoolAction,
    PoolAgent,
    PoolSnapshot,
    StopToWarm,
    Terminate,
)
from pool_manager.warm_pool import (
    cover_on_demand,
    drained_into_warm,
    shed_on_demand,
    tend_warm_pool,
)


def reap(snapshot: PoolSnapshot, settings: PolicySettings) -> list[Terminate | StopToWarm]:
    """Agents to end because they are dead (heartbeat stopped, never came up) or drained.

    A drained on-demand agent is stopped into the warm pool while it has room.
    """
    into_warm = {a.agent_id for a in drained_into_warm(snapshot, settings)}
    ended: list[Terminate | StopToWarm] = []
    for agent in snapshot.agents:
        if (reason := dead_reason(agent, snapshot.now, settings)) is not None:
            ended.append(Terminate(agent.agent_id, reason))
        elif agent.agent_id in into_warm:
            ended.append(StopToWarm(agent.agent_id, "drained, into the warm pool"))
        elif is_drained(agent, snapshot.now):
            ended.append(Terminate(agent.agent_id, "drained"))
    return ended


class Policy(Protocol):
    """A placement policy: the actions that bring the pool to its target."""

    @property
    def name(self) -> str:
        """What `spotgate sim --policy` calls it."""
        ...

    def decide(self, snapshot: PoolSnapshot, settings: PolicySettings) -> Sequence[PoolAction]:
        """Launches, drains and terminations (and warm-pool actions) for this instant."""
        ...


def margin_cover(
    target: int,
    ready_spot: Sequence[PoolAgent],
    on_demand: Sequence[PoolAgent],
    snapshot: PoolSnapshot,
    settings: PolicySettings,
) -> int:
    """On-demand agents held for spot's margin: the margin where its loss is likely, else 0.

    With `on_demand_margin`, the margin is covered on-demand too (the next loss then finds
    cover ready, not a warm start away) only while all of these hold: spot has nowhere left
    to place it (every placement preempted or refused lately); no placement holds more ready
    spot agents than the margin (a drop that takes several at once is beyond it); the newest
    ready spot agent came up within `on_demand_margin_spot_age_seconds`; and on-demand carries
    no more of the target than the margin, or its oldest agent has covered for
    `on_demand_margin_shortage_seconds`.
    """
    margin = settings.spot_overprovision if target > 0 else 0
    if not settings.on_demand_margin or margin == 0 or not ready_spot:
        return 0
    now = snapshot.now
    nowhere = all(snapshot.risky_until.get(p.key, 0.0) > now for p in settings.placements)
    crowded = max(Counter(a.placement for a in ready_spot).values()) > margin
    newest = max(a.ready_at if a.ready_at is not None else now for a in ready_spot)
    covering_since = min((a.launched_at for a in on_demand), default=now)
    shortage_held = (
        target - len(ready_spot) <= margin
        or now - covering_since >= settings.on_demand_margin_shortage_seconds
    )
    recent = now - newest < settings.on_demand_margin_spot_age_seconds
    return margin if nowhere and not crowded and recent and shortage_held else 0


@dataclass(frozen=True)
class HedgedSpotPolicy:
    """spotgate's policy: spread spot with a margin, on-demand only for what spot cannot hold."""

    name: str = "spotgate"

    def decide(self, snapshot: PoolSnapshot, settings: PolicySettings) -> list[PoolAction]:
        """Launch or shed spot towards target + margin; cover the ready-spot gap on-demand."""
        target = snapshot.target
        spot = live_agents(snapshot.agents, "spot")
        on_demand = [a for a in live_agents(snapshot.agents, "on-demand") if not a.for_warm_pool]
        interactive_goal = target + settings.spot_overprovision if target > 0 else 0
        spot_goal = interactive_goal + snapshot.batch_spot  # batch work's agents: spot only
        actions: list[PoolAction] = []
        # An agent AWS wants to rebalance keeps serving until its replacement is ready.
        safe = [a for a in spot if not a.at_risk]
        if len(safe) < spot_goal:
            actions += spread_spot_launches(spot_goal - len(safe), safe, snapshot, settings)
        elif len(safe) > spot_goal:
            actions += shed_agents(safe, len(safe) - spot_goal, "more spot than the target needs")
        if sum(1 for a in safe if a.phase == "ready") >= spot_goal:
            at_risk = [a for a in spot if a.at_risk]
            actions += shed_agents(at_risk, len(at_risk), "replaced ahead of a rebalance")
        ready = [a for a in spot if a.phase == "ready"]
        ready_spot = sorted(a.ready_at or 0.0 for a in ready)
        margin = margin_cover(target, ready, on_demand, snapshot, settings)
        od_goal = max(0, min(target, target + margin - len(ready_spot)))
        if not settings.on_demand_fallback:
            od_goal = 0
        if len(on_demand) < od_goal:
            actions += cover_on_demand(od_goal - len(on_demand), snapshot, settings)
        elif len(on_demand) > od_goal:
            # Spot that just came back often goes again (zones flap): keep the on-demand
            # agents until spot could lose one agent and still hold the target (its margin is
            # ready too), or until the spot agents replacing them have been ready for the hold
            # time. Without a margin only the hold counts.
            holding = ready_spot[:target]  # the spot agents that replace on-demand ones
            held_since = holding[-1] if holding else 0.0
            margin_ready = settings.spot_overprovision > 0 and len(ready_spot) >= interactive_goal
            if margin_ready or snapshot.now - held_since >= settings.on_demand_hold_seconds:
                shed = len(on_demand) - od_goal
                actions += shed_on_demand(on_demand, shed, snapshot, settings)
        return actions + tend_warm_pool(snapshot, settings, actions)


POLICIES: dict[str, Policy] = {
    policy.name: policy
    for policy in (
        HedgedSpotPolicy(),
        SpotHedge(),
        OnDemandOnly(),
        SpotCheapestZone(),
        EvenSpread(),
    )
}
