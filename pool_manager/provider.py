"""What the pool manager needs from wherever agents run: launch, list, terminate.

Two providers implement it: `ec2` (real instances through aioboto3) and `local` (agent
subprocesses on this machine, for `spotgate up` and the tests). The controller only ever
talks to this protocol.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from pool_manager.policy import Launch, LaunchLifecycle, PlacementKey


@dataclass(frozen=True, slots=True)
class Instance:
    """One instance the provider runs for the pool (its agent registers under `agent_id`)."""

    instance_id: str
    agent_id: str
    model: str
    lifecycle: LaunchLifecycle
    instance_type: str
    zone: str
    launched_at: float
    url: str | None = None  # where its agent listens, when known at launch (local agents)

    @property
    def placement(self) -> PlacementKey:
        """The (type, zone) it runs in."""
        return (self.instance_type, self.zone)


class ProviderError(Exception):
    """The provider could not do what was asked (the message says why)."""


class CapacityRefused(ProviderError):
    """No capacity for this launch in this placement right now (try another one)."""

    def __init__(self, launch: Launch, reason: str) -> None:
        super().__init__(f"{launch.lifecycle} {launch.instance_type} in {launch.zone}: {reason}")
        self.launch = launch
        self.reason = reason


class Provider(Protocol):
    """Where agents run."""

    async def launch(self, model: str, launch: Launch) -> Instance:
        """Start one agent instance; raise `CapacityRefused` when the placement is full."""
        ...

    async def instances(self) -> list[Instance]:
        """The pool's instances that are pending or running."""
        ...

    async def terminate(self, instance_id: str) -> None:
        """Stop an instance (idempotent: an instance already gone is not an error)."""
        ...

    async def interruption_noticed(self, instance_id: str, deadline: float) -> None:
        """An interruption warning came for the instance (EC2 needs nothing; local emulates)."""
        ...

    async def spot_prices(self, placements: Sequence[PlacementKey]) -> dict[PlacementKey, float]:
        """Spot prices per hour now, for the placements whose price the provider knows."""
        ...
