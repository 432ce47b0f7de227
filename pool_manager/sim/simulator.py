"""Replay spot traces through a placement policy, with a stream workload on the pool.

The pool serves one model (`SimConfig.target`, `SimConfig.load`) or several
(`SimConfig.models`). Each model is sized and placed on its own: its own policy settings
(its placements: the traces of its instance types), sizing, reconcile pass, instances and
streams. They share the pool's spot capacity: spot instances of every model count against
the same (instance type, zone) trace, so a launch into a zone that is full is refused whoever
holds it, and a zone that shrinks preempts among all models' spot instances there. They also
share what the live controller shares between models: the placements marked risky or
refusing on-demand, and the spot prices.

Time advances in ticks. At each tick the simulator applies the traces (a zone whose capacity
falls below the spot instances we hold there preempts the excess: each victim gets the spot
notice and disappears `notice_seconds` later), brings instances up after `cold_start_seconds`
(or after a cold start drawn from `cold_start_samples`: those the live pool observed, as
`spotgate pool boots --json` lists them) and stopped instances of the warm pool after
`warm_start_seconds` (or a warm start drawn from `warm_start_samples`), moves streams
(arrivals, completions, and streams of a disappearing agent resumed on another agent of its
model), then runs the live controller's reconcile step for each model
(`pool_manager.reconcile.ReconcilePass`: sizing, reaping, the policy, the retry after a
refusal; the models take turns going first) and carries out its actions: launches, drains,
terminations, and the warm pool's starts, stops and terminations. A stopped instance serves
nothing and costs its volume only (`SimConfig.stopped_price_per_hour`); an agent booted for
the warm pool serves nothing before it is stopped; only on-demand instances are stopped. A
spot launch into a zone that is full is refused, as the EC2 provider refuses it (an on-demand
one, or a warm start, at `on_demand_refusal_rate`), and the pass marks the placement and asks
again. Spot prices may move (`spot_price_step`): the policy sees the current ones and the cost
counts them. A scale-down drain gives streams `DRAIN_DEADLINE_SECONDS` to finish and hands
back the rest.

Measures, for the pool and for each model: availability (share of ticks with at least the
target agents ready and not draining; for the pool, every model at once), cost relative to
running the target on-demand the whole time (stopped volumes included), spot notices
(preemptions), launches, warm starts, refused launches, and streams: started, resumed on
another agent, rejected (no capacity within the queue deadline: a clear error, nothing lost)
and lost (a started stream that could not be resumed before the deadline).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

from pool_manager.policy import Policy
from pool_manager.pool_view import (
    Drain,
    Launch,
    PlacementKey,
    PolicySettings,
    PoolAction,
    StartWarm,
    StopToWarm,
    TerminateWarm,
    WarmInstance,
)
from pool_manager.reconcile import (
    DRAIN_DEADLINE_SECONDS,
    ReconcilePass,
    note_interruption,
)
from pool_manager.sim.config import (
    SECONDS_PER_HOUR,
    SPOT_PRICE_PER_HOUR,
    SimConfig,
    placements_for,
    placements_of,
    settings_for,
)
from pool_manager.sim.model_pool import ModelPool, SimBatch, SimInstance
from pool_manager.sim.results import SimResult, latest_done, merged_windows
from pool_manager.sim.traces import ZoneTrace

TickObserver = Callable[[float], None]
"""Called at the end of each tick with its time (see `Simulation.run`)."""


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
        self._pools = [
            ModelPool(
                model=model,
                settings=settings_for(config, model.target, placements_of(model, self._placements)),
                config=config,
            )
            for model in config.pool_models()
        ]
        longest = max(t.duration_seconds for t in traces)
        self._start = start_seconds
        self._end = min(longest, start_seconds + (duration_seconds or longest))
        self._rng = random.Random(config.seed)  # noqa: S311 (a reproducible simulation)
        # Its own stream, seeded apart: cold-start draws neither shift nor mirror the others.
        self._boot_rng = random.Random(f"{config.seed}/cold-starts")  # noqa: S311
        self._warm_rng = random.Random(f"{config.seed}/warm-starts")  # noqa: S311
        self._on_demand_rng = random.Random(f"{config.seed}/on-demand")  # noqa: S311
        self._on_demand_refused_until: dict[PlacementKey, float] = {}
        self._price_rng = random.Random(f"{config.seed}/spot-prices")  # noqa: S311
        self._spot_prices = {p.key: p.spot_price_per_hour for p in self._placements}
        self._prices_at = start_seconds
        self._risky_until: dict[PlacementKey, float] = {}
        self.decisions: list[tuple[float, PoolAction]] = []
        """What each reconcile pass carried out, with its time (refused launches left out)."""
        self._next_id = 0
        if config.batch_stream_hours > 0:
            for pool in self._pools:
                due_at = start_seconds + config.batch_window_hours * SECONDS_PER_HOUR
                seconds = config.batch_stream_hours * SECONDS_PER_HOUR
                pool.batch = SimBatch(start_seconds, due_at, seconds)
        if config.warm_pool_filled:
            for pool in self._pools:
                pool.stopped = [self._stopped_before(pool) for _ in range(config.warm_pool_size)]

    def _stopped_before(self, pool: ModelPool) -> WarmInstance:
        """A stopped instance the warm pool holds as the span opens, in its cheapest placement."""
        cheapest = min(pool.settings.placements, key=lambda p: p.on_demand_price_per_hour)
        self._next_id += 1
        stopped_at = self._start - self._config.tick_seconds
        return WarmInstance(
            f"sim-{self._next_id}", cheapest.instance_type, cheapest.zone, stopped_at
        )

    @property
    def settings(self) -> PolicySettings:
        """The policy settings the simulated pool runs with (its first model's, if several)."""
        return self._pools[0].settings

    def spot_held(self, key: PlacementKey) -> dict[str, int]:
        """Spot instances each model holds in a placement (those not yet given notice)."""
        return {pool.model.name: len(self._holding(pool, key)) for pool in self._pools}

    def run(self, observe: TickObserver | None = None) -> SimResult:
        """Step through the span and report; `observe` sees the pool after each tick."""
        config = self._config
        tick = config.tick_seconds
        ticks = available = 0
        cost = on_demand_hours = hours = stopped_hours = 0.0
        stopped_price = config.stopped_price_per_hour
        now = self._start
        while now < self._end:
            self._move_prices(now)
            self._apply_traces(now)
            for pool in self._pools:
                pool.advance(now)
                pool.move_streams(now)
            ticks += 1
            available += self._count_available()
            for pool in self._pools:
                for instance in pool.instances:
                    hours += tick / SECONDS_PER_HOUR
                    if instance.lifecycle == "on-demand":
                        on_demand_hours += tick / SECONDS_PER_HOUR
                    spent = self._price_of(instance) * tick / SECONDS_PER_HOUR
                    cost += spent
                    pool.cost += spent
                stopped = len(pool.stopped) * tick / SECONDS_PER_HOUR
                stopped_hours += stopped
                cost += stopped * stopped_price
                pool.cost += stopped * stopped_price
            self._decide(now, ticks)
            if observe is not None:
                observe(now)
            now += tick
        targets = sum(pool.model.target for pool in self._pools)
        on_demand_cost = (
            targets * SPOT_PRICE_PER_HOUR * config.on_demand_price_ratio * ticks * tick
        ) / SECONDS_PER_HOUR
        return SimResult(
            policy=self._policy.name,
            availability=available / ticks if ticks else 0.0,
            cost_vs_on_demand=cost / on_demand_cost if on_demand_cost else 0.0,
            preemptions=self._total("preemptions"),
            launches=self._total("launches"),
            warm_starts=self._total("warm_starts"),
            refused_launches=self._total("refused"),
            streams_started=self._total("started"),
            streams_resumed=self._total("resumed"),
            streams_rejected=self._total("rejected"),
            lost_streams=self._total("lost"),
            hours=ticks * tick / SECONDS_PER_HOUR,
            on_demand_share_of_hours=on_demand_hours / hours if hours else 0.0,
            stopped_hours=stopped_hours,
            models=[pool.result(ticks) for pool in self._pools],
            batch_stream_hours=config.batch_stream_hours,
            batch_done_hours=latest_done([p.batch.done_hours for p in self._pools if p.batch]),
        )

    def _count_available(self) -> bool:
        """Count this tick for each model that has its target, and say whether all do."""
        every = True
        for pool in self._pools:
            if pool.available():
                pool.available_ticks += 1
            else:
                every = False
        return every

    def _price_of(self, instance: SimInstance) -> float:
        if instance.lifecycle == "on-demand":
            return instance.placement.on_demand_price_per_hour
        return self._spot_prices[instance.placement.key]

    def _total(self, count: str) -> int:
        return sum(pool.counts[count] for pool in self._pools)

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

    @staticmethod
    def _holding(pool: ModelPool, key: PlacementKey) -> list[SimInstance]:
        return [
            i
            for i in pool.instances
            if i.lifecycle == "spot" and not i.noticed and i.placement.key == key
        ]

    def _apply_traces(self, now: float) -> None:
        """A zone holding more spot than its trace allows preempts the excess, any model's."""
        for key in self._traces:
            holders = [(pool, i) for pool in self._pools for i in self._holding(pool, key)]
            excess = len(holders) - self._capacity(key, now)
            if excess <= 0:
                continue
            for pool, victim in self._rng.sample(holders, excess):
                victim.noticed = True
                victim.dies_at = now + self._config.notice_seconds
                pool.counts["preemptions"] += 1
            self._risky_until = note_interruption(
                self._risky_until, key, now, self._config.risky_placement_seconds
            )

    def _decide(self, now: float, tick: int) -> None:
        """Each model's reconcile pass; the models take turns going first."""
        first = tick % len(self._pools)
        for pool in self._pools[first:] + self._pools[:first]:
            self._reconcile(pool, now)

    def _reconcile(self, pool: ModelPool, now: float) -> None:
        """One model's reconcile pass, as the live controller runs it (`ReconcilePass`)."""
        step = ReconcilePass(
            policy=self._policy,
            settings=pool.settings,
            now=now,
            target=pool.resize(now),
            agents=[i.as_agent(now) for i in pool.instances],
            risky_until=self._risky_until,
            risky_seconds=self._config.risky_placement_seconds,
            on_demand_refused_until=self._on_demand_refused_until,
            spot_prices=self._spot_prices,
            warm=list(pool.stopped),
            batch_spot=pool.batch_sizing.target,
        )
        while actions := step.next_round():
            for action in actions:
                if self._carry_out(pool, step, action, now):
                    self.decisions.append((now, action))
        self._risky_until = step.risky_until
        self._on_demand_refused_until = step.on_demand_refused_until

    def _carry_out(
        self, pool: ModelPool, step: ReconcilePass, action: PoolAction, now: float
    ) -> bool:
        """Carry out one action and report it to the pass; False if refused or moot."""
        if isinstance(action, Launch):
            return self._carry_out_launch(pool, step, action, now)
        if isinstance(action, StartWarm):
            return self._start_warm(pool, step, action, now)
        if isinstance(action, TerminateWarm):
            pool.stopped = [w for w in pool.stopped if w.instance_id != action.instance_id]
            step.terminated_warm(action.instance_id)
            return True
        instance = next((i for i in pool.instances if i.agent_id == action.agent_id), None)
        if instance is None:
            return False
        if isinstance(action, Drain):  # its streams get the drain deadline to finish
            instance.drained = True
            instance.dies_at = min(instance.dies_at or math.inf, now + DRAIN_DEADLINE_SECONDS)
            step.drained(instance.as_agent(now))
            return True
        pool.remove(instance, now)
        if isinstance(action, StopToWarm):
            placement = instance.placement
            warm = WarmInstance(instance.agent_id, placement.instance_type, placement.zone, now)
            pool.stopped.append(warm)
            step.stopped(action, warm)
        else:
            step.terminated(instance.agent_id)
        return True

    def _carry_out_launch(
        self, pool: ModelPool, step: ReconcilePass, action: Launch, now: float
    ) -> bool:
        launched = self._launch(pool, action, now)
        if launched is None:
            pool.counts["refused"] += 1
            step.refused(action)
            return False
        step.launched(launched.as_agent(now))
        return True

    def _start_warm(
        self, pool: ModelPool, step: ReconcilePass, action: StartWarm, now: float
    ) -> bool:
        """Start a stopped instance: on-demand capacity, refused as often as a launch."""
        warm = next((w for w in pool.stopped if w.instance_id == action.instance_id), None)
        if warm is None:
            return False
        if self._on_demand_rng.random() < self._config.on_demand_refusal_rate:
            pool.counts["refused"] += 1
            step.start_refused(action)
            return False
        pool.stopped.remove(warm)
        instance = SimInstance(
            agent_id=warm.instance_id,
            lifecycle="on-demand",
            placement=next(p for p in self._placements if p.key == warm.placement),
            launched_at=now,
            ready_at=now + self._warm_start_seconds(),
        )
        pool.instances.append(instance)
        pool.counts["warm_starts"] += 1
        step.started(action, instance.as_agent(now))
        return True

    def _warm_start_seconds(self) -> float:
        """A warm start: one of the observed ones, else the fixed figure."""
        if self._config.warm_start_samples:
            return self._warm_rng.choice(self._config.warm_start_samples)
        return self._config.warm_start_seconds

    def _cold_start_seconds(self) -> float:
        """A launch's cold start: one of the observed ones, else the fixed figure."""
        if self._config.cold_start_samples:
            return self._boot_rng.choice(self._config.cold_start_samples)
        return self._config.cold_start_seconds

    def _launch(self, pool: ModelPool, action: Launch, now: float) -> SimInstance | None:
        """Start one instance of `pool`'s model; None when its placement has no capacity.

        Spot is refused when the trace says the zone is full, whichever models fill it;
        on-demand, at random, for the configured share of launches.
        """
        key = action.placement
        if action.lifecycle == "spot":
            if sum(self.spot_held(key).values()) >= self._capacity(key, now):
                return None
        elif self._on_demand_rng.random() < self._config.on_demand_refusal_rate:
            return None
        placement = next(p for p in self._placements if p.key == key)
        self._next_id += 1
        instance = SimInstance(
            agent_id=f"sim-{self._next_id}",
            lifecycle=action.lifecycle,
            placement=placement,
            launched_at=now,
            ready_at=now + self._cold_start_seconds(),
            for_warm_pool=action.for_warm_pool,
        )
        pool.instances.append(instance)
        pool.counts["launches"] += 1
        pool.launched_types.add(placement.instance_type)
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
        warm_starts=sum(r.warm_starts for r in results),
        refused_launches=sum(r.refused_launches for r in results),
        streams_started=sum(r.streams_started for r in results),
        streams_resumed=sum(r.streams_resumed for r in results),
        streams_rejected=sum(r.streams_rejected for r in results),
        lost_streams=sum(r.lost_streams for r in results),
        hours=sum(r.hours for r in results),
        on_demand_share_of_hours=sum(r.on_demand_share_of_hours for r in results) / windows,
        stopped_hours=sum(r.stopped_hours for r in results),
        models=[
            merged_windows(list(same)) for same in zip(*(r.models for r in results), strict=True)
        ],
        batch_stream_hours=config.batch_stream_hours,
        batch_done_hours=latest_done([r.batch_done_hours for r in results]),
    )
