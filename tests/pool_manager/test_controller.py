"""The reconcile loop against a real registry (moto server) and an in-memory provider."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import pytest

from pool_manager.cold_starts import ColdStarts
from pool_manager.controller import SPOT_PRICES_READ_SECONDS, PoolController
from pool_manager.events import PoolEvent
from pool_manager.policy import HedgedSpotPolicy
from pool_manager.pool_view import (
    Action,
    Drain,
    Launch,
    PlacementOption,
    PolicySettings,
    PoolSnapshot,
    StartWarm,
    StopToWarm,
    Terminate,
    TerminateWarm,
    WarmAction,
    WarmInstance,
)
from pool_manager.provider import (
    CapacityRefused,
    Instance,
    ProviderError,
    StartRefused,
    StoppedInstance,
)
from pool_manager.sim.config import SimConfig
from pool_manager.sim.simulator import Simulation
from pool_manager.sim.traces import ZoneTrace
from pool_manager.sizing import BACKLOG_FINISH_MARGIN_SECONDS
from spotgate.registry import (
    AgentRecord,
    AgentState,
    BatchBacklog,
    LaunchRecord,
    PoolForecast,
    Registry,
)
from tests.support.clocks import FakeClock

MODEL = "m"
A = PlacementOption("g5.xlarge", "zone-a", 0.4, 1.0)
B = PlacementOption("g5.xlarge", "zone-b", 0.5, 1.0)
SETTINGS = PolicySettings(
    placements=(A, B),
    min_agents=0,
    max_agents=4,
    target_streams_per_agent=10,
    spot_overprovision=0,
    on_demand_fallback=False,
    scale_down_idle_seconds=600,
    launch_timeout_seconds=900,
    heartbeat_timeout_seconds=30,
    on_demand_hold_seconds=0,
)


class MemoryProvider:
    """Instances as plain records; placements in `full` refuse spot launches, those in
    `no_on_demand` warm starts."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.running: dict[str, Instance] = {}
        self.stopped_instances: dict[str, StoppedInstance] = {}
        self.full: set[tuple[str, str]] = set()
        self.no_on_demand: set[tuple[str, str]] = set()
        self.noticed: dict[str, float] = {}
        self.launched: list[Launch] = []
        self.prices: dict[tuple[str, str], float] = {}
        self.prices_unreadable = False
        self.price_reads = 0
        self._count = 0

    async def launch(self, model: str, launch: Launch) -> Instance:
        if launch.lifecycle == "spot" and launch.placement in self.full:
            raise CapacityRefused(launch, "InsufficientInstanceCapacity")
        self._count += 1
        instance = Instance(
            f"i-{self._count}", f"i-{self._count}", model, launch.lifecycle,
            launch.instance_type, launch.zone, self.clock(), for_warm_pool=launch.for_warm_pool,
        )  # fmt: skip
        self.running[instance.instance_id] = instance
        self.launched.append(launch)
        return instance

    async def instances(self) -> list[Instance]:
        return list(self.running.values())

    async def terminate(self, instance_id: str) -> None:
        self.running.pop(instance_id, None)
        self.stopped_instances.pop(instance_id, None)

    async def stop(self, instance_id: str) -> None:
        i = self.running.pop(instance_id)
        self.stopped_instances[instance_id] = StoppedInstance(
            i.instance_id, i.agent_id, i.model, i.instance_type, i.zone, self.clock()
        )

    async def start(self, stopped: StoppedInstance) -> Instance:
        if (stopped.instance_type, stopped.zone) in self.no_on_demand:
            raise StartRefused("InsufficientInstanceCapacity")
        del self.stopped_instances[stopped.instance_id]
        instance = Instance(
            stopped.instance_id, stopped.agent_id, stopped.model, "on-demand",
            stopped.instance_type, stopped.zone, self.clock(), boot="warm",
        )  # fmt: skip
        self.running[instance.instance_id] = instance
        return instance

    async def stopped(self) -> list[StoppedInstance]:
        return list(self.stopped_instances.values())

    async def interruption_noticed(self, instance_id: str, deadline: float) -> None:
        self.noticed[instance_id] = deadline

    async def spot_prices(
        self, placements: Sequence[tuple[str, str]]
    ) -> dict[tuple[str, str], float]:
        self.price_reads += 1
        if self.prices_unreadable:
            raise ProviderError("describe_spot_price_history failed: throttled")
        return {key: price for key, price in self.prices.items() if key in placements}


@pytest.fixture
def provider(clock: FakeClock) -> MemoryProvider:
    return MemoryProvider(clock)


@pytest.fixture
def controller(registry: Registry, provider: MemoryProvider, clock: FakeClock) -> PoolController:
    return PoolController(
        registry=registry, provider=provider, settings=SETTINGS, models=(MODEL,), clock=clock
    )


async def register_ready(registry: Registry, instance: Instance, active: int = 0) -> None:
    await registry.register(
        AgentRecord(
            agent_id=instance.agent_id,
            url=f"http://{instance.agent_id}",
            model=instance.model,
            state=AgentState.READY,
            capacity=10,
            active=active,
            lifecycle=instance.lifecycle,
            instance_type=instance.instance_type,
            zone=instance.zone,
            ready_at=instance.launched_at,
        )
    )


async def test_an_idle_model_launches_nothing(controller: PoolController) -> None:
    report = await controller.reconcile()
    assert report.targets == {MODEL: 0}
    assert report.actions == []


async def test_queued_requests_scale_from_zero(
    controller: PoolController, registry: Registry, provider: MemoryProvider
) -> None:
    await registry.publish_demand(MODEL, "gw-1", pending=1, active=0)
    report = await controller.reconcile()
    assert report.targets == {MODEL: 1}
    assert provider.launched == [Launch("g5.xlarge", "zone-a", "spot")]
    # the next pass sees the booting instance and launches nothing more
    assert (await controller.reconcile()).actions == []


async def test_batch_work_that_would_miss_its_window_adds_spot_beyond_the_target(
    controller: PoolController, registry: Registry, provider: MemoryProvider, clock: FakeClock
) -> None:
    due = clock() + BACKLOG_FINISH_MARGIN_SECONDS + 3600  # an hour to do it in
    backlog = BatchBacklog(stream_seconds=15 * 3600, due_at=due)  # 15 streams for the hour
    await registry.publish_demand(MODEL, "gw-1", pending=0, active=5, backlog=backlog)
    report = await controller.reconcile()
    assert report.targets == {MODEL: 1}  # the interactive streams' agent
    # and one spot agent for the 10 streams the target's 5 spare ones leave undone
    assert provider.launched == [Launch("g5.xlarge", z, "spot") for z in ("zone-a", "zone-b")]
    await registry.set_pool_target(MODEL, 1)  # a size fixed by hand is the size
    await controller.reconcile()
    assert len(provider.running) == 1
    # A batch of a model the pool does not serve asks for nothing.
    await registry.publish_demand("made-up", "gw-1", pending=0, active=0, backlog=backlog)
    await controller.reconcile()
    assert len(provider.running) == 1


async def test_spot_goes_where_it_is_cheapest_now_read_every_few_minutes(
    controller: PoolController, registry: Registry, provider: MemoryProvider, clock: FakeClock
) -> None:
    provider.prices = {B.key: 0.10}  # zone-b is cheaper than zone-a's configured 0.40 today
    await registry.set_pool_target(MODEL, 1)
    await controller.reconcile()
    assert provider.launched == [Launch("g5.xlarge", "zone-b", "spot")]
    provider.prices_unreadable = True
    clock.advance(SPOT_PRICES_READ_SECONDS - 1)
    await controller.reconcile()
    assert provider.price_reads == 1  # not due yet
    clock.advance(1)
    await controller.reconcile()  # due: the read fails, the last prices stay
    assert provider.price_reads == 2
    assert controller.spot_prices == {B.key: 0.10}


async def test_a_refused_placement_is_marked_and_the_next_one_tried_in_the_same_pass(
    controller: PoolController, registry: Registry, provider: MemoryProvider, clock: FakeClock
) -> None:
    provider.full.add(A.key)
    await registry.publish_demand(MODEL, "gw-1", pending=15, active=0)
    report = await controller.reconcile()
    assert report.refused == [Launch("g5.xlarge", "zone-a", "spot")]
    assert provider.launched == [Launch("g5.xlarge", "zone-b", "spot")] * 2
    assert controller.risky_until[A.key] == clock() + controller.risky_placement_seconds


async def test_an_interruption_drains_the_agent_and_its_replacement_launches_in_the_same_loop(
    controller: PoolController, registry: Registry, provider: MemoryProvider, clock: FakeClock
) -> None:
    await controller.registry.set_pool_target(MODEL, 1)
    await controller.reconcile()
    (first,) = provider.running.values()
    await register_ready(registry, first, active=3)
    event = PoolEvent("interruption", first.instance_id, clock(), deadline=clock() + 120)
    await controller.handle_event(event)
    record = await registry.get_agent(first.agent_id)
    assert record is not None
    assert record.state is AgentState.DRAINING
    assert record.drain_deadline == clock() + 120
    assert provider.noticed == {first.instance_id: clock() + 120}
    report = await controller.reconcile()  # the same loop iteration
    assert [a for a in report.actions if isinstance(a, Launch)] == [
        Launch("g5.xlarge", "zone-b", "spot")  # zone-a just preempted: avoided
    ]


async def test_a_rebalance_replaces_first_then_drains(
    controller: PoolController, registry: Registry, provider: MemoryProvider, clock: FakeClock
) -> None:
    await registry.set_pool_target(MODEL, 1)
    await controller.reconcile()
    (first,) = provider.running.values()
    await register_ready(registry, first, active=2)
    await controller.handle_event(PoolEvent("rebalance", first.instance_id, clock()))
    report = await controller.reconcile()
    assert [type(a).__name__ for a in report.actions] == ["Launch"]
    second = next(i for i in provider.running.values() if i != first)
    await register_ready(registry, second)
    report = await controller.reconcile()
    assert [(type(a).__name__, getattr(a, "agent_id", "")) for a in report.actions] == [
        ("Drain", first.agent_id)
    ]
    record = await registry.get_agent(first.agent_id)
    assert record is not None
    assert record.state is AgentState.DRAINING


async def test_a_stopped_instance_marks_its_agent_gone(
    controller: PoolController, registry: Registry, provider: MemoryProvider, clock: FakeClock
) -> None:
    await registry.set_pool_target(MODEL, 1)
    await controller.reconcile()
    (first,) = provider.running.values()
    await register_ready(registry, first)
    event = PoolEvent("state-change", first.instance_id, clock(), state="terminated")
    await controller.handle_event(event)
    record = await registry.get_agent(first.agent_id)
    assert record is not None
    assert record.state is AgentState.GONE


async def test_a_stop_event_of_a_boot_before_a_warm_start_leaves_the_new_boot_alone(
    registry: Registry, provider: MemoryProvider, clock: FakeClock
) -> None:
    controller, policy = scripted(registry, provider, clock)
    policy.rounds = [[Launch(A.instance_type, A.zone, "on-demand")]]
    await controller.reconcile()
    (first,) = provider.running.values()
    policy.rounds = [[StopToWarm(first.agent_id, "idle")]]
    await controller.reconcile()
    stopped_at = clock()
    clock.advance(30)
    policy.rounds = [[StartWarm(first.instance_id, "cover")]]
    await controller.reconcile()
    started = provider.running[first.instance_id]
    await register_ready(registry, started)

    # EventBridge's word of the stop, read only now (a slow queue, a pool manager restart).
    late = PoolEvent("state-change", first.instance_id, stopped_at, state="stopped")
    await controller.handle_event(late)
    record = await registry.get_agent(first.agent_id)
    assert record is not None
    assert record.state is AgentState.READY
    assert set(await registry.get_launches([first.agent_id])) == {first.agent_id}


async def test_events_for_other_instances_are_ignored(
    controller: PoolController, clock: FakeClock
) -> None:
    await controller.handle_event(PoolEvent("interruption", "i-stranger", clock(), clock()))
    assert controller.risky_until == {}


async def test_reaper_terminates_silent_and_never_ready_instances(
    controller: PoolController, registry: Registry, provider: MemoryProvider, clock: FakeClock
) -> None:
    await registry.set_pool_target(MODEL, 2)
    await controller.reconcile()
    silent, never = provider.running.values()
    await register_ready(registry, silent)
    clock.advance(901)  # the heartbeat stopped long ago; the other never registered
    report = await controller.reconcile()
    terminated = {a.agent_id: a.reason for a in report.actions if isinstance(a, Terminate)}
    assert terminated == {
        silent.agent_id: "heartbeat stopped",
        never.agent_id: "not ready within the launch timeout",
    }
    record = await registry.get_agent(silent.agent_id)
    assert record is not None
    assert record.state is AgentState.GONE
    # replacements in the same pass keep the target
    assert len(provider.running) == 2
    assert not {silent.instance_id, never.instance_id} & set(provider.running)


async def test_scale_down_waits_for_the_idle_time_and_drains(
    controller: PoolController, registry: Registry, provider: MemoryProvider, clock: FakeClock
) -> None:
    await registry.publish_demand(MODEL, "gw-1", pending=0, active=15)
    await controller.reconcile()
    for instance in provider.running.values():
        await register_ready(registry, instance, active=7)
    await registry.publish_demand(MODEL, "gw-1", pending=0, active=5)
    assert (await controller.reconcile()).targets == {MODEL: 2}  # hysteresis holds
    clock.advance(601)
    for instance in provider.running.values():
        await registry.heartbeat(instance.agent_id, 3)
    await registry.publish_demand(MODEL, "gw-1", pending=0, active=5)
    report = await controller.reconcile()
    assert report.targets == {MODEL: 1}
    assert [type(a).__name__ for a in report.actions] == ["Drain"]  # busy: drained, not cut


async def test_a_restarted_pool_manager_scales_down_only_after_the_idle_time(
    registry: Registry, provider: MemoryProvider, clock: FakeClock
) -> None:
    def started() -> PoolController:
        return PoolController(
            registry=registry, provider=provider, settings=SETTINGS, models=(MODEL,), clock=clock
        )

    await registry.publish_demand(MODEL, "gw-1", pending=0, active=15)
    await started().reconcile()
    for instance in provider.running.values():
        await register_ready(registry, instance)
    await registry.publish_demand(MODEL, "gw-1", pending=0, active=0)  # a lull

    restarted = started()  # a deploy, or a crash: what it knew of the pool's sizing is gone
    report = await restarted.reconcile()
    assert report.targets == {MODEL: 2}  # as the run before would have held it
    assert [a for a in report.actions if isinstance(a, Drain | Terminate)] == []
    clock.advance(601)
    for instance in provider.running.values():
        await registry.heartbeat(instance.agent_id, 0)
    assert (await restarted.reconcile()).targets == {MODEL: 0}


async def test_pool_scale_fixes_the_count_until_auto(
    controller: PoolController, registry: Registry, provider: MemoryProvider
) -> None:
    await registry.set_pool_target(MODEL, 3)
    assert (await controller.reconcile()).targets == {MODEL: 3}
    assert len(provider.running) == 3
    await registry.set_pool_target(MODEL, None)
    await registry.publish_demand(MODEL, "gw-1", pending=1, active=0)
    assert (await controller.reconcile()).targets == {MODEL: 3}  # then down after idle time


def day_of(capacity_a: list[int], capacity_b: list[int]) -> list[ZoneTrace]:
    return [
        ZoneTrace("zone-a", "p3.2xlarge", 300.0, tuple(capacity_a)),
        ZoneTrace("zone-b", "p3.2xlarge", 300.0, tuple(capacity_b)),
    ]


def simulated(traces: list[ZoneTrace], seconds: float) -> Simulation:
    config = SimConfig(target=2, cold_start_seconds=0.0, tick_seconds=60.0, load=0.0)
    simulation = Simulation(traces, HedgedSpotPolicy(), config, duration_seconds=seconds)
    simulation.run()
    return simulation


def controller_like(
    simulation: Simulation, registry: Registry, provider: MemoryProvider, clock: FakeClock
) -> PoolController:
    return PoolController(
        registry=registry,
        provider=provider,
        settings=simulation.settings,
        models=(MODEL,),
        clock=clock,
    )


async def test_the_controller_and_the_simulator_decide_alike_on_a_refusal(
    registry: Registry, provider: MemoryProvider, clock: FakeClock
) -> None:
    """Both drivers run one reconcile step: a full zone is refused, marked, and avoided."""
    simulation = simulated(day_of([0] * 12, [16] * 12), seconds=60.0)  # one tick
    controller = controller_like(simulation, registry, provider, clock)
    provider.full.add(("p3.2xlarge", "zone-a"))
    await registry.set_pool_target(MODEL, 2)
    report = await controller.reconcile()
    assert report.actions == [action for _, action in simulation.decisions]
    assert Launch("p3.2xlarge", "zone-b", "spot") in report.actions
    assert report.refused  # zone-a, then the pass asked again


async def test_the_controller_and_the_simulator_replace_an_interrupted_agent_alike(
    registry: Registry, provider: MemoryProvider, clock: FakeClock
) -> None:
    """A notice (an EC2 event live, a trace drop simulated) is answered with the same launches."""
    simulation = simulated(day_of([16] * 12, [16] + [0] * 11), seconds=360.0)
    by_tick: dict[float, list[Launch]] = {}
    for at, action in simulation.decisions:
        if isinstance(action, Launch):
            by_tick.setdefault(at, []).append(action)
    controller = controller_like(simulation, registry, provider, clock)
    await registry.set_pool_target(MODEL, 2)
    first = await controller.reconcile()
    assert [a for a in first.actions if isinstance(a, Launch)] == by_tick[0.0]
    for instance in provider.running.values():
        await register_ready(registry, instance)
    await controller.reconcile()  # spot holds the target with its spare: on-demand goes
    (in_b,) = [i for i in provider.running.values() if i.zone == "zone-b"]
    await controller.handle_event(PoolEvent("interruption", in_b.instance_id, clock(), clock()))
    after = await controller.reconcile()
    assert [a for a in after.actions if isinstance(a, Launch)] == by_tick[300.0]
    assert by_tick[300.0] == [Launch("p3.2xlarge", "zone-a", "spot")]  # zone-b avoided


async def test_each_launch_is_vouched_for_and_forgotten_when_its_instance_ends(
    controller: PoolController, registry: Registry, provider: MemoryProvider, clock: FakeClock
) -> None:
    await registry.set_pool_target(MODEL, 2)
    await controller.reconcile()
    first, second = provider.running.values()
    launches = await registry.get_launches([first.agent_id, second.agent_id])
    assert launches[first.agent_id] == LaunchRecord(
        agent_id=first.agent_id,
        model=MODEL,
        instance_type=A.instance_type,
        capacity=A.capacity,
        launched_at=first.launched_at,
    )
    assert set(launches) == {first.agent_id, second.agent_id}

    await register_ready(registry, first)
    stopped = PoolEvent("state-change", first.instance_id, clock(), state="terminated")
    await controller.handle_event(stopped)
    await registry.set_pool_target(MODEL, 0)
    clock.advance(SETTINGS.scale_down_idle_seconds + 1)
    await controller.reconcile()  # `second` never registered: terminated at once
    assert await registry.get_launches([first.agent_id, second.agent_id]) == {}


async def test_a_restarted_pool_manager_vouches_for_the_instances_it_finds(
    registry: Registry, provider: MemoryProvider, clock: FakeClock
) -> None:
    found = Instance("i-9", "i-9", MODEL, "spot", B.instance_type, B.zone, clock())
    stray = Instance("i-10", "i-10", MODEL, "spot", "p5.48xlarge", B.zone, clock())
    provider.running = {"i-9": found, "i-10": stray}
    controller = PoolController(
        registry=registry, provider=provider, settings=SETTINGS, models=(MODEL,), clock=clock
    )
    await registry.set_pool_target(MODEL, 2)
    await controller.reconcile()
    # A type no placement names: nothing vouches for what it would serve (said once).
    assert set(await registry.get_launches(["i-9", "i-10"])) == {"i-9"}
    await controller.reconcile()
    assert (controller.vouched, controller.unvouched) == ({"i-9"}, {"i-10"})

    # Stopped before it ever registered: its record goes all the same.
    await controller.handle_event(PoolEvent("state-change", "i-9", clock(), state="terminated"))
    assert await registry.get_launches(["i-9"]) == {}


async def test_each_model_is_sized_and_placed_on_its_own(
    registry: Registry, provider: MemoryProvider, clock: FakeClock
) -> None:
    # "chat" may run on both placements' type, "code" only on its own type, and at most one.
    code_type = PlacementOption("g6e.xlarge", "zone-a", 0.9, 2.0)
    pool = replace(SETTINGS, placements=(A, B, code_type))
    controller = PoolController(
        registry=registry,
        provider=provider,
        settings=pool,
        model_settings={
            "chat": replace(pool, placements=(A, B)),
            "code": replace(pool, placements=(code_type,), max_agents=1),
        },
        clock=clock,
    )
    await registry.publish_demand("chat", "gw-1", pending=25, active=0)
    report = await controller.reconcile()
    # demand for one model never launches the other
    assert report.targets == {"chat": 3, "code": 0}
    assert {i.model for i in provider.running.values()} == {"chat"}
    assert {launch.instance_type for launch in provider.launched} == {"g5.xlarge"}

    await registry.publish_demand("code", "gw-1", pending=25, active=0)
    report = await controller.reconcile()
    assert report.targets == {"chat": 3, "code": 1}  # code's own bound
    code = [i for i in provider.running.values() if i.model == "code"]
    assert [(i.instance_type, i.zone) for i in code] == [("g6e.xlarge", "zone-a")]


async def test_a_model_the_pool_does_not_serve_gets_no_agents(
    controller: PoolController, registry: Registry, provider: MemoryProvider
) -> None:
    await registry.publish_demand("unlisted", "gw-1", pending=5, active=0)
    await registry.set_pool_target("unlisted", 2)
    report = await controller.reconcile()
    assert report.targets == {MODEL: 0, "unlisted": 0}
    assert provider.launched == []


@dataclass
class Scripted:
    """A policy that asks, round after round, for what the test says, and keeps what it saw."""

    rounds: list[list[Action | WarmAction]] = field(default_factory=list)
    seen: list[PoolSnapshot] = field(default_factory=list)
    name: str = "scripted"

    def decide(self, snapshot: PoolSnapshot, settings: PolicySettings) -> list[Action | WarmAction]:
        self.seen.append(snapshot)
        return self.rounds.pop(0) if self.rounds else []


def scripted(
    registry: Registry, provider: MemoryProvider, clock: FakeClock
) -> tuple[PoolController, Scripted]:
    policy = Scripted()
    controller = PoolController(
        registry=registry, provider=provider, settings=SETTINGS, models=(MODEL,),
        policy=policy, clock=clock,
    )  # fmt: skip
    return controller, policy


async def test_an_agent_stopped_into_the_warm_pool_starts_again_as_a_warm_boot(
    registry: Registry, provider: MemoryProvider, clock: FakeClock
) -> None:
    controller, policy = scripted(registry, provider, clock)
    policy.rounds = [[Launch(A.instance_type, A.zone, "on-demand")]]
    await controller.reconcile()
    (first,) = provider.running.values()
    await register_ready(registry, first)

    clock.advance(10)
    policy.rounds = [[StopToWarm(first.agent_id, "idle")]]
    report = await controller.reconcile()

    assert report.actions == [StopToWarm(first.agent_id, "idle")]
    warm = WarmInstance(first.instance_id, A.instance_type, A.zone, clock.now)
    assert report.warm == [(MODEL, warm)]
    assert report.agents == []
    assert set(provider.stopped_instances) == {first.instance_id}
    record = await registry.get_agent(first.agent_id)
    assert record is not None
    assert record.state is AgentState.GONE  # nothing routes to it
    assert await registry.get_launches([first.agent_id]) == {}  # nor vouches for it
    await controller.reconcile()
    assert policy.seen[-1].warm == (warm,)  # the next pass's policy sees its warm pool

    clock.advance(3600)
    policy.rounds = [[StartWarm(first.instance_id, "on-demand cover")]]
    report = await controller.reconcile()

    assert report.actions == [StartWarm(first.instance_id, "on-demand cover")]
    assert report.warm == []
    assert report.warm_started == frozenset({first.agent_id})
    [(_, booting)] = report.agents
    assert (booting.agent_id, booting.phase, booting.launched_at, booting.warm_boot) == (
        first.agent_id, "starting", clock.now, True,
    )  # fmt: skip  # the reaper gives it the warm start's timeout
    assert await registry.get_agent(first.agent_id) is None  # its last boot's entry removed
    assert set(await registry.get_launches([first.agent_id])) == {first.agent_id}
    started = provider.running[first.instance_id]
    await register_ready(registry, started)  # the same id registers again: a new boot
    await controller.reconcile()
    record = await registry.get_agent(first.agent_id)
    assert record is not None
    assert (record.state, record.boot_kind) == (AgentState.READY, "warm")


async def test_a_warm_start_refused_for_capacity_is_covered_elsewhere_in_the_same_pass(
    registry: Registry, provider: MemoryProvider, clock: FakeClock
) -> None:
    controller, policy = scripted(registry, provider, clock)
    provider.stopped_instances["i-9"] = StoppedInstance(
        "i-9", "i-9", MODEL, A.instance_type, A.zone, clock() - 60
    )
    provider.no_on_demand.add(A.key)
    launch = Launch(B.instance_type, B.zone, "on-demand")
    policy.rounds = [[StartWarm("i-9", "cover")], [launch]]
    report = await controller.reconcile()

    assert report.actions == [launch]  # asked again once the start was refused
    # asked again with the refused placement passed over for on-demand, as a refused launch's
    assert policy.seen[1].on_demand_refused_until[A.key] > clock()
    assert controller.on_demand_refused_until[A.key] > clock()
    assert set(provider.stopped_instances) == {"i-9"}  # still in the warm pool


async def test_warm_instances_are_terminated_and_spot_agents_never_stopped(
    registry: Registry, provider: MemoryProvider, clock: FakeClock
) -> None:
    controller, policy = scripted(registry, provider, clock)
    provider.stopped_instances["i-9"] = StoppedInstance(
        "i-9", "i-9", MODEL, A.instance_type, A.zone, clock() - 60
    )
    policy.rounds = [[Launch(A.instance_type, A.zone, "spot")]]
    await controller.reconcile()
    (spot,) = provider.running.values()
    await register_ready(registry, spot)
    policy.rounds = [
        [TerminateWarm("i-9", "more than the warm pool keeps"), StopToWarm(spot.agent_id, "idle")]
    ]
    report = await controller.reconcile()

    assert report.actions == [TerminateWarm("i-9", "more than the warm pool keeps")]
    assert provider.stopped_instances == {}
    assert set(provider.running) == {spot.instance_id}  # EC2 stops no spot instance that serves


async def test_a_request_for_a_model_at_zero_starts_its_warm_instance(
    registry: Registry, provider: MemoryProvider, clock: FakeClock
) -> None:
    """Scale from zero through the warm pool, with spotgate's policy: the stopped instance
    starts (not a cold on-demand launch), and it is what the forecast waits for."""
    settings = replace(SETTINGS, on_demand_fallback=True, warm_pool_size=1)
    controller = PoolController(
        registry=registry, provider=provider, settings=settings, models=(MODEL,), clock=clock
    )
    provider.stopped_instances["i-9"] = StoppedInstance(
        "i-9", "i-9", MODEL, A.instance_type, A.zone, clock() - 3600
    )
    assert (await controller.reconcile()).actions == []  # idle, and the warm pool is full

    await registry.publish_demand(MODEL, "gw-1", pending=1, active=0)
    report = await controller.reconcile()

    assert StartWarm("i-9", "on-demand cover, from the warm pool") in report.actions
    assert [launch.lifecycle for launch in provider.launched] == ["spot"]  # no cold on-demand
    assert report.warm_started == {"i-9"}
    cold_starts = ColdStarts(default_seconds=600.0)
    cold_starts.observe([(MODEL, agent) for _, agent in report.agents], report.warm_started)
    forecast = cold_starts.forecasts(report.agents, [MODEL], clock(), report.warm_started)
    assert forecast[MODEL] == PoolForecast(clock() + 600.0, 600.0)  # none timed: a cold one's
    cold_starts.samples[("warm", A.key)] = deque([45.0])
    forecast = cold_starts.forecasts(report.agents, [MODEL], clock(), report.warm_started)
    assert forecast[MODEL] == PoolForecast(clock() + 45.0, 45.0)  # the warm start first


async def test_a_model_no_longer_served_loses_its_warm_pool(
    registry: Registry, provider: MemoryProvider, clock: FakeClock
) -> None:
    controller = PoolController(
        registry=registry, provider=provider, settings=replace(SETTINGS, warm_pool_size=1),
        models=(MODEL,), clock=clock,
    )  # fmt: skip
    provider.stopped_instances["i-9"] = StoppedInstance(
        "i-9", "i-9", "retired", A.instance_type, A.zone, clock() - 3600
    )
    report = await controller.reconcile()
    assert TerminateWarm("i-9", "more than the warm pool keeps") in report.actions
    assert provider.stopped_instances == {}
    # the model served tops its own warm pool up: an on-demand agent that boots once
    assert provider.launched == [Launch(A.instance_type, A.zone, "on-demand", for_warm_pool=True)]
