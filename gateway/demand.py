"""What the gateway tells the pool manager: streams waiting and running, per model.

A row is written when its numbers change, and otherwise often enough that it never expires
while the gateway lives: an idle gateway costs no table writes every few seconds.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from gateway.dispatch import PoolView
from spotgate.registry import Demand

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
) -> dict[str, Demand]:
    """Per model: streams queued, and streams this gateway runs on the model's agents."""
    active: dict[str, int] = {}
    for model, records in view.agents.items():
        active[model] = sum(max(outstanding.get(r.agent_id, 0), 0) for r in records)
    return {
        model: Demand(pending=pending.get(model, 0), active=active.get(model, 0))
        for model in set(pending) | set(active) | set(models)
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
