"""Replay spot traces through a placement policy, with a stream workload on the pool.

Time advances in ticks. At each tick the simulator applies the traces (a zone whose capacity
falls below the spot instances we hold there preempts the excess: each victim gets the spot
notice and disappears `notice_seconds` later), brings instances up after `cold_start_seconds`
(or after a cold start drawn from `cold_start_samples`: those the live pool observed, as
`spotgate pool boots --json` lists them), moves streams (arrivals, completions, and streams
of a disappearing agent resumed elsewhere), then runs the live controller's reconcile step
(`pool_manager.reconcile.ReconcilePass`: sizing, reaping, the policy, the retry after a
refusal) and carries out its actions. A spot launch into a zone that is full is refused, as
the EC2 provider refuses it (an on-demand one at `on_demand_refusal_rate`), and the pass
marks the placement and asks again. Spot prices may move (`spot_price_step`): the policy
sees the current ones and the cost counts them. A scale-down drain gives streams
`DRAIN_DEADLINE_SECONDS` to finish and hands back the rest.

Measures: availability (share of ticks with at least `target` agents ready and not
draining), cost relative to running `target` on-demand instances the whole time, spot notices
(preemptions), launches, refused launches, and streams: started, resumed on another agent,
rejected (no capacity within the queue deadline: a clear error, nothing lost) and lost (a
started stream that could not be resumed before the deadline).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from pool_manager.policy import (
    Action,
    AgentPhase,
    Drain,
    Launch,
    LaunchLifecycle,
    PlacementKey,
    PlacementOption,
    Policy,
    PolicySettings,
    PoolAgent,
    Sizing,
)
from pool_manager.reconcile import (
    DRAIN_DEADLINE_SECONDS,
    ReconcilePass,
    note_interruption,
    pool_target,
)
from pool_manager.sim.traces import ZoneTrace

SECONDS_PER_HOUR = 3600.0
SPOT_PRICE_PER_HOUR = 1.0  # prices are relative: on-demand costs `on_demand_price_ratio`


@dataclass(frozen=True)
class SimConfig:
    """The simulated pool and workload."""

    target: int = 4
    cold_start_seconds: float = 180.0
    cold_start_samples: tuple[float, ...] = ()  # observed cold starts, drawn from at each launch
    notice_seconds: float = 120.0
    tick_seconds: float = 30.0
    on_demand_price_ratio: float = 3.0
    spot_overprovision: int = 1
    on_demand_hold_seconds: float = 1800.0
    risky_placement_seconds: float = 1800.0
    streams_per_agent: int = 32
    stream_seconds: float = 60.0
    load: float = 0.5  # offered streams as a share of the target's capacity
    queue_deadline_seconds: float = 60.0
    on_demand_refusal_rate: float = 0.0  # share of on-demand launches refused for capacity
    # Each hour every placement's spot price moves by up to this share, a seeded random walk
    # kept between half and twice its starting price (0: prices never move).
    spot_price_step: float = 0.0
    seed: int = 0


@dataclass
class SimResult:
    """What one policy achieved over one span of the traces."""

    policy: str
    availability: float
    cost_vs_on_demand: float
    preemptions: int
    launches: int
    refused_launches: int
    streams_started: int
    streams_resumed: int
    streams_rejected: int
    lost_streams: int
    hours: float
    on_demand_share_of_hours: float

    def as_json(self) -> dict[str, Any]:
        """Plain dict for `spotgate sim --json`."""
        return asdict(self)


@dataclass
class _Instance:
    agent_id: str
    lifecycle: LaunchLifecycle
    placement: PlacementOption
    launched_at: float
    ready_at: float
    ready: bool = False
    noticed: bool = False
    drained: bool = False
    dies_at: float | None = None
    streams: list[list[float]] = field(default_factory=list)  # [end time, count]

    @property
    def active(self) -> int:
        return int(sum(count for _, count in self.streams))

    def as_agent(self, now: float) -> PoolAgent:
        """The policy's view: a ready agent heartbeats, a booting one has not registered."""
        phase: AgentPhase = "ready" if self.ready else "starting"
        if self.noticed or self.drained:
            phase = "draining"
        return PoolAgent(
            agent_id=self.agent_id,
            lifecycle=self.lifecycle,
            instance_type=self.placement.instance_type,
            zone=self.placement.zone,
            phase=phase,
            launched_at=self.launched_at,
            active_streams=self.active,
            heartbeat_at=now if self.ready else None,
            drain_deadline=self.dies_at,
            ready_at=self.ready_at if self.ready else None,
        )


@dataclass
class _Waiting:
    deadline: float
    count: int
    remaining_seconds: float
    resumed: bool


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


class Simulation:
    """One policy over one span of the traces."""

    def __init__(
        self,
        traces: Sequence[ZoneTrace],
        policy: Policy,
        config: SimConfig,
        *,
        start_seconds: float = 0.0,
        duration_seconds: float | None = None,
    ) -> None:
        self._traces = {(t.instance_type, t.zone): t for t in traces}
        self._policy = policy
        self._config = config
        self._placements = placements_for(traces, config.on_demand_price_ratio)
        self._settings = PolicySettings(
            placements=tuple(self._placements),
            min_agents=config.target,
            max_agents=config.target,
            target_streams_per_agent=config.streams_per_agent,
            spot_overprovision=config.spot_overprovision,
            on_demand_hold_seconds=config.on_demand_hold_seconds,
        )
        longest = max(t.duration_seconds for t in traces)
        self._start = start_seconds
        self._end = min(longest, start_seconds + (duration_seconds or longest))
        self._rng = random.Random(config.seed)  # noqa: S311 (a reproducible simulation)
        # Its own stream, seeded apart: cold-start draws neither shift nor mirror the others.
        self._boot_rng = random.Random(f"{config.seed}/cold-starts")  # noqa: S311
        self._on_demand_rng = random.Random(f"{config.seed}/on-demand")  # noqa: S311
        self._on_demand_refused_until: dict[PlacementKey, float] = {}
        self._price_rng = random.Random(f"{config.seed}/spot-prices")  # noqa: S311
        self._spot_prices = {p.key: p.spot_price_per_hour for p in self._placements}
        self._prices_at = start_seconds
        self._instances: list[_Instance] = []
        self._waiting: list[_Waiting] = []
        self._risky_until: dict[PlacementKey, float] = {}
        self._sizing = Sizing()
        self.decisions: list[tuple[float, Action]] = []
        """What each reconcile pass carried out, with its time (refused launches left out)."""
        self._next_id = 0
        self._arrival_credit = 0.0
        rate_per_second = (
            config.load * config.target * config.streams_per_agent / config.stream_seconds
        )
        self._arrivals_per_tick = rate_per_second * config.tick_seconds
        self._counts = dict.fromkeys(
            ("preemptions", "launches", "refused", "started", "resumed", "rejected", "lost"), 0
        )

    @property
    def settings(self) -> PolicySettings:
        """The policy settings the simulated pool runs with."""
        return self._settings

    def run(self) -> SimResult:
        """Step through the span and report."""
        config = self._config
        tick = config.tick_seconds
        ticks = available = 0
        cost = on_demand_hours = hours = 0.0
        now = self._start
        while now < self._end:
            self._move_prices(now)
            self._apply_traces(now)
            self._advance(now)
            self._move_streams(now)
            ready = sum(1 for i in self._instances if i.ready and not i.noticed and not i.drained)
            ticks += 1
            available += ready >= config.target
            for instance in self._instances:
                hours += tick / SECONDS_PER_HOUR
                if instance.lifecycle == "on-demand":
                    on_demand_hours += tick / SECONDS_PER_HOUR
                    cost += instance.placement.on_demand_price_per_hour * tick / SECONDS_PER_HOUR
                else:
                    cost += self._spot_prices[instance.placement.key] * tick / SECONDS_PER_HOUR
            self._decide(now)
            now += tick
        on_demand_cost = (
            config.target * SPOT_PRICE_PER_HOUR * config.on_demand_price_ratio * ticks * tick
        ) / SECONDS_PER_HOUR
        counts = self._counts
        return SimResult(
            policy=self._policy.name,
            availability=available / ticks if ticks else 0.0,
            cost_vs_on_demand=cost / on_demand_cost if on_demand_cost else 0.0,
            preemptions=counts["preemptions"],
            launches=counts["launches"],
            refused_launches=counts["refused"],
            streams_started=counts["started"],
            streams_resumed=counts["resumed"],
            streams_rejected=counts["rejected"],
            lost_streams=counts["lost"],
            hours=ticks * tick / SECONDS_PER_HOUR,
            on_demand_share_of_hours=on_demand_hours / hours if hours else 0.0,
        )

    def _move_prices(self, now: float) -> None:
        """Once an hour, each spot price takes a step of its random walk."""
        step = self._config.spot_price_step
        if step <= 0 or now - self._prices_at < SECONDS_PER_HOUR:
            return
        self._prices_at = now
        for placement in self._placements:
            moved = self._spot_prices[placement.key] * (1 + self._price_rng.uniform(-step, step))
            base = placement.spot_price_per_hour
            self._spot_prices[placement.key] = min(2 * base, max(base / 2, moved))

    def _capacity(self, key: PlacementKey, now: float) -> int:
        return self._traces[key].capacity_at(now)

    def _holding(self, key: PlacementKey) -> list[_Instance]:
        return [
            i
            for i in self._instances
            if i.lifecycle == "spot" and not i.noticed and i.placement.key == key
        ]

    def _apply_traces(self, now: float) -> None:
        for key in self._traces:
            holders = self._holding(key)
            excess = len(holders) - self._capacity(key, now)
            if excess <= 0:
                continue
            for victim in self._rng.sample(holders, excess):
                victim.noticed = True
                victim.dies_at = now + self._config.notice_seconds
                self._counts["preemptions"] += 1
            self._risky_until = note_interruption(
                self._risky_until, key, now, self._config.risky_placement_seconds
            )

    def _advance(self, now: float) -> None:
        for instance in list(self._instances):
            if instance.dies_at is not None and instance.dies_at <= now:
                self._remove(instance, now)
            elif not instance.ready and not instance.noticed and instance.ready_at <= now:
                instance.ready = True

    def _remove(self, instance: _Instance, now: float) -> None:
        """The instance is gone: its unfinished streams wait to be resumed elsewhere."""
        self._instances.remove(instance)
        for end, count in instance.streams:
            if end > now:
                self._waiting.append(
                    _Waiting(now + self._config.queue_deadline_seconds, int(count), end - now, True)
                )

    def _move_streams(self, now: float) -> None:
        for instance in self._instances:
            instance.streams = [s for s in instance.streams if s[0] > now]
        self._arrival_credit += self._arrivals_per_tick
        arrivals = int(self._arrival_credit)
        self._arrival_credit -= arrivals
        if arrivals:
            deadline = now + self._config.queue_deadline_seconds
            self._waiting.append(_Waiting(deadline, arrivals, self._config.stream_seconds, False))
        self._waiting.sort(key=lambda w: not w.resumed)  # resumes go first
        serving = [i for i in self._instances if i.ready and not i.noticed and not i.drained]
        room = {id(i): self._config.streams_per_agent - i.active for i in serving}
        still_waiting = []
        for waiting in self._waiting:
            for instance in sorted(serving, key=lambda i: -room[id(i)]):
                if waiting.count == 0:
                    break
                placed = min(waiting.count, room[id(instance)])
                if placed <= 0:
                    continue
                instance.streams.append([now + waiting.remaining_seconds, placed])
                room[id(instance)] -= placed
                waiting.count -= placed
                self._counts["resumed" if waiting.resumed else "started"] += placed
            if waiting.count == 0:
                continue
            if waiting.deadline <= now:
                self._counts["lost" if waiting.resumed else "rejected"] += waiting.count
            else:
                still_waiting.append(waiting)
        self._waiting = still_waiting

    def _decide(self, now: float) -> None:
        """One reconcile pass, as the live controller runs it (`ReconcilePass`)."""
        self._sizing = pool_target(
            self._sizing,
            pending=sum(w.count for w in self._waiting),
            active=sum(i.active for i in self._instances),
            fixed=None,
            now=now,
            settings=self._settings,
        )
        step = ReconcilePass(
            policy=self._policy,
            settings=self._settings,
            now=now,
            target=self._sizing.target,
            agents=[i.as_agent(now) for i in self._instances],
            risky_until=self._risky_until,
            risky_seconds=self._config.risky_placement_seconds,
            on_demand_refused_until=self._on_demand_refused_until,
            spot_prices=self._spot_prices,
        )
        while actions := step.next_actions():
            for action in actions:
                if isinstance(action, Launch):
                    launched = self._launch(action, now)
                    if launched is None:
                        self._counts["refused"] += 1
                        step.refused(action)
                    else:
                        step.launched(launched.as_agent(now))
                        self.decisions.append((now, action))
                    continue
                instance = next((i for i in self._instances if i.agent_id == action.agent_id), None)
                if instance is None:
                    continue
                if isinstance(action, Drain):  # its streams get the drain deadline to finish
                    instance.drained = True
                    instance.dies_at = min(
                        instance.dies_at or math.inf, now + DRAIN_DEADLINE_SECONDS
                    )
                    step.drained(instance.as_agent(now))
                else:
                    self._remove(instance, now)
                    step.terminated(instance.agent_id)
                self.decisions.append((now, action))
        self._risky_until = step.risky_until
        self._on_demand_refused_until = step.on_demand_refused_until

    def _cold_start_seconds(self) -> float:
        """A launch's cold start: one of the observed ones, else the fixed figure."""
        if self._config.cold_start_samples:
            return self._boot_rng.choice(self._config.cold_start_samples)
        return self._config.cold_start_seconds

    def _launch(self, action: Launch, now: float) -> _Instance | None:
        """Start one instance; None when its placement has no capacity for it.

        Spot is refused when the trace says the zone is full; on-demand, at random, for the
        configured share of launches.
        """
        key = action.placement
        if action.lifecycle == "spot":
            if len(self._holding(key)) >= self._capacity(key, now):
                return None
        elif self._on_demand_rng.random() < self._config.on_demand_refusal_rate:
            return None
        placement = next(p for p in self._placements if p.key == key)
        self._next_id += 1
        instance = _Instance(
            agent_id=f"sim-{self._next_id}",
            lifecycle=action.lifecycle,
            placement=placement,
            launched_at=now,
            ready_at=now + self._cold_start_seconds(),
        )
        self._instances.append(instance)
        self._counts["launches"] += 1
        return instance


def simulate_windows(
    traces: Sequence[ZoneTrace],
    policy: Policy,
    config: SimConfig,
    *,
    windows: int = 0,
    window_hours: float = 24.0,
) -> SimResult:
    """The whole trace (`windows=0`), or the mean over windows at seeded random offsets."""
    if windows <= 0:
        return Simulation(traces, policy, config).run()
    longest = max(t.duration_seconds for t in traces)
    span = min(window_hours * SECONDS_PER_HOUR, longest)
    chooser = random.Random(config.seed)  # noqa: S311 (reproducible windows)
    offsets = chooser.sample(range(int(longest - span) + 1), windows)
    results = [
        Simulation(traces, policy, config, start_seconds=float(o), duration_seconds=span).run()
        for o in offsets
    ]
    return SimResult(
        policy=policy.name,
        availability=sum(r.availability for r in results) / windows,
        cost_vs_on_demand=sum(r.cost_vs_on_demand for r in results) / windows,
        preemptions=sum(r.preemptions for r in results),
        launches=sum(r.launches for r in results),
        refused_launches=sum(r.refused_launches for r in results),
        streams_started=sum(r.streams_started for r in results),
        streams_resumed=sum(r.streams_resumed for r in results),
        streams_rejected=sum(r.streams_rejected for r in results),
        lost_streams=sum(r.lost_streams for r in results),
        hours=sum(r.hours for r in results),
        on_demand_share_of_hours=sum(r.on_demand_share_of_hours for r in results) / windows,
    )
