"""What the gateway tells the pool manager: streams waiting and running, and batch work, per model.

A row is written when its numbers change, and otherwise often enough that it never expires
while the gateway lives: an idle gateway costs no table writes every few seconds.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from gateway.dispatch import PoolView
from spotgate.registry import BatchBacklog, Demand

# A row is rewritten unchanged after this share of the table's TTL: two writes can be lost
# (throttled, or DynamoDB briefly unreachable) before the pool manager stops seeing it.
KEEPALIVE_SHARE_OF_TTL = 1 / 3


@dataclass(frozen=True, slots=True)
class Published:
    """A row as last written, and when."""

    demand: Demand
    at: float


def current_demand(
    pending: Mapping[str, int],
    outstanding: Mapping[str, int],
    view: PoolView,
    models: Collection[str],
    *,
    running_flex: Mapping[str, int],
    backlogs: Mapping[str, BatchBacklog],
) -> dict[str, Demand]:
    """Per model: interactive streams queued and running here, and this gateway's batch work.

    Flex streams run on capacity interactive ones leave and never size the pool (`pending`
    counts interactive waiters only); their need for more is the backlog, which the pool
    meets with spot alone.
    """
    active: dict[str, int] = {}
    for model, records in view.agents.items():
        running = sum(max(outstanding.get(r.agent_id, 0), 0) for r in records)
        active[model] = max(0, running - running_flex.get(model, 0))
    return {
        model: Demand(pending.get(model, 0), active.get(model, 0), backlogs.get(model))
        for model in set(pending) | set(active) | set(models) | set(backlogs)
    }


def rows_due(
    current: Mapping[str, Demand],
    published: Mapping[str, Published],
    now: float,
    ttl_seconds: float,
) -> list[str]:
    """The models whose row changed, or would expire before the next keep-alive."""
    keepalive_seconds = ttl_seconds * KEEPALIVE_SHARE_OF_TTL
    return sorted(
        model
        for model, demand in current.items()
        if (last := published.get(model)) is None
        or last.demand != demand
        or now - last.at >= keepalive_seconds
    )
