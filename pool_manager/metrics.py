"""Prometheus metrics of the pool manager (units in names)."""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from pool_manager.controller import PassReport
from pool_manager.events import PoolEvent
from pool_manager.policy import Drain, Launch, PlacementKey, PoolAgent, Terminate
from spotgate.settings import Placement

COLD_START_BUCKETS_SECONDS = (30, 60, 90, 120, 180, 240, 300, 450, 600, 900, 1200, 1800)
"""Launch to ready: a CPU agent in seconds, a GPU instance pulling a model in minutes."""


@dataclass
class PoolMetrics:
    """Counters of what the pool did, and gauges of what it holds."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    placements: Sequence[Placement] = ()  # for the hourly prices of the pool's instances
    last_pass_at: float = 0.0  # epoch seconds; 0 before the first pass

    def __post_init__(self) -> None:
        r = self.registry
        self.launches = Counter(
            "spotgate_pool_launches_total", "instances launched", ["lifecycle"], registry=r
        )
        self.refused = Counter(
            "spotgate_pool_refused_launches_total",
            "launches refused for capacity (the next placement was tried)",
            ["lifecycle"],
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
            "agents by model, phase and lifecycle",
            ["model", "phase", "lifecycle"],
            registry=r,
        )
        self.last_pass = Gauge(
            "spotgate_pool_last_pass_timestamp_seconds",
            "when the last reconcile pass finished",
            registry=r,
        )
        self.cost = Gauge(
            "spotgate_pool_cost_dollars_per_hour",
            "what the pool's instances cost an hour at their placements' listed prices",
            ["lifecycle"],
            registry=r,
        )
        self.cold_start = Histogram(
            "spotgate_pool_cold_start_seconds",
            "from an instance's launch to its agent's first ready",
            ["instance_type", "zone"],
            buckets=COLD_START_BUCKETS_SECONDS,
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
                self.launches.labels(lifecycle=action.lifecycle).inc()
            elif isinstance(action, Drain):
                self.drains.inc()
            elif isinstance(action, Terminate):
                self.terminations.labels(reason=action.reason).inc()
        for refused in report.refused:
            self.refused.labels(lifecycle=refused.lifecycle).inc()
        for model, target in report.targets.items():
            self.target.labels(model=model).set(target)
        self.observe_agents(report.agents)
        self.last_pass.set(now)
        self.last_pass_at = now

    def observe_agents(self, agents: Sequence[tuple[str, PoolAgent]]) -> None:
        """Set the agent and cost gauges to the pool the last pass saw."""
        self.agents.clear()
        counts = Tally((model, agent.phase, agent.lifecycle) for model, agent in agents)
        for (model, phase, lifecycle), count in counts.items():
            self.agents.labels(model=model, phase=phase, lifecycle=lifecycle).set(count)
        cost = {"spot": 0.0, "on-demand": 0.0}
        for _model, agent in agents:
            prices = self._prices.get((agent.instance_type, agent.zone))
            if prices is not None:
                cost[agent.lifecycle] += prices[agent.lifecycle]
        for kind, dollars in cost.items():
            self.cost.labels(lifecycle=kind).set(dollars)

    def record_cold_starts(self, timed: Sequence[tuple[PlacementKey, float]]) -> None:
        """Observe cold starts just timed (`ColdStarts.observe`), per placement."""
        for (instance_type, zone), seconds in timed:
            self.cold_start.labels(instance_type=instance_type, zone=zone).observe(seconds)

    def record_event(self, event: PoolEvent) -> None:
        """Count one EC2 event."""
        self.events.labels(kind=event.kind).inc()
