"""Where agents go and which leave first: spot spread over placements, on-demand cheapest."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from pool_manager.pool_view import (
    Action,
    Drain,
    Launch,
    LaunchLifecycle,
    PlacementOption,
    PolicySettings,
    PoolAgent,
    PoolSnapshot,
    Terminate,
)


def live_agents(agents: Sequence[PoolAgent], lifecycle: LaunchLifecycle) -> list[PoolAgent]:
    """The agents of `lifecycle` that are not draining."""
    return [a for a in agents if a.lifecycle == lifecycle and a.phase != "draining"]


def shed_agents(agents: Sequence[PoolAgent], count: int, reason: str) -> list[Action]:
    """Remove `count` agents, cheapest to lose first: booting ones, then the least busy."""
    order = sorted(agents, key=lambda a: (a.phase == "ready", a.active_streams, -a.launched_at))
    actions: list[Action] = []
    for agent in order[: max(0, count)]:
        if agent.phase == "starting" or agent.active_streams == 0:
            actions.append(Terminate(agent.agent_id, reason))
        else:
            actions.append(Drain(agent.agent_id, reason))
    return actions


def spread_spot_launches(
    count: int,
    agents: Sequence[PoolAgent],
    snapshot: PoolSnapshot,
    settings: PolicySettings,
) -> list[Launch]:
    """`count` spot launches, each in the placement holding fewest of ours, cheapest first.

    Placements that just preempted or refused are avoided while any other is left; when all
    are risky, the one whose risk ends first is tried (capacity often comes back).
    """
    held = Counter(a.placement for a in agents)
    safe = [p for p in settings.placements if snapshot.risky_until.get(p.key, 0.0) <= snapshot.now]
    candidates = (
        safe or sorted(settings.placements, key=lambda p: snapshot.risky_until.get(p.key, 0.0))[:1]
    )
    launches = []
    for _ in range(count):
        if not candidates:
            break
        best = min(candidates, key=lambda p: (held[p.key], snapshot.spot_price(p)))
        held[best.key] += 1
        launches.append(Launch(best.instance_type, best.zone, "spot"))
    return launches


def cheapest_on_demand(snapshot: PoolSnapshot, settings: PolicySettings) -> PlacementOption | None:
    """The cheapest on-demand placement that has not just refused; else the first to clear.

    On-demand capacity runs out too (EC2's InsufficientInstanceCapacity): the next cheapest
    placement, in another type or zone, usually has some.
    """
    refused_until = snapshot.on_demand_refused_until
    open_now = [p for p in settings.placements if refused_until.get(p.key, 0.0) <= snapshot.now]
    if open_now:
        return min(open_now, key=lambda p: p.on_demand_price_per_hour)
    return min(settings.placements, key=lambda p: refused_until.get(p.key, 0.0), default=None)
