"""What a pool policy sees (`PoolSnapshot`, `PolicySettings`) and asks for (`PoolAction`).

Plain data, no I/O: the live manager and the simulator fill and carry out the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Literal

from spotgate.settings import DEFAULT_AGENT_CAPACITY, POOL_DEFAULTS, Placement, PoolSettings

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
    # False while a draining agent's `active_streams` is from before its drain began: it may
    # have taken streams since, so 0 there does not mean drained.
    streams_known_since_drain: bool = True
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
    """The knobs of the pool: `PoolSettings`' own, with its defaults (`POOL_DEFAULTS`).

    The live manager builds them from its settings (`policy_settings_of`), the simulator
    from its configuration; what neither sets is the pool's default, written once there.
    """

    placements: tuple[PlacementOption, ...]
    min_agents: int = POOL_DEFAULTS.min_agents
    max_agents: int = POOL_DEFAULTS.max_agents
    target_streams_per_agent: int = POOL_DEFAULTS.target_streams_per_agent
    spot_overprovision: int = POOL_DEFAULTS.spot_overprovision
    batch_spot_max_agents: int = POOL_DEFAULTS.batch_spot_max_agents
    on_demand_fallback: bool = POOL_DEFAULTS.on_demand_fallback
    scale_down_idle_seconds: float = POOL_DEFAULTS.scale_to_zero_idle_seconds
    launch_timeout_seconds: float = POOL_DEFAULTS.launch_timeout_seconds
    # A warm start is a minute or two: one far past that is stuck, and cover should not
    # wait a cold start's timeout for it.
    warm_start_timeout_seconds: float = POOL_DEFAULTS.warm_start_timeout_seconds
    # An agent's heartbeat refreshes its registry entry: one older than the entry lives is dead.
    heartbeat_timeout_seconds: float = POOL_DEFAULTS.shared.registry.agent_ttl_seconds
    on_demand_hold_seconds: float = POOL_DEFAULTS.on_demand_hold_seconds
    warm_pool_size: int = POOL_DEFAULTS.warm_pool_size  # stopped on-demand instances kept
    # Cover the spot margin on-demand too while spot has nowhere to place it and a loss the
    # margin absorbs is likely (`margin_cover`); SpotHedge covers it wherever it is missing.
    on_demand_margin: bool = POOL_DEFAULTS.on_demand_margin
    # ... only while the newest ready spot agent came up this recently (zones that came back
    # go again; a pool that has held still for hours seldom loses one now) ...
    on_demand_margin_spot_age_seconds: float = POOL_DEFAULTS.on_demand_margin_spot_age_seconds
    # ... and, where on-demand already carries more of the target than the margin, only once
    # that cover has run this long (the spot agents left just after a collapse seldom go next).
    on_demand_margin_shortage_seconds: float = POOL_DEFAULTS.on_demand_margin_shortage_seconds


def placement_option(placement: Placement) -> PlacementOption:
    """A configured placement as the policy's plain data."""
    return PlacementOption(
        placement.instance_type,
        placement.zone,
        placement.spot_price_per_hour,
        placement.on_demand_price_per_hour,
        placement.capacity,
    )


_RENAMED = {"placements", "scale_down_idle_seconds", "heartbeat_timeout_seconds"}
"""The policy's settings that `PoolSettings` holds under another name or shape; every other
one is the pool setting of the same name."""


def policy_settings_of(
    settings: PoolSettings, placements: tuple[PlacementOption, ...] | None = None
) -> PolicySettings:
    """The policy's view of the pool settings (`placements`: instead of the configured ones)."""
    same = {
        f.name: getattr(settings, f.name) for f in fields(PolicySettings) if f.name not in _RENAMED
    }
    return PolicySettings(
        placements=placements
        if placements is not None
        else tuple(placement_option(p) for p in settings.placements),
        scale_down_idle_seconds=settings.scale_to_zero_idle_seconds,
        heartbeat_timeout_seconds=settings.shared.registry.agent_ttl_seconds,
        **same,
    )


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
    # Agents beyond the target for batch work that would miss its window: spot only, with
    # no margin and no on-demand cover (`agents_for_backlog`).
    batch_spot: int = 0
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
