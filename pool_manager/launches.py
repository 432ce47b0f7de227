"""The launch records the pool manager writes: what it vouches for of each agent it starts.

The gateways route to an agent only as far as its launch record allows (`gateway/vouching.py`):
the model it was launched for, at most the streams its instance type serves (the placement's
`capacity`), at the URL the launcher knows of where it knows one. Only the pool manager's role
may write them. Whatever starts an agent without a pool manager (tests, benchmarks, the
hostile battery) vouches for it here too, as the pool manager would.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from pool_manager.pool_view import PlacementOption
from pool_manager.provider import Instance
from spotgate.registry import LaunchRecord, Registry
from spotgate.settings import DEFAULT_AGENT_CAPACITY

UNMANAGED_INSTANCE_TYPE = "local"
"""The instance type of an agent started without a pool manager (on this machine)."""


def vouched_capacity(placements: Sequence[PlacementOption], instance_type: str) -> int | None:
    """The most streams an agent on `instance_type` serves (None: not a type of the pool)."""
    capacities = [p.capacity for p in placements if p.instance_type == instance_type]
    return max(capacities) if capacities else None


def launch_record(instance: Instance, capacity: int) -> LaunchRecord:
    """What the pool manager vouches for of an instance it launched."""
    return LaunchRecord(
        agent_id=instance.agent_id,
        model=instance.model,
        instance_type=instance.instance_type,
        capacity=capacity,
        url=instance.url,
        launched_at=instance.launched_at,
    )


async def vouch_for_agent(
    registry: Registry,
    *,
    agent_id: str,
    model: str,
    url: str,
    capacity: int = DEFAULT_AGENT_CAPACITY,
) -> None:
    """Write the launch record of an agent started on this machine without a pool manager."""
    instance = Instance(
        instance_id=agent_id,
        agent_id=agent_id,
        model=model,
        lifecycle="on-demand",
        instance_type=UNMANAGED_INSTANCE_TYPE,
        zone=UNMANAGED_INSTANCE_TYPE,
        launched_at=time.time(),
        url=url,
    )
    await registry.record_launch(launch_record(instance, capacity))
