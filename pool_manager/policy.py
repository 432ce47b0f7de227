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
  With `on_demand_margin`, the spot margin is covered on-demand too while spot has nowhere
  to place it and its loss is likely (`margin_cover`).
  With a warm pool (`warm_pool_size`), on-demand cover comes from stopped instances that
  booted once (`StartWarm`, a warm start) before any launch; an idle on-demand agent it no
  longer needs is stopped back into the pool (`StopToWarm`) while the pool has room; the
  pool is topped up with on-demand agents that boot once and stop (`Launch.for_warm_pool`)
  and trimmed (`TerminateWarm`). Only on-demand instances are stopped: EC2 does not stop spot
  instances that serve, as Auto Scaling warm pools take no spot.
- `SpotHedge` is the policy SpotHedge (EuroSys '25) runs, as the spot traces' README states it.
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

STOP_STUCK_SECONDS = 900.0
"""A stop takes a few minutes: an instance still stopping this long after it began is stuck
(EC2 stops hang at times), and it is terminated rather than held as the warm pool's."""


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
    warm_boot: bool = False  # started from the warm pool (`launched_at`: its start)

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
    # A warm start is a minute or two: one far past that is stuck, and cover should not
    # wait a cold start's timeout for it.
    warm_start_timeout_seconds: float = 600.0
    heartbeat_timeout_seconds: float = 60.0
    on_demand_hold_seconds: float = 1800.0
    warm_pool_size: int = 0  # stopped on-demand instances kept to start in a warm start
    # Cover the spot margin on-demand too while spot has nowhere to place it and a loss the
    # margin absorbs is likely (`margin_cover`); SpotHedge covers it wherever it is missing.
    on_demand_margin: bool = False
    # ... only while the newest ready spot agent came up this recently (zones that came back
    # go again; a pool that has held still for hours seldom loses one now) ...
    on_demand_margin_spot_age_seconds: float = 28800.0
    # ... and, where on-demand already carries more of the target than the margin, only once
    # that cover has run this long (the spot agents left just after a collapse seldom go next).
    on_demand_margin_shortage_seconds: float = 1800.0


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
    # Still stopping: counted in the warm pool, but EC2 refuses to start it until stopped
    # (which may take minutes, or hang), so cover does not wait for it.
    stopping: bool = False
    # Launched before its launch template last changed (a deploy): started, it would boot
    # what ran before, so it is never started, and terminated for a fresh one.
    stale: bool = False

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
PoolAction = Action | WarmAction
"""What a policy asks for. It proposes a `WarmAction` only where `warm_pool_size` > 0 or the
snapshot holds stopped instances, so a driver that keeps no warm pool never gets one."""


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


def _dead(agent: PoolAgent, now: float, settings: PolicySettings) -> str | None:
    """Why the agent is dead (never came up, or its heartbeat stopped); None while it lives."""
    if agent.heartbeat_at is None:
        if agent.warm_boot:
            if now - agent.launched_at > settings.warm_start_timeout_seconds:
                return "not ready within the warm start timeout"
        elif now - agent.launched_at > settings.launch_timeout_seconds:
            return "not ready within the launch timeout"
    elif now - agent.heartbeat_at > settings.heartbeat_timeout_seconds:
        return "heartbeat stopped"
    return None


def _drained(agent: PoolAgent, now: float) -> bool:
    """A draining agent whose streams are done, or whose drain deadline has passed."""
    deadline = agent.drain_deadline
    return agent.phase == "draining" and (
        agent.active_streams == 0 or (deadline is not None and now >= deadline)
    )


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
        if a.for_warm_pool and a.phase != "draining" and _dead(a, snapshot.now, settings) is None
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
        and _dead(a, snapshot.now, settings) is None
        and _drained(a, snapshot.now)
    ]
    return sorted(drained, key=lambda a: a.agent_id)[: max(0, room)]


def reap(snapshot: PoolSnapshot, settings: PolicySettings) -> list[Terminate | StopToWarm]:
    """Agents to end because they are dead (heartbeat stopped, never came up) or drained.

    A drained on-demand agent is stopped into the warm pool while it has room.
    """
    into_warm = {a.agent_id for a in drained_into_warm(snapshot, settings)}
    ended: list[Terminate | StopToWarm] = []
    for agent in snapshot.agents:
        if (reason := _dead(agent, snapshot.now, settings)) is not None:
            ended.append(Terminate(agent.agent_id, reason))
        elif agent.agent_id in into_warm:
            ended.append(StopToWarm(agent.agent_id, "drained, into the warm pool"))
        elif _drained(agent, snapshot.now):
            ended.append(Terminate(agent.agent_id, "drained"))
    return ended


class Policy(Protocol):
    """A placement policy: the actions that bring the pool to its target."""

    @property
    def name(self) -> str:
        """What `spotgate sim --policy` calls it."""
        ...

    def decide(self, snapshot: PoolSnapshot, settings: PolicySettings) -> Sequence[PoolAction]:
        """Launches, drains and terminations (and warm-pool actions) for this instant."""
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
    """Remove `count` on-demand agents as `_shed` does, stopping idle ones into the warm pool.

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
    for action in _shed(agents, count, "spot holds the target"):
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
        and _dead(a, snapshot.now, settings) is None
    ]
    # On-demand cover launched in this same pass returns to the pool too.
    launched = sum(1 for a in planned if isinstance(a, Launch) and a.lifecycle == "on-demand")
    missing = size - pool - len(returning) - len(started) - launched
    placement = cheapest_on_demand(snapshot, settings)
    if missing > 0 and placement is not None:
        launch = Launch(placement.instance_type, placement.zone, "on-demand", for_warm_pool=True)
        actions += [launch] * missing
    return actions


def margin_cover(
    target: int,
    ready_spot: Sequence[PoolAgent],
    on_demand: Sequence[PoolAgent],
    snapshot: PoolSnapshot,
    settings: PolicySettings,
) -> int:
    """On-demand agents held for spot's margin: the margin where its loss is likely, else 0.

    With `on_demand_margin`, the margin is covered on-demand too (the next loss then finds
    cover ready, not a warm start away) only while all of these hold: spot has nowhere left
    to place it (every placement preempted or refused lately); no placement holds more ready
    spot agents than the margin (a drop that takes several at once is beyond it); the newest
    ready spot agent came up within `on_demand_margin_spot_age_seconds`; and on-demand carries
    no more of the target than the margin, or its oldest agent has covered for
    `on_demand_margin_shortage_seconds`.
    """
    margin = settings.spot_overprovision if target > 0 else 0
    if not settings.on_demand_margin or margin == 0 or not ready_spot:
        return 0
    now = snapshot.now
    nowhere = all(snapshot.risky_until.get(p.key, 0.0) > now for p in settings.placements)
    crowded = max(Counter(a.placement for a in ready_spot).values()) > margin
    newest = max(a.ready_at if a.ready_at is not None else now for a in ready_spot)
    covering_since = min((a.launched_at for a in on_demand), default=now)
    shortage_held = (
        target - len(ready_spot) <= margin
        or now - covering_since >= settings.on_demand_margin_shortage_seconds
    )
    recent = now - newest < settings.on_demand_margin_spot_age_seconds
    return margin if nowhere and not crowded and recent and shortage_held else 0


@dataclass(frozen=True)
class HedgedSpotPolicy:
    """spotgate's policy: spread spot with a margin, on-demand only for what spot cannot hold."""

    name: str = "spotgate"

    def decide(self, snapshot: PoolSnapshot, settings: PolicySettings) -> list[PoolAction]:
        """Launch or shed spot towards target + margin; cover the ready-spot gap on-demand."""
        target = snapshot.target
        spot = _live(snapshot.agents, "spot")
        on_demand = [a for a in _live(snapshot.agents, "on-demand") if not a.for_warm_pool]
        spot_goal = target + settings.spot_overprovision if target > 0 else 0
        actions: list[PoolAction] = []
        # An agent AWS wants to rebalance keeps serving until its replacement is ready.
        safe = [a for a in spot if not a.at_risk]
        if len(safe) < spot_goal:
            actions += spread_spot_launches(spot_goal - len(safe), safe, snapshot, settings)
        elif len(safe) > spot_goal:
            actions += _shed(safe, len(safe) - spot_goal, "more spot than the target needs")
        if sum(1 for a in safe if a.phase == "ready") >= spot_goal:
            at_risk = [a for a in spot if a.at_risk]
            actions += _shed(at_risk, len(at_risk), "replaced ahead of a rebalance")
        ready = [a for a in spot if a.phase == "ready"]
        ready_spot = sorted(a.ready_at or 0.0 for a in ready)
        margin = margin_cover(target, ready, on_demand, snapshot, settings)
        od_goal = max(0, min(target, target + margin - len(ready_spot)))
        if not settings.on_demand_fallback:
            od_goal = 0
        if len(on_demand) < od_goal:
            actions += cover_on_demand(od_goal - len(on_demand), snapshot, settings)
        elif len(on_demand) > od_goal:
            # Spot that just came back often goes again (zones flap): keep the on-demand
            # agents until spot could lose one agent and still hold the target (its margin is
            # ready too), or until the spot agents replacing them have been ready for the hold
            # time. Without a margin only the hold counts.
            holding = ready_spot[:target]  # the spot agents that replace on-demand ones
            held_since = holding[-1] if holding else 0.0
            margin_ready = settings.spot_overprovision > 0 and len(ready_spot) >= spot_goal
            if margin_ready or snapshot.now - held_since >= settings.on_demand_hold_seconds:
                shed = len(on_demand) - od_goal
                actions += shed_on_demand(on_demand, shed, snapshot, settings)
        return actions + tend_warm_pool(snapshot, settings, actions)


@dataclass(frozen=True)
class SpotHedge:
    """SpotHedge as the spot traces' README states it, for comparison.

    Target + 1 spot agents spread over zones that have not just failed; max(0, min(target,
    target + 1 - ready spot)) on-demand ones, dropped as soon as spot recovers. The margin is
    `spot_overprovision` (1 there).
    """

    name: str = "spothedge"

    def decide(self, snapshot: PoolSnapshot, settings: PolicySettings) -> list[PoolAction]:
        """Keep target + margin spot; on-demand for each ready spot agent short of that."""
        target = snapshot.target
        spot = _live(snapshot.agents, "spot")
        on_demand = _live(snapshot.agents, "on-demand")
        spot_goal = target + settings.spot_overprovision if target > 0 else 0
        actions: list[PoolAction] = [*without_warm_pool(snapshot)]
        if len(spot) < spot_goal:
            actions += spread_spot_launches(spot_goal - len(spot), spot, snapshot, settings)
        elif len(spot) > spot_goal:
            actions += _shed(spot, len(spot) - spot_goal, "more spot than the target needs")
        ready_spot = sum(1 for a in spot if a.phase == "ready")
        od_goal = max(0, min(target, spot_goal - ready_spot))
        placement = cheapest_on_demand(snapshot, settings)
        if len(on_demand) < od_goal and placement is not None:
            launch = Launch(placement.instance_type, placement.zone, "on-demand")
            actions += [launch] * (od_goal - len(on_demand))
        elif len(on_demand) > od_goal:
            actions += _shed(on_demand, len(on_demand) - od_goal, "spot recovered")
        return actions


@dataclass(frozen=True)
class OnDemandOnly:
    """Baseline: the target on on-demand instances, nothing on spot."""

    name: str = "on-demand-only"

    def decide(self, snapshot: PoolSnapshot, settings: PolicySettings) -> list[PoolAction]:
        """Keep exactly `target` on-demand agents."""
        actions: list[PoolAction] = [*without_warm_pool(snapshot)]
        on_demand = _live(snapshot.agents, "on-demand")
        placement = cheapest_on_demand(snapshot, settings)
        if len(on_demand) < snapshot.target and placement is not None:
            launch = Launch(placement.instance_type, placement.zone, "on-demand")
            return actions + [launch] * (snapshot.target - len(on_demand))
        return actions + _shed(on_demand, len(on_demand) - snapshot.target, "above target")


@dataclass(frozen=True)
class SpotCheapestZone:
    """Baseline: the target on spot in the single cheapest placement, no fallback."""

    name: str = "spot-cheapest-zone"

    def decide(self, snapshot: PoolSnapshot, settings: PolicySettings) -> list[PoolAction]:
        """Keep `target` spot agents in the cheapest placement, retrying it when refused."""
        actions: list[PoolAction] = [*without_warm_pool(snapshot)]
        spot = _live(snapshot.agents, "spot")
        cheapest = min(settings.placements, key=snapshot.spot_price, default=None)
        if cheapest is None or len(spot) >= snapshot.target:
            return actions + _shed(spot, len(spot) - snapshot.target, "above target")
        launch = Launch(cheapest.instance_type, cheapest.zone, "spot")
        return actions + [launch] * (snapshot.target - len(spot))


@dataclass(frozen=True)
class EvenSpread:
    """Baseline: target + a fixed margin of spot, spread evenly, never avoiding a placement."""

    name: str = "even-spread"

    def decide(self, snapshot: PoolSnapshot, settings: PolicySettings) -> list[PoolAction]:
        """Keep target + over-provision spot agents, each launch where we hold fewest."""
        actions: list[PoolAction] = [*without_warm_pool(snapshot)]
        spot = _live(snapshot.agents, "spot")
        goal = snapshot.target + settings.spot_overprovision if snapshot.target > 0 else 0
        if len(spot) >= goal:
            return actions + _shed(spot, len(spot) - goal, "above target")
        blind = replace(snapshot, risky_until={})
        return actions + spread_spot_launches(goal - len(spot), spot, blind, settings)


POLICIES: dict[str, Policy] = {
    policy.name: policy
    for policy in (
        HedgedSpotPolicy(),
        SpotHedge(),
        OnDemandOnly(),
        SpotCheapestZone(),
        EvenSpread(),
    )
}
