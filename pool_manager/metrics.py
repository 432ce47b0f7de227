"""Prometheus metrics of the pool manager (units in names)."""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from pool_manager.cold_starts import TimedBoot
from pool_manager.controller import PassReport
from pool_manager.events import PoolEvent
from pool_manager.pool_view import (
    Drain,
    Launch,
    PoolAgent,
    StartWarm,
    StopToWarm,
    Terminate,
    TerminateWarm,
    WarmInstance,
)
from spotgate.regions import zone_region
from spotgate.settings import Placement

COLD_START_BUCKETS_SECONDS = (30, 60, 90, 120, 180, 240, 300, 450, 600, 900, 1200, 1800)
"""Launch to ready: a CPU agent in seconds, a GPU instance pulling a model in minutes."""
WARM_START_BUCKETS_SECONDS = (5, 10, 20, 30, 45, 60, 90, 120, 180, 240, 300, 600)
"""Start to ready of a stopped instance: no image pull, the weights on its volume."""
HOURS_PER_MONTH = 730.0
"""AWS's month for prices per GB-month (8,760 hours a year over 12)."""
WARM_POOL_ACTIONS = {StartWarm: "start", StopToWarm: "stop", TerminateWarm: "terminate"}


def stopped_volume_dollars_per_hour(volume_gib: float, price_per_gib_month: float) -> float:
    """What a stopped instance still costs an hour: its EBS volume (EC2 bills no compute)."""
    return volume_gib * price_per_gib_month / HOURS_PER_MONTH


@dataclass
class PoolMetrics:
    """Counters of what the pool did, and gauges of what it holds."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    placements: Sequence[Placement] = ()  # for the hourly prices of the pool's instances
    stopped_dollars_per_hour: float = 0.0  # what each instance of a warm pool costs stopped
    # … where a model's volume differs from the pool's: by model
    stopped_dollars_per_hour_by_model: Mapping[str, float] = field(default_factory=dict)
    last_pass_at: float = 0.0  # epoch seconds; 0 before the first pass

    def __post_init__(self) -> None:
        r = self.registry
        self.launches = Counter(
            "spotgate_pool_launches_total",
            "instances launched",
            ["lifecycle", "region"],
            registry=r,
        )
        self.refused = Counter(
            "spotgate_pool_refused_launches_total",
            "launches refused for capacity (the next placement was tried)",
            ["lifecycle", "region"],
            registry=r,
        )
        self.drains = Counter("spotgate_pool_drains_total", "agents drained", registry=r)
        self.terminations = Counter(
            "spotgate_pool_terminations_total", "instances terminated", ["reason"], registry=r
        )
        self.events = Counter(
            "spotgate_pool_events_total", "EC2 events acted on", ["kind"], registry=r
        )
        self.target = Gauge(
            "spotgate_pool_target_agents", "agents each model should have", ["model"], registry=r
        )
        self.agents = Gauge(
            "spotgate_pool_agents",
            "agents by model, phase, lifecycle and region",
            ["model", "phase", "lifecycle", "region"],
            registry=r,
        )
        self.last_pass = Gauge(
            "spotgate_pool_last_pass_timestamp_seconds",
            "when the last reconcile pass finished",
            registry=r,
        )
        self.cost = Gauge(
            "spotgate_pool_cost_dollars_per_hour",
            "what the pool's instances cost an hour: running ones at their placements' listed "
            "prices, stopped ones (lifecycle stopped: the warm pools) their volumes",
            ["lifecycle", "region"],
            registry=r,
        )
        self.region_api_up = Gauge(
            "spotgate_pool_region_api_up",
            "1 while a region's EC2 API answers the pool's listings, 0 while the pool places "
            "in its other regions",
            ["region"],
            registry=r,
        )
        self.warm = Gauge(
            "spotgate_pool_warm_instances",
            "stopped instances kept per model, to start in a warm start",
            ["model"],
            registry=r,
        )
        self.warm_actions = Counter(
            "spotgate_pool_warm_pool_actions_total",
            "instances started from, stopped into and terminated in the warm pools",
            ["action"],
            registry=r,
        )
        self.launches_held = Gauge(
            "spotgate_pool_launches_held",
            "1 while a model's launches are held: its agents keep failing to start, the same way",
            ["model"],
            registry=r,
        )
        self.cold_start = Histogram(
            "spotgate_pool_cold_start_seconds",
            "from an instance's launch to its agent's first ready",
            ["instance_type", "region", "zone"],
            buckets=COLD_START_BUCKETS_SECONDS,
            registry=r,
        )
        self.warm_start = Histogram(
            "spotgate_pool_warm_start_seconds",
            "from a stopped instance's start to its agent's first ready",
            ["instance_type", "region", "zone"],
            buckets=WARM_START_BUCKETS_SECONDS,
            registry=r,
        )
        self._prices = {
            (p.instance_type, p.zone): {"spot": p.spot_price_per_hour,
                                        "on-demand": p.on_demand_price_per_hour}
            for p in self.placements
        }  # fmt: skip

    def record_pass(self, report: PassReport, now: float) -> None:
        """Count a pass's actions and set the gauges from what it saw."""
        for action in report.actions:
            if isinstance(action, Launch):
                self.launches.labels(
                    lifecycle=action.lifecycle, region=zone_region(action.zone)
                ).inc()
            elif isinstance(action, Drain):
                self.drains.inc()
            elif isinstance(action, Terminate):
                self.terminations.labels(reason=action.reason).inc()
            else:
                self.warm_actions.labels(action=WARM_POOL_ACTIONS[type(action)]).inc()
        for refused in report.refused:
            self.refused.labels(lifecycle=refused.lifecycle, region=zone_region(refused.zone)).inc()
        for model, target in report.targets.items():
            self.target.labels(model=model).set(target)
            self.launches_held.labels(model=model).set(1 if model in report.held else 0)
        self.observe_agents(report.agents, report.warm)
        self.last_pass.set(now)
        self.last_pass_at = now

    def observe_agents(
        self,
        agents: Sequence[tuple[str, PoolAgent]],
        warm: Sequence[tuple[str, WarmInstance]] = (),
    ) -> None:
        """Set the agent, warm-pool and cost gauges to the pool the last pass saw."""
        self.agents.clear()
        counts = Tally(
            (model, agent.phase, agent.lifecycle, zone_region(agent.zone))
            for model, agent in agents
        )
        for (model, phase, lifecycle, region), count in counts.items():
            self.agents.labels(model=model, phase=phase, lifecycle=lifecycle, region=region).set(
                count
            )
        self.warm.clear()
        for model, count in Tally(model for model, _ in warm).items():
            self.warm.labels(model=model).set(count)
        self.cost.clear()
        regions = {zone_region(p.zone) for p in self.placements}
        cost = {
            (kind, region): 0.0 for kind in ("spot", "on-demand", "stopped") for region in regions
        }
        for _model, agent in agents:
            prices = self._prices.get((agent.instance_type, agent.zone))
            if prices is not None:
                running = (agent.lifecycle, zone_region(agent.zone))
                cost[running] = cost.get(running, 0.0) + prices[agent.lifecycle]
        for model, instance in warm:
            stopped = ("stopped", zone_region(instance.zone))
            dollars = self.stopped_dollars_per_hour_by_model.get(
                model, self.stopped_dollars_per_hour
            )
            cost[stopped] = cost.get(stopped, 0.0) + dollars
        for (kind, region), dollars in cost.items():
            self.cost.labels(lifecycle=kind, region=region).set(dollars)

    def record_regions(self, regions: Sequence[str], failing: Collection[str]) -> None:
        """Set whether each region's API answered the last pass's listings."""
        for region in regions:
            self.region_api_up.labels(region=region).set(0 if region in failing else 1)

    def record_boots(self, timed: Sequence[TimedBoot]) -> None:
        """Observe boots just timed (`ColdStarts.observe`), per kind and placement."""
        for boot in timed:
            histogram = self.warm_start if boot.kind == "warm" else self.cold_start
            instance_type, zone = boot.placement
            histogram.labels(
                instance_type=instance_type, region=zone_region(zone), zone=zone
            ).observe(boot.seconds)

    def record_event(self, event: PoolEvent) -> None:
        """Count one EC2 event."""
        self.events.labels(kind=event.kind).inc()
