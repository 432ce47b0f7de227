"""One reconcile step, pure: what the live controller and the simulator both carry out.

A pass over one model's pool sizes it from demand (`pool_target`), reaps the dead, asks the
placement policy, and, when a spot launch is refused for capacity, marks the placement risky
and asks again, at most once per placement, without retrying a placement refused in the same
pass. `ReconcilePass` holds that loop as plain data: a driver asks it for `next_round`,
carries each out wherever agents run (EC2, local processes, the simulator's instances) and
reports back what happened; the pass decides, the driver does I/O. Spot interruptions mark
their placement risky through `note_interruption`, for the live manager's events and the
simulator's trace drops alike. With a warm pool the pass also holds the model's stopped
instances: a driver that starts, stops or terminates one reports it, and a warm start refused
for capacity passes its placement over for on-demand as a refused launch does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from pool_manager.policy import Policy, reap
from pool_manager.pool_view import (
    Launch,
    LaunchLifecycle,
    PlacementKey,
    PolicySettings,
    PoolAction,
    PoolAgent,
    PoolSnapshot,
    Sizing,
    StartWarm,
    StopToWarm,
    Terminate,
    WarmInstance,
)
from pool_manager.sizing import agents_for_backlog, agents_for_demand, size_backlog, size_pool
from spotgate.settings import POOL_DEFAULTS

if TYPE_CHECKING:
    from spotgate.registry import Demand

DRAIN_DEADLINE_SECONDS = 300.0
"""A scale-down drain: the agent's streams get this long to finish, then are handed back."""
RISKY_PLACEMENT_SECONDS = POOL_DEFAULTS.risky_placement_seconds
"""How long a placement that preempted or refused spot is avoided while any other is left."""
ON_DEMAND_REFUSED_SECONDS = 600.0
"""How long a placement that refused an on-demand launch is passed over for on-demand."""


def pool_target(
    previous: Sizing,
    pending: int,
    active: int,
    fixed: int | None,
    now: float,
    settings: PolicySettings,
) -> Sizing:
    """The model's target: `fixed` when set (no hysteresis), else sized from its streams."""
    if fixed is not None:  # set by `spotgate pool scale`
        return Sizing(target=fixed, needed_at=now)
    return size_pool(previous, agents_for_demand(pending, active, settings), now, settings)


def model_sizing(
    previous: Sizing,
    previous_backlog: Sizing,
    demand: Demand,
    fixed: int | None,
    now: float,
    settings: PolicySettings,
) -> tuple[Sizing, Sizing]:
    """The model's target (`pool_target`), and its spot agents for batch work beyond it.

    A size fixed by hand adds none: it is the size.
    """
    sizing = pool_target(previous, demand.pending, demand.active, fixed, now, settings)
    if fixed is not None:
        return sizing, Sizing(target=0, needed_at=now)
    needed = agents_for_backlog(demand, sizing.target, now, settings)
    return sizing, size_backlog(previous_backlog, needed, now, settings)


def note_interruption(
    risky_until: Mapping[PlacementKey, float],
    placement: PlacementKey,
    now: float,
    risky_seconds: float = RISKY_PLACEMENT_SECONDS,
) -> dict[PlacementKey, float]:
    """The risky placements once `placement` preempted one of ours (or refused a launch)."""
    return {**risky_until, placement: now + risky_seconds}


@dataclass
class ReconcilePass:
    """One model's pass: rounds of reap + policy, again after each capacity refusal."""

    policy: Policy
    settings: PolicySettings
    now: float
    target: int
    agents: list[PoolAgent]
    risky_until: dict[PlacementKey, float]
    risky_seconds: float = RISKY_PLACEMENT_SECONDS
    on_demand_refused_until: dict[PlacementKey, float] = field(default_factory=dict)
    spot_prices: Mapping[PlacementKey, float] = field(default_factory=dict)
    warm: list[WarmInstance] = field(default_factory=list)  # the model's stopped instances
    # The model's agents keep failing to start (`start_failures`): no launch, no warm start.
    launches_held: bool = False
    batch_spot: int = 0  # spot agents beyond the target for batch work (`agents_for_backlog`)

    def __post_init__(self) -> None:
        self._refused_here: set[tuple[PlacementKey, LaunchLifecycle]] = set()
        self._rounds_left = len(self.settings.placements) + 1
        self._ask_again = True

    def snapshot(self) -> PoolSnapshot:
        """The pool as the policy sees it now."""
        return PoolSnapshot(
            now=self.now,
            target=self.target,
            agents=tuple(self.agents),
            risky_until=dict(self.risky_until),
            batch_spot=self.batch_spot,
            on_demand_refused_until=dict(self.on_demand_refused_until),
            spot_prices=dict(self.spot_prices),
            warm=tuple(self.warm),
        )

    def next_round(self) -> list[PoolAction]:
        """The next round's actions to carry out, warm-pool ones included; [] once done.

        Dead agents are terminated and the policy plans without them, so their replacements
        start in the same round; a drained agent being stopped into the warm pool stays in its
        view (as draining) so that the pool counts it. A launch or warm start into a placement
        that refused its lifecycle in this pass is left for the next pass, as is every launch
        and warm start while `launches_held`.
        """
        if not self._ask_again or self._rounds_left <= 0:
            return []
        self._rounds_left -= 1
        self._ask_again = False
        snapshot = self.snapshot()
        ended = reap(snapshot, self.settings)
        dead = {action.agent_id for action in ended if isinstance(action, Terminate)}
        alive = replace(
            snapshot, agents=tuple(a for a in snapshot.agents if a.agent_id not in dead)
        )
        planned = [*ended, *self.policy.decide(alive, self.settings)]
        if self.launches_held:
            planned = [a for a in planned if not isinstance(a, Launch | StartWarm)]
        return [action for action in planned if not self._refused_before(action)]

    def _refused_before(self, action: PoolAction) -> bool:
        if isinstance(action, StartWarm):
            warm = next((w for w in self.warm if w.instance_id == action.instance_id), None)
            return warm is not None and (warm.placement, "on-demand") in self._refused_here
        return (
            isinstance(action, Launch)
            and (action.placement, action.lifecycle) in self._refused_here
        )

    def launched(self, agent: PoolAgent) -> None:
        """A launch went through: the agent is booting."""
        self.agents.append(agent)

    def refused(self, launch: Launch) -> None:
        """A launch was refused for capacity: mark its placement, ask the policy again.

        Spot refused makes the placement risky for spot; on-demand refused passes it over for
        on-demand a while (spot there is another pool of capacity).
        """
        self._refused_here.add((launch.placement, launch.lifecycle))
        if launch.lifecycle == "spot":
            self.risky_until = note_interruption(
                self.risky_until, launch.placement, self.now, self.risky_seconds
            )
        else:
            self._pass_over_on_demand(launch.placement)
        self._ask_again = True

    def start_refused(self, start: StartWarm) -> None:
        """A warm start was refused for capacity: its placement is passed over for on-demand."""
        warm = next(w for w in self.warm if w.instance_id == start.instance_id)
        self._refused_here.add((warm.placement, "on-demand"))
        self._pass_over_on_demand(warm.placement)
        self._ask_again = True

    def _pass_over_on_demand(self, placement: PlacementKey) -> None:
        self.on_demand_refused_until = {
            **self.on_demand_refused_until,
            placement: self.now + ON_DEMAND_REFUSED_SECONDS,
        }

    def started(self, start: StartWarm, agent: PoolAgent) -> None:
        """A stopped instance started: it left the warm pool and its agent is booting."""
        self.warm = [w for w in self.warm if w.instance_id != start.instance_id]
        self.agents.append(agent)

    def stopped(self, stop: StopToWarm, warm: WarmInstance) -> None:
        """An agent's instance was stopped into the warm pool."""
        self.agents = [a for a in self.agents if a.agent_id != stop.agent_id]
        self.warm.append(warm)

    def terminated_warm(self, instance_id: str) -> None:
        """A stopped instance of the warm pool was terminated."""
        self.warm = [w for w in self.warm if w.instance_id != instance_id]

    def drained(self, agent: PoolAgent) -> None:
        """An agent now drains (its view after the drain)."""
        self.agents = [agent if a.agent_id == agent.agent_id else a for a in self.agents]

    def terminated(self, agent_id: str) -> None:
        """An agent's instance is stopped."""
        self.agents = [a for a in self.agents if a.agent_id != agent_id]
