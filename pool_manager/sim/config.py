"""The simulated pool and workload (`SimConfig`), and the policy settings each model runs with."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pool_manager.pool_view import (
    PlacementOption,
    PolicySettings,
)
from pool_manager.sim.traces import TraceError, ZoneTrace
from spotgate.settings import POOL_DEFAULTS

SECONDS_PER_HOUR = 3600.0


SPOT_PRICE_PER_HOUR = 1.0  # prices are relative: on-demand costs `on_demand_price_ratio`


DEFAULT_MODEL = "model"
"""The name of the one model of a pool configured by `SimConfig.target` and `load` alone."""


HOURS_PER_MONTH = 730.0  # as AWS bills a GB-month


WARM_START_SECONDS = 60.0
"""A stopped instance's start to ready: EC2 brings a warm pool's instance into service in as
little as 30 s (AWS, announcing EC2 Auto Scaling warm pools), then vLLM loads the weights from
the instance's own volume and captures its CUDA graphs (20-60 s, docs/cold-start.md); the
image pull and weight fetch of a cold start are skipped."""


ON_DEMAND_DOLLARS_PER_HOUR = 3.06
"""p3.2xlarge, the traces' type, on-demand in us-east-1: https://aws.amazon.com/ec2/pricing/on-demand/"""


@dataclass(frozen=True)
class SimModel:
    """One model the pool serves: its target, its offered load and where it may run."""

    name: str
    target: int
    load: float  # offered streams as a share of this model's target capacity
    instance_types: tuple[str, ...] = ()  # the placements it may use; empty: all


@dataclass(frozen=True)
class SimConfig:
    """The simulated pool and workload."""

    target: int = 4
    cold_start_seconds: float = 180.0
    cold_start_samples: tuple[float, ...] = ()  # observed cold starts, drawn from at each launch
    # Stopped on-demand instances each model keeps (0: no warm pool).
    warm_pool_size: int = POOL_DEFAULTS.warm_pool_size
    # Cover the spot margin on-demand where spot cannot place it (see `PolicySettings`).
    on_demand_margin: bool = POOL_DEFAULTS.on_demand_margin
    on_demand_margin_spot_age_seconds: float = POOL_DEFAULTS.on_demand_margin_spot_age_seconds
    on_demand_margin_shortage_seconds: float = POOL_DEFAULTS.on_demand_margin_shortage_seconds
    # The span opens with each model's warm pool full: topped up while the model was at zero.
    warm_pool_filled: bool = True
    warm_start_seconds: float = WARM_START_SECONDS
    warm_start_samples: tuple[float, ...] = ()  # observed warm starts, drawn from at each start
    # What a stopped instance costs: its volume (the sim's prices are relative; these scale it).
    volume_gib: float = POOL_DEFAULTS.volume_gib
    volume_dollars_per_gib_month: float = POOL_DEFAULTS.volume_price_per_gib_month
    on_demand_dollars_per_hour: float = ON_DEMAND_DOLLARS_PER_HOUR
    notice_seconds: float = 120.0
    tick_seconds: float = 30.0
    on_demand_price_ratio: float = 3.0
    spot_overprovision: int = POOL_DEFAULTS.spot_overprovision
    on_demand_hold_seconds: float = POOL_DEFAULTS.on_demand_hold_seconds
    risky_placement_seconds: float = POOL_DEFAULTS.risky_placement_seconds
    streams_per_agent: int = POOL_DEFAULTS.target_streams_per_agent
    stream_seconds: float = 60.0
    load: float = 0.5  # offered streams as a share of the target's capacity
    queue_deadline_seconds: float = 60.0
    on_demand_refusal_rate: float = 0.0  # share of on-demand launches refused for capacity
    # Each hour every placement's spot price moves by up to this share, a seeded random walk
    # kept between half and twice its starting price (0: prices never move).
    spot_price_step: float = 0.0
    seed: int = 0
    # The models sharing the pool; empty: one model of `target` agents at `load`.
    models: tuple[SimModel, ...] = ()
    # Batch work each model is given as the span opens (stream-hours), due within the window:
    # it runs on the streams interactive ones leave, and the policy may add spot for it.
    batch_stream_hours: float = 0.0
    batch_window_hours: float = 24.0
    batch_spot_max_agents: int = POOL_DEFAULTS.batch_spot_max_agents

    def pool_models(self) -> tuple[SimModel, ...]:
        """The models the pool serves: `models`, else one from `target` and `load`."""
        return self.models or (SimModel(DEFAULT_MODEL, self.target, self.load),)

    @property
    def stopped_price_per_hour(self) -> float:
        """A stopped instance's hourly cost (its volume), in the simulator's spot-price units."""
        volume_dollars = self.volume_gib * self.volume_dollars_per_gib_month / HOURS_PER_MONTH
        spot_dollars = self.on_demand_dollars_per_hour / self.on_demand_price_ratio
        return volume_dollars / spot_dollars * SPOT_PRICE_PER_HOUR


def placements_for(
    traces: Sequence[ZoneTrace], on_demand_price_ratio: float
) -> list[PlacementOption]:
    """One placement per trace, spot at price 1 and on-demand at the given ratio."""
    return [
        PlacementOption(
            instance_type=trace.instance_type,
            zone=trace.zone,
            spot_price_per_hour=SPOT_PRICE_PER_HOUR,
            on_demand_price_per_hour=SPOT_PRICE_PER_HOUR * on_demand_price_ratio,
        )
        for trace in traces
    ]


def placements_of(model: SimModel, placements: Sequence[PlacementOption]) -> list[PlacementOption]:
    """The placements `model` may use; raise `TraceError` for an instance type with no trace."""
    known = {p.instance_type for p in placements}
    if unknown := sorted(set(model.instance_types) - known):
        raise TraceError(
            f"model {model.name}: no spot trace for instance type {', '.join(unknown)} "
            f"(the traces have {', '.join(sorted(known))})"
        )
    wanted = set(model.instance_types) or known
    return [p for p in placements if p.instance_type in wanted]


def settings_for(
    config: SimConfig, target: int, placements: Sequence[PlacementOption]
) -> PolicySettings:
    """One model's policy settings, kept at its target (`min_agents == max_agents`)."""
    return PolicySettings(
        placements=tuple(placements),
        min_agents=target,
        max_agents=target,
        target_streams_per_agent=config.streams_per_agent,
        spot_overprovision=config.spot_overprovision,
        on_demand_hold_seconds=config.on_demand_hold_seconds,
        warm_pool_size=config.warm_pool_size,
        on_demand_margin=config.on_demand_margin,
        on_demand_margin_spot_age_seconds=config.on_demand_margin_spot_age_seconds,
        on_demand_margin_shortage_seconds=config.on_demand_margin_shortage_seconds,
        batch_spot_max_agents=config.batch_spot_max_agents,
    )
