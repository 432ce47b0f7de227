"""What the pool manager needs from wherever agents run: launch, list, stop, start, terminate.

Two providers implement it: `ec2` (real instances through aioboto3) and `local` (agent
subprocesses on this machine, for `spotgate up` and the tests). The controller only ever
talks to this protocol.

An on-demand instance may be stopped instead of terminated: its volume (the agent's image,
the model's weights) is kept, and it starts again in a warm start's time. The stopped
instances of the pool are its warm pool, as EC2 Auto Scaling's warm pools keep them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from pool_manager.pool_view import Launch, LaunchLifecycle, PlacementKey, WarmInstance
from spotgate.registry import BootKind


@dataclass(frozen=True, slots=True)
class Instance:
    """One instance the provider runs for the pool (its agent registers under `agent_id`)."""

    instance_id: str
    agent_id: str
    model: str
    lifecycle: LaunchLifecycle
    instance_type: str
    zone: str
    launched_at: float  # its launch, or for a warm start the start: when this boot began
    url: str | None = None  # where its agent listens, when known at launch (local agents)
    boot: BootKind = "cold"  # warm: started again from the warm pool
    for_warm_pool: bool = False  # launched to boot once, then be stopped into the warm pool

    @property
    def placement(self) -> PlacementKey:
        """The (type, zone) it runs in."""
        return (self.instance_type, self.zone)


@dataclass(frozen=True, slots=True)
class StoppedInstance:
    """An instance of the pool that is stopped (or stopping): one of its model's warm pool."""

    instance_id: str
    agent_id: str
    model: str
    instance_type: str
    zone: str
    stopped_at: float
    url: str | None = None  # where its agent listens again once started (local agents)
    stopping: bool = False  # not stopped yet: it cannot be started
    stale: bool = False  # launched from an older version of its model's launch template

    def warm(self) -> WarmInstance:
        """The policy's view of it."""
        return WarmInstance(
            self.instance_id,
            self.instance_type,
            self.zone,
            self.stopped_at,
            self.stopping,
            self.stale,
        )


class ProviderError(Exception):
    """The provider could not do what was asked (the message says why)."""


class StartRefused(ProviderError):
    """A stopped instance cannot start for want of capacity in its zone now (it cannot move)."""


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
        """End an instance, running or stopped (idempotent: one already gone is no error)."""
        ...

    async def stop(self, instance_id: str) -> None:
        """Stop an on-demand instance, keeping its volume; its agent drains as it shuts down."""
        ...

    async def start(self, stopped: StoppedInstance) -> Instance:
        """Start a stopped instance again (a warm start); `StartRefused` when EC2 has no room."""
        ...

    async def stopped(self) -> list[StoppedInstance]:
        """The pool's stopped and stopping instances: the warm pools of its models."""
        ...

    async def interruption_noticed(self, instance_id: str, deadline: float) -> None:
        """An interruption warning came for the instance (EC2 needs nothing; local emulates)."""
        ...

    async def spot_prices(self, placements: Sequence[PlacementKey]) -> dict[PlacementKey, float]:
        """Spot prices per hour now, for the placements whose price the provider knows."""
        ...
