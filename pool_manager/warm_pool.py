"""The warm pool: stopped on-demand instances started for cover before any launch."""

from __future__ import annotations

from collections.abc import Sequence

from pool_manager.liveness import dead_reason, is_drained
from pool_manager.placement import cheapest_on_demand, shed_agents
from pool_manager.pool_view import (
    Launch,
    PolicySettings,
    PoolAction,
    PoolAgent,
    PoolSnapshot,
    StartWarm,
    StopToWarm,
    Terminate,
    TerminateWarm,
    WarmAction,
    WarmInstance,
)

STOP_STUCK_SECONDS = 900.0
"""A stop takes a few minutes: an instance still stopping this long after it began is stuck
(EC2 stops hang at times), and it is terminated rather than held as the warm pool's."""


def _unkept(warm: WarmInstance, now: float, settings: PolicySettings) -> str | None:
    """Why a stopped instance is no longer the warm pool's (None: it is)."""
    if warm.placement not in {p.key for p in settings.placements}:
        return "its placement is not the model's"
    if warm.stale:
        return "launched before its launch template changed"
    if warm.stopping and now - warm.stopped_at > STOP_STUCK_SECONDS:
        return "stuck stopping"
    return None


def _listed(snapshot: PoolSnapshot, settings: PolicySettings) -> list[WarmInstance]:
    """The stopped instances the warm pool keeps (`_unkept` says why any other is not)."""
    return [w for w in snapshot.warm if _unkept(w, snapshot.now, settings) is None]


def _warm_bound(snapshot: PoolSnapshot, settings: PolicySettings) -> list[PoolAgent]:
    """Agents booting once for the warm pool (still alive): they are stopped into it once up."""
    return [
        a
        for a in snapshot.agents
        if a.for_warm_pool
        and a.phase != "draining"
        and dead_reason(a, snapshot.now, settings) is None
    ]


def drained_into_warm(snapshot: PoolSnapshot, settings: PolicySettings) -> list[PoolAgent]:
    """Drained on-demand agents the warm pool has room for: stopped into it, not terminated."""
    room = (
        settings.warm_pool_size
        - len(_listed(snapshot, settings))
        - len(_warm_bound(snapshot, settings))
    )
    drained = [
        a
        for a in snapshot.agents
        if a.lifecycle == "on-demand"
        and not a.for_warm_pool
        and dead_reason(a, snapshot.now, settings) is None
        and is_drained(a, snapshot.now)
    ]
    return sorted(drained, key=lambda a: a.agent_id)[: max(0, room)]


def without_warm_pool(snapshot: PoolSnapshot) -> list[TerminateWarm]:
    """A policy that uses no warm pool terminates the stopped instances it finds."""
    return [TerminateWarm(w.instance_id, "this policy keeps no warm pool") for w in snapshot.warm]


def startable(snapshot: PoolSnapshot, settings: PolicySettings) -> list[WarmInstance]:
    """Stopped instances a warm start may use now, cheapest on-demand placement first.

    Each starts only in its own placement (its volume is in that zone): one the model uses,
    that has not just refused on-demand capacity, and not one stopped in this very pass nor
    one still stopping.
    """
    prices = {p.key: p.on_demand_price_per_hour for p in settings.placements}
    refused_until = snapshot.on_demand_refused_until
    usable = [
        w
        for w in _listed(snapshot, settings)
        if refused_until.get(w.placement, 0.0) <= snapshot.now
        and w.stopped_at < snapshot.now
        and not w.stopping
    ]
    return sorted(usable, key=lambda w: (prices[w.placement], w.stopped_at, w.instance_id))


def cover_on_demand(
    count: int, snapshot: PoolSnapshot, settings: PolicySettings
) -> list[Launch | StartWarm]:
    """`count` on-demand agents: warm starts from the warm pool first, launches for the rest."""
    starts = [
        StartWarm(w.instance_id, "on-demand cover, from the warm pool")
        for w in startable(snapshot, settings)[:count]
    ]
    placement = cheapest_on_demand(snapshot, settings)
    if placement is None or len(starts) >= count:
        return list(starts)
    launch = Launch(placement.instance_type, placement.zone, "on-demand")
    return [*starts, *[launch] * (count - len(starts))]


def shed_on_demand(
    agents: Sequence[PoolAgent], count: int, snapshot: PoolSnapshot, settings: PolicySettings
) -> list[PoolAction]:
    """Remove `count` on-demand agents as `shed_agents` does, stopping idle ones into the warm pool.

    A busy one drains first; the reaper stops it into the pool once drained, if there is room.
    """
    room = (
        settings.warm_pool_size
        - len(_listed(snapshot, settings))
        - len(_warm_bound(snapshot, settings))
        - len(drained_into_warm(snapshot, settings))
    )
    actions: list[PoolAction] = []
    ready = {a.agent_id for a in agents if a.phase == "ready"}
    for action in shed_agents(agents, count, "spot holds the target"):
        if isinstance(action, Terminate) and action.agent_id in ready and room > 0:
            room -= 1
            actions.append(StopToWarm(action.agent_id, "spot holds the target: into the warm pool"))
        else:
            actions.append(action)
    return actions


def tend_warm_pool(
    snapshot: PoolSnapshot, settings: PolicySettings, planned: Sequence[PoolAction]
) -> list[Launch | WarmAction]:
    """Keep `warm_pool_size` stopped instances, counting those on their way there.

    Agents booted for the pool are stopped into it; stopped instances in placements the model
    no longer uses, launched before its launch template changed, or stuck stopping are
    terminated, and so are the oldest beyond the size. On-demand agents serving now count as
    the pool's too (they are stopped back into it when spot takes over again), so a warm start
    is not followed by a cold launch to refill the pool.
    """
    listed = _listed(snapshot, settings)
    actions: list[Launch | WarmAction] = [
        TerminateWarm(w.instance_id, reason)
        for w in snapshot.warm
        if (reason := _unkept(w, snapshot.now, settings)) is not None
    ]
    actions += [
        StopToWarm(a.agent_id, "booted once: into the warm pool")
        for a in _warm_bound(snapshot, settings)
        if a.phase == "ready"
    ]
    started = {a.instance_id for a in planned if isinstance(a, StartWarm)}
    ending = {a.agent_id for a in planned if isinstance(a, Terminate | StopToWarm)}
    kept = [w for w in listed if w.instance_id not in started]
    into_warm = drained_into_warm(snapshot, settings)
    pool = (
        len(kept)
        + len(_warm_bound(snapshot, settings))
        + sum(1 for a in planned if isinstance(a, StopToWarm))
        + len(into_warm)
    )
    size = settings.warm_pool_size
    if pool > size:
        prices = {p.key: p.on_demand_price_per_hour for p in settings.placements}
        oldest_dearest = sorted(kept, key=lambda w: (-prices[w.placement], w.stopped_at))
        actions += [
            TerminateWarm(w.instance_id, "more than the warm pool keeps")
            for w in oldest_dearest[: pool - size]
        ]
        return actions
    returning = [
        a
        for a in snapshot.agents
        if a.lifecycle == "on-demand"
        and not a.for_warm_pool
        and a.agent_id not in ending
        and a not in into_warm
        and dead_reason(a, snapshot.now, settings) is None
    ]
    # On-demand cover launched in this same pass returns to the pool too.
    launched = sum(1 for a in planned if isinstance(a, Launch) and a.lifecycle == "on-demand")
    missing = size - pool - len(returning) - len(started) - launched
    placement = cheapest_on_demand(snapshot, settings)
    if missing > 0 and placement is not None:
        launch = Launch(placement.instance_type, placement.zone, "on-demand", for_warm_pool=True)
        actions += [launch] * missing
    return actions
