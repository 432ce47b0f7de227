"""How many agents a model needs: demand to a target, with the scale-down hysteresis."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from pool_manager.pool_view import (
    PolicySettings,
    PoolAgent,
    Sizing,
)

if TYPE_CHECKING:
    from spotgate.registry import Demand


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


BACKLOG_FINISH_MARGIN_SECONDS = 1800.0
"""Batch work is planned to end this long before its window does: boots, retries, the files."""
BACKLOG_LATE_SECONDS = 60.0
"""Work past its planned end is sized as if it had this long left: all the spot it may have."""


def agents_for_backlog(demand: Demand, target: int, now: float, settings: PolicySettings) -> int:
    """Spot agents to add so the batch work left ends within its window.

    The work runs first on the streams the interactive target leaves (its streams less those
    waiting and running); only what that cannot finish in time asks for agents, at most
    `batch_spot_max_agents`.
    """
    backlog = demand.backlog
    if backlog is None or backlog.stream_seconds <= 0:
        return 0
    seconds_left = max(backlog.due_at - BACKLOG_FINISH_MARGIN_SECONDS - now, BACKLOG_LATE_SECONDS)
    per_agent = settings.target_streams_per_agent
    spare_streams = max(0, target * per_agent - demand.pending - demand.active)
    missing_streams = backlog.stream_seconds / seconds_left - spare_streams
    if missing_streams <= 0:
        return 0
    return min(math.ceil(missing_streams / per_agent), settings.batch_spot_max_agents)


def size_backlog(previous: Sizing, needed: int, now: float, settings: PolicySettings) -> Sizing:
    """The backlog's spot agents: up at once, down once fewer were needed for the idle time."""
    ceiling = settings.batch_spot_max_agents
    return size_pool(previous, needed, now, replace(settings, min_agents=0, max_agents=ceiling))
