"""What the pool should launch, drain and terminate: pure functions over plain data.

The live manager and the simulator both call `Policy.decide` with a `PoolSnapshot` and carry
out the returned actions; nothing here does I/O or reads the clock. Sizing (how many agents a
model needs) and placement (which spot or on-demand capacity holds them) are separate steps:

- `size_pool` turns demand into a target with hysteresis: up at once, down only after demand
  stayed lower for `scale_down_idle_seconds` (so the pool never flaps, and drains rather than
  cuts when it shrinks).
- `HedgedSpotPolicy` (spotgate's own) keeps target + over-provision spot agents spread over
  (type, zone) placements that have not just preempted or refused, runs on-demand agents only
  for the part of the target that ready spot agents cannot hold, and drains them once spot
  holds the target with its margin ready, or has held the target for `on_demand_hold_seconds`
  (zones that just came back often go again: the margin absorbs the next loss).
- `OnDemandOnly`, `SpotCheapestZone` and `EvenSpread` are the simulator's baselines.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol

from spotgate.settings import DEFAULT_AGENT_CAPACITY

LaunchLifecycle = Literal["spot", "on-demand"]
AgentPhase = Literal["starting", "ready", "draining"]


@dataclass(frozen=True, slots=True)
class PlacementOption:
    """One (instance type, zone) the pool may launch into, with hourly prices."""

    instance_type: str
    zone: str
    spot_price_per_hour: float
    on_demand_price_per_hour: float
    capacity: int = DEFAULT_AGENT_CAPACITY  # streams one agent on this type serves, at most

    @property
    def key(self) -> PlacementKey:
        """The (type, zone) pair that identifies the placement."""
        return (self.instance_type, self.zone)


PlacementKey = tuple[str, str]


@dataclass(frozen=True, slots=True)
class PoolAgent:
    """One agent of the pool, as the policy sees it."""

    agent_id: str
    lifecycle: LaunchLifecycle
    instance_type: str
    zone: str
    phase: AgentPhase
    launched_at: float
    active_streams: int = 0
    heartbeat_at: float | None = None  # None: never registered (still booting)
    drain_deadline: float | None = None
    ready_at: float | None = None
    at_risk: bool = False  # AWS recommended rebalancing it: replace first, then drain
    for_warm_pool: bool = False  # launched to boot once, then be stopped into the warm pool

    @property
    def placement(self) -> PlacementKey:
        """The (type, zone) the agent runs in."""
        return (self.instance_type, self.zone)


@dataclass(frozen=True, slots=True)
class PolicySettings:
    """The knobs of the pool (from `PoolSettings`, or the simulator's command line)."""

    placements: tuple[PlacementOption, ...]
    min_agents: int = 0
    max_agents: int = 4
    target_streams_per_agent: int = 32
    spot_overprovision: int = 1
    on_demand_fallback: bool = True
    scale_down_idle_seconds: float = 600.0
    launch_timeout_seconds: float = 900.0
    heartbeat_timeout_seconds: float = 60.0
    on_demand_hold_seconds: float = 1800.0
    warm_pool_size: int = 0  # stopped on-demand instances kept to start in a warm start


@dataclass(frozen=True, slots=True)
class Sizing:
    """The pool's target and since when demand last needed it (the scale-down hysteresis)."""

    target: int = 0
    needed_at: float = 0.0


@dataclass(frozen=True, slots=True)
class WarmInstance:
    """A stopped on-demand instance that booted once: its volume keeps the image and weights."""

    instance_id: str
    instance_type: str
    zone: str
    stopped_at: float

    @property
    def placement(self) -> PlacementKey:
        """The (type, zone) it starts in."""
        return (self.instance_type, self.zone)


@dataclass(frozen=True, slots=True)
class PoolSnapshot:
    """Everything the policy decides from, at one instant."""

    now: float
    target: int
    agents: tuple[PoolAgent, ...]
    risky_until: Mapping[PlacementKey, float] = field(default_factory=dict)
    # Placements that lately refused an on-demand launch, and until when they are passed over.
    on_demand_refused_until: Mapping[PlacementKey, float] = field(default_factory=dict)
    # Spot prices now, where known (they move); the others are the configured ones.
    spot_prices: Mapping[PlacementKey, float] = field(default_factory=dict)
    # The model's warm pool: stopped on-demand instances that booted once.
    warm: tuple[WarmInstance, ...] = ()

    def spot_price(self, placement: PlacementOption) -> float:
        """The placement's spot price per hour now: the latest known, else the configured one."""
        return self.spot_prices.get(placement.key, placement.spot_price_per_hour)


@dataclass(frozen=True, slots=True)
class Launch:
    """Start one agent in a placement."""

    instance_type: str
    zone: str
    lifecycle: LaunchLifecycle
    for_warm_pool: bool = False  # boot once, then stop into the warm pool (on-demand only)

    @property
    def placement(self) -> PlacementKey:
        """The (type, zone) to launch into."""
        return (self.instance_type, self.zone)


@dataclass(frozen=True, slots=True)
class Drain:
    """Stop sending new streams to an agent; it finishes or hands back what it has."""

    agent_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class Terminate:
    """Stop an agent's instance now (it has no streams, or it is dead)."""

    agent_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class StartWarm:
    """Start a stopped instance of the warm pool: on-demand capacity in a warm start's time."""

    instance_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class StopToWarm:
    """Stop an idle on-demand agent's instance into the warm pool (its volume is kept)."""

    agent_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class TerminateWarm:
    """Terminate a stopped instance of the warm pool (more than the pool keeps)."""

    instance_id: str
    reason: str


Action = Launch | Drain | Terminate
WarmAction = StartWarm | StopToWarm | TerminateWarm


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


def reap(snapshot: PoolSnapshot, settings: PolicySettings) -> list[Terminate]:
    """Agents to terminate because they are dead: heartbeat stopped, or never came up."""
    dead = []
    for agent in snapshot.agents:
        if agent.heartbeat_at is None:
            if snapshot.now - agent.launched_at > settings.launch_timeout_seconds:
                dead.append(Terminate(agent.agent_id, "not ready within the launch timeout"))
        elif snapshot.now - agent.heartbeat_at > settings.heartbeat_timeout_seconds:
            dead.append(Terminate(agent.agent_id, "heartbeat stopped"))
        elif agent.phase == "draining":
            deadline = agent.drain_deadline
            if agent.active_streams == 0 or (deadline is not None and snapshot.now >= deadline):
                dead.append(Terminate(agent.agent_id, "drained"))
    return dead


class Policy(Protocol):
    """A placement policy: the actions that bring the pool to its target."""

    @property
    def name(self) -> str:
        """What `spotgate sim --policy` calls it."""
        ...

    def decide(self, snapshot: PoolSnapshot, settings: PolicySettings) -> list[Action]:
        """Launches, drains and terminations for this instant."""
        ...


def _live(agents: Sequence[PoolAgent], lifecycle: LaunchLifecycle) -> list[PoolAgent]:
    return [a for a in agents if a.lifecycle == lifecycle and a.phase != "draining"]


def _shed(agents: Sequence[PoolAgent], count: int, reason: str) -> list[Action]:
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


@dataclass(frozen=True)
class HedgedSpotPolicy:
    """spotgate's policy: spread spot with a margin, on-demand only for what spot cannot hold."""

    name: str = "spotgate"

    def decide(self, snapshot: PoolSnapshot, settings: PolicySettings) -> list[Action]:
        """Launch or shed spot towards target + margin; cover the ready-spot gap on-demand."""
        target = snapshot.target
        spot = _live(snapshot.agents, "spot")
        on_demand = _live(snapshot.agents, "on-demand")
        spot_goal = target + settings.spot_overprovision if target > 0 else 0
        actions: list[Action] = []
        # An agent AWS wants to rebalance keeps serving until its replacement is ready.
        safe = [a for a in spot if not a.at_risk]
        if len(safe) < spot_goal:
            actions += spread_spot_launches(spot_goal - len(safe), safe, snapshot, settings)
        elif len(safe) > spot_goal:
            actions += _shed(safe, len(safe) - spot_goal, "more spot than the target needs")
        if sum(1 for a in safe if a.phase == "ready") >= spot_goal:
            at_risk = [a for a in spot if a.at_risk]
            actions += _shed(at_risk, len(at_risk), "replaced ahead of a rebalance")
        ready_spot = sorted(a.ready_at or 0.0 for a in spot if a.phase == "ready")
        od_goal = max(0, target - len(ready_spot)) if settings.on_demand_fallback else 0
        if len(on_demand) < od_goal:
            placement = cheapest_on_demand(snapshot, settings)
            if placement is not None:
                launch = Launch(placement.instance_type, placement.zone, "on-demand")
                actions += [launch] * (od_goal - len(on_demand))
        elif len(on_demand) > od_goal:
            # Spot that just came back often goes again (zones flap): keep the on-demand
            # agents until spot could lose one agent and still hold the target (its margin is
            # ready too), or until the spot agents replacing them have been ready for the hold
            # time. Without a margin only the hold counts.
            holding = ready_spot[:target]  # the spot agents that replace on-demand ones
            held_since = holding[-1] if holding else 0.0
            margin_ready = settings.spot_overprovision > 0 and len(ready_spot) >= spot_goal
            if margin_ready or snapshot.now - held_since >= settings.on_demand_hold_seconds:
                actions += _shed(on_demand, len(on_demand) - od_goal, "spot holds the target")
        return actions


@dataclass(frozen=True)
class OnDemandOnly:
    """Baseline: the target on on-demand instances, nothing on spot."""

    name: str = "on-demand-only"

    def decide(self, snapshot: PoolSnapshot, settings: PolicySettings) -> list[Action]:
        """Keep exactly `target` on-demand agents."""
        on_demand = _live(snapshot.agents, "on-demand")
        placement = cheapest_on_demand(snapshot, settings)
        if len(on_demand) < snapshot.target and placement is not None:
            launch = Launch(placement.instance_type, placement.zone, "on-demand")
            return [launch] * (snapshot.target - len(on_demand))
        return _shed(on_demand, len(on_demand) - snapshot.target, "above target")


@dataclass(frozen=True)
class SpotCheapestZone:
    """Baseline: the target on spot in the single cheapest placement, no fallback."""

    name: str = "spot-cheapest-zone"

    def decide(self, snapshot: PoolSnapshot, settings: PolicySettings) -> list[Action]:
        """Keep `target` spot agents in the cheapest placement, retrying it when refused."""
        spot = _live(snapshot.agents, "spot")
        cheapest = min(settings.placements, key=snapshot.spot_price, default=None)
        if cheapest is None or len(spot) >= snapshot.target:
            return _shed(spot, len(spot) - snapshot.target, "above target")
        launch = Launch(cheapest.instance_type, cheapest.zone, "spot")
        return [launch] * (snapshot.target - len(spot))


@dataclass(frozen=True)
class EvenSpread:
    """Baseline: target + a fixed margin of spot, spread evenly, never avoiding a placement."""

    name: str = "even-spread"

    def decide(self, snapshot: PoolSnapshot, settings: PolicySettings) -> list[Action]:
        """Keep target + over-provision spot agents, each launch where we hold fewest."""
        spot = _live(snapshot.agents, "spot")
        goal = snapshot.target + settings.spot_overprovision if snapshot.target > 0 else 0
        if len(spot) >= goal:
            return _shed(spot, len(spot) - goal, "above target")
        blind = replace(snapshot, risky_until={})
        return list(spread_spot_launches(goal - len(spot), spot, blind, settings))


POLICIES: dict[str, Policy] = {
    policy.name: policy
    for policy in (HedgedSpotPolicy(), OnDemandOnly(), SpotCheapestZone(), EvenSpread())
}
