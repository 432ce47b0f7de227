"""One model's share of a simulated pool: its instances, streams, sizing and figures."""

from __future__ import annotations

from dataclasses import dataclass, field

from pool_manager.pool_view import (
    AgentPhase,
    LaunchLifecycle,
    PlacementOption,
    PolicySettings,
    PoolAgent,
    Sizing,
    WarmInstance,
)
from pool_manager.reconcile import model_sizing
from pool_manager.sim.config import (
    SECONDS_PER_HOUR,
    SPOT_PRICE_PER_HOUR,
    SimConfig,
    SimModel,
)
from pool_manager.sim.results import ModelResult
from spotgate.registry.records import BatchBacklog, Demand


@dataclass
class SimInstance:
    """One simulated instance: where it runs, when it is ready, and the streams it holds."""

    agent_id: str
    lifecycle: LaunchLifecycle
    placement: PlacementOption
    launched_at: float
    ready_at: float
    ready: bool = False
    for_warm_pool: bool = False  # boots once, then is stopped into the warm pool
    noticed: bool = False
    drained: bool = False
    dies_at: float | None = None
    streams: list[list[float]] = field(default_factory=list)  # [end time, count]

    @property
    def active(self) -> int:
        """Streams it serves now."""
        return int(sum(count for _, count in self.streams))

    @property
    def serving(self) -> bool:
        """Ready for new streams: up, neither noticed nor drained, not booting for the warm pool."""
        return self.ready and not self.noticed and not self.drained and not self.for_warm_pool

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
            for_warm_pool=self.for_warm_pool,
        )


@dataclass
class _Waiting:
    deadline: float
    count: int
    remaining_seconds: float
    resumed: bool


_COUNTS = (
    "preemptions", "launches", "warm_starts", "refused", "started", "resumed", "rejected", "lost"
)  # fmt: skip


@dataclass
class SimBatch:
    """A model's batch work: stream-seconds left, when it is due, and when it was done."""

    started_at: float
    due_at: float
    left_seconds: float
    done_at: float | None = None

    def run(self, spare_streams: int, now: float, tick_seconds: float) -> None:
        """The streams interactive ones left worked on it for a tick."""
        if self.done_at is not None:
            return
        self.left_seconds -= spare_streams * tick_seconds
        if self.left_seconds <= 0:
            self.done_at = now + tick_seconds

    @property
    def done_hours(self) -> float | None:
        """Hours from the span's opening to the work's end (None: not done)."""
        return None if self.done_at is None else (self.done_at - self.started_at) / 3600


@dataclass
class ModelPool:
    """One model's share of the pool: its settings, sizing, instances, streams and figures."""

    model: SimModel
    settings: PolicySettings
    config: SimConfig
    instances: list[SimInstance] = field(default_factory=list)
    stopped: list[WarmInstance] = field(default_factory=list)  # its warm pool
    waiting: list[_Waiting] = field(default_factory=list)
    sizing: Sizing = field(default_factory=Sizing)
    arrival_credit: float = 0.0
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_COUNTS, 0))
    available_ticks: int = 0
    cost: float = 0.0
    launched_types: set[str] = field(default_factory=set)
    batch: SimBatch | None = None
    batch_sizing: Sizing = field(default_factory=Sizing)

    @property
    def arrivals_per_tick(self) -> float:
        """Streams the model is offered per tick."""
        config = self.config
        per_second = self.model.load * self.model.target * config.streams_per_agent
        return per_second / config.stream_seconds * config.tick_seconds

    def available(self) -> bool:
        """At least the target ready and not draining."""
        return sum(1 for i in self.instances if i.serving) >= self.model.target

    def advance(self, now: float) -> None:
        """Instances past their end disappear; booted ones become ready."""
        for instance in list(self.instances):
            if instance.dies_at is not None and instance.dies_at <= now:
                self.remove(instance, now)
            elif not instance.ready and not instance.noticed and instance.ready_at <= now:
                instance.ready = True

    def remove(self, instance: SimInstance, now: float) -> None:
        """The instance is gone: its unfinished streams wait to be resumed elsewhere."""
        self.instances.remove(instance)
        for end, count in instance.streams:
            if end > now:
                deadline = now + self.config.queue_deadline_seconds
                self.waiting.append(_Waiting(deadline, int(count), end - now, True))

    def move_streams(self, now: float) -> None:
        """Completions, this tick's arrivals, and waiting streams placed on this model's agents."""
        for instance in self.instances:
            instance.streams = [s for s in instance.streams if s[0] > now]
        self.arrival_credit += self.arrivals_per_tick
        arrivals = int(self.arrival_credit)
        self.arrival_credit -= arrivals
        if arrivals:
            deadline = now + self.config.queue_deadline_seconds
            self.waiting.append(_Waiting(deadline, arrivals, self.config.stream_seconds, False))
        self.waiting.sort(key=lambda w: not w.resumed)  # resumes go first
        serving = [i for i in self.instances if i.serving]
        room = {id(i): self.config.streams_per_agent - i.active for i in serving}
        still_waiting = []
        for waiting in self.waiting:
            for instance in sorted(serving, key=lambda i: -room[id(i)]):
                if waiting.count == 0:
                    break
                placed = min(waiting.count, room[id(instance)])
                if placed <= 0:
                    continue
                instance.streams.append([now + waiting.remaining_seconds, placed])
                room[id(instance)] -= placed
                waiting.count -= placed
                self.counts["resumed" if waiting.resumed else "started"] += placed
            if waiting.count == 0:
                continue
            if waiting.deadline <= now:
                self.counts["lost" if waiting.resumed else "rejected"] += waiting.count
            else:
                still_waiting.append(waiting)
        self.waiting = still_waiting
        if self.batch is not None:
            spare = sum(max(0, room[id(i)]) for i in serving)
            self.batch.run(spare, now, self.config.tick_seconds)

    def resize(self, now: float) -> int:
        """The model's target for this pass, sized from its streams (and its batch's spot)."""
        batch = self.batch
        backlog = None
        if batch is not None and batch.done_at is None:
            backlog = BatchBacklog(batch.left_seconds, batch.due_at)
        pending = sum(w.count for w in self.waiting)
        demand = Demand(pending, sum(i.active for i in self.instances), backlog)
        self.sizing, self.batch_sizing = model_sizing(
            self.sizing, self.batch_sizing, demand, None, now, self.settings
        )
        return self.sizing.target

    def result(self, ticks: int) -> ModelResult:
        """The model's figures over `ticks` ticks."""
        config, counts = self.config, self.counts
        on_demand_cost = (
            self.model.target * SPOT_PRICE_PER_HOUR * config.on_demand_price_ratio
            * ticks * config.tick_seconds / SECONDS_PER_HOUR
        )  # fmt: skip
        return ModelResult(
            name=self.model.name,
            target=self.model.target,
            availability=self.available_ticks / ticks if ticks else 0.0,
            cost_vs_on_demand=self.cost / on_demand_cost if on_demand_cost else 0.0,
            preemptions=counts["preemptions"],
            launches=counts["launches"],
            warm_starts=counts["warm_starts"],
            streams_started=counts["started"],
            streams_resumed=counts["resumed"],
            streams_rejected=counts["rejected"],
            lost_streams=counts["lost"],
            instance_types=tuple(sorted(self.launched_types)),
            batch_done_hours=self.batch.done_hours if self.batch is not None else None,
        )
