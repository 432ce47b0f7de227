"""How many agents a model needs: demand to a target, with the scale-down hysteresis."""

from __future__ import annotations

import math
from collections.abc import Sequence

from pool_manager.pool_view import (
    PolicySettings,
    PoolAgent,
    Sizing,
)


def agents_for_demand(pending: int, active: int, settings: PolicySettings) -> int:
    """Agents needed to serve `pending + active` streams at the target load per agent."""
    return math.ceil(max(0, pending + active) / settings.target_streams_per_agent)


def size_pool(previous: Sizing, needed: int, now: float, settings: PolicySettings) -> Sizing:
    """The next target: up at once, down only once demand stayed lower for the idle time."""
    needed = min(max(needed, settings.min_agents), settings.max_agents)
    if needed >= previous.target:
        return Sizing(target=needed, needed_at=now)
    if now - previous.needed_at >= settings.scale_down_idle_seconds:
        return Sizing(target=needed, needed_at=now)
    return previous


def sizing_on_start(agents: Sequence[PoolAgent], now: float, settings: PolicySettings) -> Sizing:
    """A model's sizing when the pool manager starts: the agents serving it were needed now.

    So a restart in a lull scales the pool down only after the idle time, as the run before
    it would have, not at once from the demand of that moment.
    """
    serving = sum(1 for a in agents if not a.for_warm_pool and a.phase in ("starting", "ready"))
    return Sizing(target=min(serving, settings.max_agents), needed_at=now)
