from __future__ import annotations

from dataclasses import replace

import pytest

from pool_manager.baselines import EvenSpread, OnDemandOnly, SpotCheapestZone, SpotHedge
from pool_manager.policy import HedgedSpotPolicy, margin_cover, reap
from pool_manager.pool_view import (
    Drain,
    Launch,
    PlacementOption,
    PolicySettings,
    PoolAction,
    PoolAgent,
    PoolSnapshot,
    Sizing,
    StartWarm,
    StopToWarm,
    Terminate,
    TerminateWarm,
    WarmInstance,
)
from pool_manager.reconcile import model_sizing
from pool_manager.sizing import (
    BACKLOG_FINISH_MARGIN_SECONDS,
    agents_for_backlog,
    agents_for_demand,
    size_pool,
    sizing_on_start,
)
from spotgate.registry import BatchBacklog, Demand

NOW = 10_000.0
A = PlacementOption("g5.xlarge", "us-east-1a", 0.40, 1.00)
B = PlacementOption("g5.xlarge", "us-east-1b", 0.35, 1.00)
C = PlacementOption("g6.xlarge", "us-east-1c", 0.50, 0.80)
SETTINGS = PolicySettings(
    placements=(A, B, C),
    min_agents=0,
    max_agents=8,
    target_streams_per_agent=10,
    spot_overprovision=1,
    scale_down_idle_seconds=600,
    launch_timeout_seconds=900,
    heartbeat_timeout_seconds=60,
    on_demand_hold_seconds=1800,
)
POLICY = HedgedSpotPolicy()


def agent(
    agent_id: str,
    lifecycle: str = "spot",
    placement: PlacementOption = A,
    phase: str = "ready",
    *,
    active: int = 0,
    launched_at: float = NOW - 3600,
    ready_at: float | None = NOW - 3000,
    heartbeat_at: float | None = NOW - 5,
    drain_deadline: float | None = None,
) -> PoolAgent:
    return PoolAgent(
        agent_id=agent_id,
        lifecycle=lifecycle,  # type: ignore[arg-type]
        instance_type=placement.instance_type,
        zone=placement.zone,
        phase=phase,  # type: ignore[arg-type]
        launched_at=launched_at,
        active_streams=active,
        heartbeat_at=heartbeat_at,
        drain_deadline=drain_deadline,
        ready_at=ready_at if phase != "starting" else None,
    )


def snapshot(target: int, *agents: PoolAgent, risky: dict[tuple[str, str], float] | None = None):
    return PoolSnapshot(now=NOW, target=target, agents=agents, risky_until=risky or {})


def launches(actions: list[object]) -> list[tuple[str, str]]:
    return sorted((a.zone, a.lifecycle) for a in actions if isinstance(a, Launch))


# --- sizing ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pending", "active", "needed"),
    [(0, 0, 0), (1, 0, 1), (0, 10, 1), (5, 6, 2), (40, 0, 4)],
)
def test_agents_for_demand_counts_queued_and_running_streams(
    pending: int, active: int, needed: int
) -> None:
    assert agents_for_demand(pending, active, SETTINGS) == needed


@pytest.mark.parametrize(
    ("previous", "needed", "now", "expected"),
    [
        # scale from zero the moment a request queues
        (Sizing(0, NOW - 5000), 1, NOW, Sizing(1, NOW)),
        # up at once, and the hold restarts
        (Sizing(2, NOW - 100), 5, NOW, Sizing(5, NOW)),
        # demand dropped recently: keep the target
        (Sizing(3, NOW - 599), 1, NOW, Sizing(3, NOW - 599)),
        # demand stayed lower for the idle time: go down (to zero when idle)
        (Sizing(3, NOW - 600), 1, NOW, Sizing(1, NOW)),
        (Sizing(3, NOW - 600), 0, NOW, Sizing(0, NOW)),
        # clamped to max
        (Sizing(0, 0), 50, NOW, Sizing(8, NOW)),
    ],
)
def test_size_pool_goes_up_at_once_and_down_after_the_idle_time(
    previous: Sizing, needed: int, now: float, expected: Sizing
) -> None:
    assert size_pool(previous, needed, now, SETTINGS) == expected


def test_size_pool_never_goes_below_min_agents() -> None:
    floor = replace(SETTINGS, min_agents=2)
    assert size_pool(Sizing(4, 0), 0, NOW, floor) == Sizing(2, NOW)
    assert size_pool(Sizing(0, 0), 0, NOW, floor) == Sizing(2, NOW)


HOUR = 3600.0
DUE = NOW + BACKLOG_FINISH_MARGIN_SECONDS + HOUR  # the work is planned to end in an hour


@pytest.mark.parametrize(
    ("demand", "target", "needed"),
    [
        (Demand(), 0, 0),  # no batch
        (Demand(backlog=BatchBacklog(0.0, DUE)), 0, 0),  # nothing left
        # an hour of one stream, and no agent: one agent (at 10 streams each)
        (Demand(backlog=BatchBacklog(HOUR, DUE)), 0, 1),
        # 25 streams for the hour, no agent: three agents
        (Demand(backlog=BatchBacklog(25 * HOUR, DUE)), 0, 3),
        # the interactive target leaves 2 × 10 − 5 streams: 15 of the 25 fit, one more agent
        (Demand(pending=1, active=4, backlog=BatchBacklog(25 * HOUR, DUE)), 2, 1),
        # what the target leaves is enough: none
        (Demand(active=4, backlog=BatchBacklog(16 * HOUR, DUE)), 2, 0),
        # past its planned end: sized as a minute left, and at most `batch_spot_max_agents`
        (Demand(backlog=BatchBacklog(HOUR, NOW)), 0, 4),
    ],
)
def test_batch_work_asks_for_spot_agents_only_for_what_would_miss_its_window(
    demand: Demand, target: int, needed: int
) -> None:
    assert agents_for_backlog(demand, target, NOW, SETTINGS) == needed


def test_the_backlog_agents_go_back_after_the_idle_time_and_a_fixed_size_has_none() -> None:
    backlog = Demand(backlog=BatchBacklog(25 * HOUR, DUE))
    sizing, batch = model_sizing(Sizing(), Sizing(), backlog, None, NOW, SETTINGS)
    assert (sizing.target, batch.target) == (0, 3)  # no interactive demand: the batch's own
    done = Demand()
    assert model_sizing(sizing, batch, done, None, NOW + 599, SETTINGS)[1].target == 3
    assert model_sizing(sizing, batch, done, None, NOW + 600, SETTINGS)[1].target == 0
    assert model_sizing(sizing, Sizing(), backlog, 2, NOW, SETTINGS)[1].target == 0


def test_batch_agents_are_spot_only_without_margin_or_on_demand_cover() -> None:
    pool = (agent("a", placement=A), agent("b", placement=B))  # target 1 + margin 1, ready
    actions = POLICY.decide(replace(snapshot(1, *pool), batch_spot=2), SETTINGS)
    assert launches(actions) == [("us-east-1b", "spot"), ("us-east-1c", "spot")]
    nowhere = {A.key: NOW + 600, B.key: NOW + 600, C.key: NOW + 600}  # spot refused everywhere
    refused = POLICY.decide(replace(snapshot(1, *pool, risky=nowhere), batch_spot=2), SETTINGS)
    assert all(a.lifecycle == "spot" for a in refused if isinstance(a, Launch))
    idle = (*pool, agent("c", placement=C), agent("d", placement=A))
    shed = POLICY.decide(snapshot(1, *idle), SETTINGS)  # the batch's work done: back to 2
    assert len([a for a in shed if not isinstance(a, Launch)]) == 2


# --- spotgate's policy -------------------------------------------------------------------


def test_scale_from_zero_launches_spread_spot_plus_margin_and_on_demand_cover() -> None:
    actions = POLICY.decide(snapshot(2), SETTINGS)
    # 2 + 1 spot, one per zone (cheapest first); nothing ready yet, so 2 on-demand cover
    # the target in the cheapest on-demand placement
    assert launches(actions) == [
        ("us-east-1a", "spot"),
        ("us-east-1b", "spot"),
        ("us-east-1c", "on-demand"),
        ("us-east-1c", "on-demand"),
        ("us-east-1c", "spot"),
    ]


def test_an_idle_pool_at_target_zero_launches_nothing() -> None:
    assert POLICY.decide(snapshot(0), SETTINGS) == []


def test_steady_pool_with_margin_does_nothing() -> None:
    pool = (agent("a", placement=A), agent("b", placement=B), agent("c", placement=C))
    assert POLICY.decide(snapshot(2, *pool), SETTINGS) == []


def test_spot_is_spread_where_we_hold_fewest() -> None:
    pool = (agent("a1", placement=A), agent("a2", placement=A), agent("b1", placement=B))
    assert launches(POLICY.decide(snapshot(3, *pool), SETTINGS)) == [("us-east-1c", "spot")]


def test_a_noticed_agent_is_replaced_at_once_in_another_zone() -> None:
    pool = (
        agent("a", placement=A, phase="draining", drain_deadline=NOW + 100),
        agent("b", placement=B),
        agent("c", placement=C),
    )
    risky = {A.key: NOW + 1800}
    actions = POLICY.decide(snapshot(2, *pool, risky=risky), SETTINGS)
    # the margin absorbed it (2 ready spot = target): a spot replacement, no on-demand
    assert launches(actions) == [("us-east-1b", "spot")]


def test_spot_goes_where_it_is_cheapest_now() -> None:
    # configured: B (0.35) is the cheapest; today A costs 0.20
    pool = replace(snapshot(0), spot_prices={A.key: 0.20})
    assert POLICY.decide(replace(pool, target=1), SETTINGS)[0] == Launch(
        "g5.xlarge", "us-east-1a", "spot"
    )
    assert POLICY.decide(snapshot(1), SETTINGS)[0] == Launch("g5.xlarge", "us-east-1b", "spot")


def test_placements_that_just_preempted_or_refused_are_avoided() -> None:
    risky = {B.key: NOW + 60, C.key: NOW + 60}
    actions = POLICY.decide(snapshot(1, agent("a", placement=A), risky=risky), SETTINGS)
    assert launches(actions) == [("us-east-1a", "spot")]


def test_when_every_placement_is_risky_the_first_to_clear_is_tried() -> None:
    risky = {A.key: NOW + 300, B.key: NOW + 60, C.key: NOW + 900}
    ready = agent("r", "on-demand", C)
    actions = POLICY.decide(snapshot(1, ready, risky=risky), SETTINGS)
    assert launches(actions) == [("us-east-1b", "spot"), ("us-east-1b", "spot")]


def test_risk_expires() -> None:
    risky = {A.key: NOW - 1, B.key: NOW - 1, C.key: NOW - 1}
    assert len(launches(POLICY.decide(snapshot(2, risky=risky), SETTINGS))) == 5


def test_falls_back_to_on_demand_for_what_ready_spot_cannot_hold() -> None:
    pool = (agent("a", placement=A),)
    risky = {B.key: NOW + 600, C.key: NOW + 600}  # spot refused elsewhere
    actions = POLICY.decide(snapshot(3, *pool, risky=risky), SETTINGS)
    assert launches(actions).count(("us-east-1c", "on-demand")) == 2


def test_on_demand_goes_to_the_next_cheapest_placement_when_the_cheapest_refused() -> None:
    risky = {A.key: NOW + 600, B.key: NOW + 600, C.key: NOW + 600}  # no spot anywhere
    refused = {C.key: NOW + 60}  # the cheapest on-demand (0.80) just refused
    pool = snapshot(1, risky=risky)
    actions = POLICY.decide(replace(pool, on_demand_refused_until=refused), SETTINGS)
    assert ("us-east-1a", "on-demand") in launches(actions)  # 1.00, the next cheapest
    assert ("us-east-1c", "on-demand") in launches(POLICY.decide(pool, SETTINGS))
    everywhere = {A.key: NOW + 90, B.key: NOW + 30, C.key: NOW + 60}
    latest = replace(pool, on_demand_refused_until=everywhere)
    assert ("us-east-1b", "on-demand") in launches(POLICY.decide(latest, SETTINGS))  # clears first


def test_no_on_demand_when_fallback_is_off() -> None:
    no_fallback = replace(SETTINGS, on_demand_fallback=False)
    assert all(a.lifecycle == "spot" for a in POLICY.decide(snapshot(2), no_fallback))  # type: ignore[union-attr]


def test_returns_to_spot_once_spot_held_the_target_for_the_hold_time() -> None:
    spot = (
        agent("a", placement=A, ready_at=NOW - 2000),
        agent("b", placement=B, ready_at=NOW - 1800),
        agent("c", placement=C, ready_at=NOW - 100),  # the margin: not needed to hold
    )
    on_demand = (agent("od1", "on-demand", C, active=3), agent("od2", "on-demand", C))
    actions = POLICY.decide(snapshot(2, *spot, *on_demand), SETTINGS)
    assert sorted(actions, key=str) == [
        Drain("od1", "spot holds the target"),  # has streams: drained, never cut
        Terminate("od2", "spot holds the target"),
    ]


def test_keeps_on_demand_while_spot_is_fresh_and_its_margin_still_booting() -> None:
    # two spot agents have held the target of 2 only since the second came up, 60 s ago
    spot = (
        agent("a", placement=A, ready_at=NOW - 2000),
        agent("b", placement=B, ready_at=NOW - 60),
        agent("c", placement=C, phase="starting"),
    )
    on_demand = (agent("od", "on-demand", C),)
    assert POLICY.decide(snapshot(2, *spot, *on_demand), SETTINGS) == []


def test_returns_to_spot_at_once_when_its_margin_is_ready_too() -> None:
    # fresh spot, but one more than the target: losing any one still leaves the target
    spot = (
        agent("a", placement=A, ready_at=NOW - 2000),
        agent("b", placement=B, ready_at=NOW - 60),
        agent("c", placement=C, ready_at=NOW - 30),
    )
    on_demand = (agent("od", "on-demand", C),)
    actions = POLICY.decide(snapshot(2, *spot, *on_demand), SETTINGS)
    assert actions == [Terminate("od", "spot holds the target")]
    without_margin = replace(SETTINGS, spot_overprovision=0)
    assert POLICY.decide(snapshot(2, *spot[:2], *on_demand), without_margin) == []


def test_scale_down_drains_busy_agents_and_terminates_idle_and_booting_ones() -> None:
    pool = (
        agent("busy", placement=A, active=4),
        agent("idle", placement=B),
        agent("boot", placement=C, phase="starting"),
        agent("keep", placement=A, active=9),
    )
    actions = POLICY.decide(snapshot(1, *pool), SETTINGS)  # spot goal 2: shed 2
    assert sorted(actions, key=str) == [
        Terminate("boot", "more spot than the target needs"),
        Terminate("idle", "more spot than the target needs"),
    ]
    actions = POLICY.decide(snapshot(0, *pool), SETTINGS)
    assert Drain("busy", "more spot than the target needs") in actions
    assert Drain("keep", "more spot than the target needs") in actions
    assert not any(isinstance(a, Launch) for a in actions)


@pytest.mark.parametrize(
    ("agents", "target"),
    [
        ((), 0),
        ((agent("a"), agent("b", phase="starting", heartbeat_at=None)), 2),
        # one draining, one booting for the warm pool: neither serves the target
        ((agent("a"), agent("d", phase="draining"), replace(agent("w"), for_warm_pool=True)), 1),
        (tuple(agent(f"a{n}") for n in range(10)), 8),  # no more than max_agents
    ],
)
def test_a_started_pool_manager_takes_the_agents_serving_as_needed_until_now(
    agents: tuple[PoolAgent, ...], target: int
) -> None:
    assert sizing_on_start(agents, NOW, SETTINGS) == Sizing(target=target, needed_at=NOW)


# --- reaper ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pool_agent", "reason"),
    [
        (agent("x", phase="starting", heartbeat_at=None, launched_at=NOW - 901), "launch timeout"),
        # started from the warm pool 10 minutes ago and still not up: stuck
        (
            replace(agent("x", "on-demand", phase="starting", heartbeat_at=None), warm_boot=True),
            "warm start timeout",
        ),
        (agent("x", heartbeat_at=NOW - 61), "heartbeat stopped"),
        (agent("x", phase="draining", drain_deadline=NOW + 60), "drained"),
        (agent("x", phase="draining", active=2, drain_deadline=NOW), "drained"),
        (agent("x", phase="draining", drain_deadline=None), "drained"),
    ],
)
def test_reaper_terminates_dead_and_drained_agents(pool_agent: PoolAgent, reason: str) -> None:
    (action,) = reap(snapshot(1, pool_agent), SETTINGS)
    assert action.agent_id == "x"
    assert reason in action.reason


@pytest.mark.parametrize(
    "pool_agent",
    [
        agent("x", phase="starting", heartbeat_at=None, launched_at=NOW - 899),
        replace(
            agent("x", "on-demand", phase="starting", heartbeat_at=None, launched_at=NOW - 599),
            warm_boot=True,
        ),
        agent("x", heartbeat_at=NOW - 59),
        agent("x", phase="draining", active=2, drain_deadline=NOW + 60),
        agent("x", phase="draining", active=1, drain_deadline=None),
        # 0 streams, but as its last heartbeat before the drain said: it may have more now
        replace(
            agent("x", phase="draining", drain_deadline=NOW + 60), streams_known_since_drain=False
        ),
    ],
)
def test_reaper_leaves_live_agents_alone(pool_agent: PoolAgent) -> None:
    assert reap(snapshot(1, pool_agent), SETTINGS) == []


# --- baselines ---------------------------------------------------------------------------


def test_on_demand_only_keeps_the_target_on_demand() -> None:
    assert launches(OnDemandOnly().decide(snapshot(2), SETTINGS)) == [
        ("us-east-1c", "on-demand"),
        ("us-east-1c", "on-demand"),
    ]
    pool = (
        agent("old", "on-demand", C, launched_at=NOW - 900),
        agent("new", "on-demand", C, launched_at=NOW - 600),
        agent("busy", "on-demand", C, active=5),
    )
    # the newest idle one goes; the busy one keeps serving
    assert OnDemandOnly().decide(snapshot(2, *pool), SETTINGS) == [Terminate("new", "above target")]


def test_spot_cheapest_zone_ignores_risk_and_other_zones() -> None:
    risky = {B.key: NOW + 600}
    actions = SpotCheapestZone().decide(snapshot(2, risky=risky), SETTINGS)
    assert launches(actions) == [("us-east-1b", "spot"), ("us-east-1b", "spot")]


def test_even_spread_keeps_the_margin_and_ignores_risk() -> None:
    risky = {A.key: NOW + 600, B.key: NOW + 600}
    actions = EvenSpread().decide(snapshot(2, risky=risky), SETTINGS)
    assert launches(actions) == [
        ("us-east-1a", "spot"),
        ("us-east-1b", "spot"),
        ("us-east-1c", "spot"),
    ]


def test_rebalance_launches_a_replacement_first_and_keeps_the_agent_serving() -> None:
    pool = (
        replace(agent("a", placement=A), at_risk=True),
        agent("b", placement=B),
        agent("c", placement=C),
    )
    actions = POLICY.decide(snapshot(2, *pool), SETTINGS)
    # zones are counted without the agent at risk, so its own zone is the emptiest
    assert launches(actions) == [("us-east-1a", "spot")]
    assert not any(isinstance(a, Drain | Terminate) for a in actions)


def test_rebalanced_agent_is_drained_once_its_replacement_is_ready() -> None:
    pool = (
        replace(agent("a", placement=A, active=3), at_risk=True),
        agent("b", placement=B),
        agent("c", placement=C),
        agent("new", placement=A, ready_at=NOW - 10),
    )
    assert POLICY.decide(snapshot(2, *pool), SETTINGS) == [
        Drain("a", "replaced ahead of a rebalance")
    ]
    booting = (*pool[:3], agent("new", placement=A, phase="starting"))
    assert POLICY.decide(snapshot(2, *booting), SETTINGS) == []


# --- the warm pool -----------------------------------------------------------------------

WARM = replace(SETTINGS, warm_pool_size=2)
EVERYWHERE_RISKY = {A.key: NOW + 600, B.key: NOW + 600, C.key: NOW + 600}


def stopped(
    instance_id: str, placement: PlacementOption = C, stopped_at: float = NOW - 600
) -> WarmInstance:
    return WarmInstance(instance_id, placement.instance_type, placement.zone, stopped_at)


def warm_bound(agent_id: str, phase: str = "starting") -> PoolAgent:
    return replace(agent(agent_id, "on-demand", C, phase), for_warm_pool=True)


def on_demand_and_warm(actions: list[PoolAction]) -> list[PoolAction]:
    """The actions on on-demand capacity and the warm pool (spot launches left out)."""
    return [
        a
        for a in actions
        if not (isinstance(a, Launch) and a.lifecycle == "spot")
        and not (isinstance(a, Drain | Terminate) and a.agent_id.startswith("spot"))
    ]


def od(zone: PlacementOption, *, for_warm_pool: bool = False) -> Launch:
    return Launch(zone.instance_type, zone.zone, "on-demand", for_warm_pool=for_warm_pool)


COVER = "on-demand cover, from the warm pool"
STALE = "launched before its launch template changed"
A_OTHER_TYPE = PlacementOption("g4dn.xlarge", "us-east-1a", 0.20, 0.50)


@pytest.mark.parametrize(
    ("warm", "refused", "expected"),
    [
        # two needed, two stopped: both started, the cheaper placement's first
        (
            (stopped("w-a", A), stopped("w-c", C)),
            {},
            [StartWarm("w-c", COVER), StartWarm("w-a", COVER)],
        ),
        # one stopped: started; the other launched where on-demand is cheapest
        ((stopped("w-c", C),), {}, [StartWarm("w-c", COVER), od(C)]),
        # its placement just refused on-demand: launches go to the next cheapest placement
        ((stopped("w-c", C),), {C.key: NOW + 60}, [od(A), od(A)]),
        # stopped in this very pass (still stopping): not started
        ((stopped("w-c", C, stopped_at=NOW),), {}, [od(C), od(C)]),
        # stopped a while ago and still stopping (EC2 refuses its start): covered elsewhere,
        # the stopped one started
        (
            (replace(stopped("w-a", A), stopping=True), stopped("w-c", C)),
            {},
            [StartWarm("w-c", COVER), od(C)],
        ),
        # in a placement the model no longer uses: terminated, never started
        (
            (stopped("w-x", A_OTHER_TYPE),),
            {},
            [od(C), od(C), TerminateWarm("w-x", "its placement is not the model's")],
        ),
        # stopping for longer than a stop takes: stuck, terminated, the cover launched
        (
            (replace(stopped("w-c", C, stopped_at=NOW - 901), stopping=True),),
            {},
            [od(C), od(C), TerminateWarm("w-c", "stuck stopping")],
        ),
        # launched before a deploy changed its template: terminated, never started
        (
            (replace(stopped("w-c", C), stale=True), stopped("w-a", A)),
            {},
            [StartWarm("w-a", COVER), od(C), TerminateWarm("w-c", STALE)],
        ),
    ],
)
def test_on_demand_cover_starts_the_warm_pool_first(
    warm: tuple[WarmInstance, ...],
    refused: dict[tuple[str, str], float],
    expected: list[PoolAction],
) -> None:
    pool = replace(
        snapshot(3, agent("spot-a", placement=A), risky=EVERYWHERE_RISKY),
        warm=warm,
        on_demand_refused_until=refused,
    )
    assert on_demand_and_warm(POLICY.decide(pool, WARM)) == expected


INTO_WARM = "spot holds the target: into the warm pool"
HOLDS = "spot holds the target"


@pytest.mark.parametrize(
    ("size", "warm", "expected"),
    [
        (
            2,
            (),
            [Drain("od-busy", HOLDS), StopToWarm("od-1", INTO_WARM), StopToWarm("od-2", INTO_WARM)],
        ),
        (
            2,
            (stopped("w"),),
            # the newest goes first, as when shedding
            [Drain("od-busy", HOLDS), StopToWarm("od-2", INTO_WARM), Terminate("od-1", HOLDS)],
        ),
        (0, (), [Drain("od-busy", HOLDS), Terminate("od-1", HOLDS), Terminate("od-2", HOLDS)]),
    ],
)
def test_shedding_stops_idle_on_demand_agents_into_the_warm_pool_while_it_has_room(
    size: int, warm: tuple[WarmInstance, ...], expected: list[PoolAction]
) -> None:
    spot = (
        agent("spot-a", placement=A),
        agent("spot-b", placement=B),
        agent("spot-c", placement=C),
    )
    on_demand = (
        agent("od-1", "on-demand", C, launched_at=NOW - 900),
        agent("od-2", "on-demand", C, launched_at=NOW - 600),
        agent("od-busy", "on-demand", C, active=4),
    )
    pool = replace(snapshot(2, *spot, *on_demand), warm=warm)
    actions = POLICY.decide(pool, replace(SETTINGS, warm_pool_size=size))
    assert sorted(actions, key=str) == expected  # a busy one drains: the reaper stops it


BOOTED = "booted once: into the warm pool"
TRIM = "more than the warm pool keeps"


@pytest.mark.parametrize(
    ("size", "agents", "warm", "expected"),
    [
        # empty: topped up by on-demand agents that boot once, even with the model at zero
        (2, (), (), [od(C, for_warm_pool=True), od(C, for_warm_pool=True)]),
        # one stopped and one on its way: nothing to do
        (2, (warm_bound("wb"),), (stopped("w"),), []),
        # the one on its way is up: stopped into the pool
        (2, (warm_bound("wb", "ready"),), (stopped("w"),), [StopToWarm("wb", BOOTED)]),
        # more than the size: the dearest placement's, then the oldest, go
        (
            1,
            (),
            (
                stopped("w-c", C, NOW - 100),
                stopped("w-a1", A, NOW - 50),
                stopped("w-a2", A, NOW - 900),
            ),
            [TerminateWarm("w-a2", TRIM), TerminateWarm("w-a1", TRIM)],
        ),
        # one launched before a deploy: terminated, and a fresh one boots in its stead
        (
            1,
            (),
            (replace(stopped("w-old", C), stale=True),),
            [TerminateWarm("w-old", STALE), od(C, for_warm_pool=True)],
        ),
        # one stuck stopping: no longer counted, so the pool is refilled
        (
            1,
            (),
            (replace(stopped("w-stuck", C, NOW - 901), stopping=True),),
            [TerminateWarm("w-stuck", "stuck stopping"), od(C, for_warm_pool=True)],
        ),
    ],
)
def test_the_warm_pool_is_topped_up_and_trimmed(
    size: int,
    agents: tuple[PoolAgent, ...],
    warm: tuple[WarmInstance, ...],
    expected: list[PoolAction],
) -> None:
    pool = replace(snapshot(0, *agents), warm=warm)
    assert POLICY.decide(pool, replace(SETTINGS, warm_pool_size=size)) == expected


def test_on_demand_agents_serving_as_cover_count_towards_the_warm_pool() -> None:
    # The cover came from the warm pool and goes back to it once spot holds the target again:
    # refilling the pool now would boot an instance only to terminate one later.
    cover = (agent("od-1", "on-demand", C), agent("od-2", "on-demand", C))
    pool = replace(snapshot(2, *cover, risky=EVERYWHERE_RISKY), warm=())
    assert not [a for a in POLICY.decide(pool, WARM) if isinstance(a, Launch) and a.for_warm_pool]


@pytest.mark.parametrize(
    ("pool_agent", "warm", "expected"),
    [
        (
            agent("od", "on-demand", C, "draining"),
            (),
            StopToWarm("od", "drained, into the warm pool"),
        ),
        (
            agent("od", "on-demand", C, "draining"),
            (stopped("w1"), stopped("w2")),
            Terminate("od", "drained"),
        ),
        (agent("spot", "spot", C, "draining"), (), Terminate("spot", "drained")),
        (
            agent("od", "on-demand", C, "draining", heartbeat_at=NOW - 61),
            (),
            Terminate("od", "heartbeat stopped"),
        ),
    ],
)
def test_the_reaper_stops_drained_on_demand_agents_into_the_warm_pool_while_it_has_room(
    pool_agent: PoolAgent, warm: tuple[WarmInstance, ...], expected: PoolAction
) -> None:
    assert reap(replace(snapshot(1, pool_agent), warm=warm), WARM) == [expected]


def test_no_warm_actions_without_a_warm_pool() -> None:
    """A driver that keeps no warm pool (warm_pool_size 0, nothing stopped) gets none."""
    on_demand = (agent("od-1", "on-demand", C), agent("od-2", "on-demand", C, "draining"))
    for target in (0, 1, 3):
        pool = snapshot(target, *on_demand, risky=EVERYWHERE_RISKY)
        actions = [*reap(pool, SETTINGS), *POLICY.decide(pool, SETTINGS)]
        assert all(isinstance(a, Launch | Drain | Terminate) for a in actions)
        assert not any(isinstance(a, Launch) and a.for_warm_pool for a in actions)


@pytest.mark.parametrize(
    ("risky", "cover"),
    [
        ({}, 0),  # spot can still place its margin somewhere: no cover while target holds
        ({A.key: NOW + 600}, 0),
        (EVERYWHERE_RISKY, 1),  # nowhere left: the margin is covered on-demand too
    ],
)
def test_the_on_demand_margin_covers_spot_s_margin_only_where_spot_has_nowhere_to_go(
    risky: dict[tuple[str, str], float], cover: int
) -> None:
    spot = (agent("spot-a", placement=A), agent("spot-b", placement=B))  # target 2, no margin
    margin = replace(SETTINGS, on_demand_margin=True)
    actions = POLICY.decide(snapshot(2, *spot, risky=risky), margin)
    assert launches(actions).count(("us-east-1c", "on-demand")) == cover
    assert (
        launches(POLICY.decide(snapshot(2, *spot, risky=risky), SETTINGS)).count(
            ("us-east-1c", "on-demand")
        )
        == 0
    )


HOURS = 3600.0
MARGIN = replace(SETTINGS, on_demand_margin=True)


@pytest.mark.parametrize(
    ("settings", "target", "spot", "cover_since", "risky", "expected"),
    [
        # target 2, one spot agent in each of A and B, ready 50 min ago: the margin is covered
        (MARGIN, 2, ((A, 3000), (B, 3000)), None, EVERYWHERE_RISKY, 1),
        (SETTINGS, 2, ((A, 3000), (B, 3000)), None, EVERYWHERE_RISKY, 0),  # not asked for
        (MARGIN, 2, ((A, 3000), (B, 3000)), None, {A.key: NOW + 600}, 0),  # spot can place it
        (MARGIN, 2, ((A, 3000), (A, 3000)), None, EVERYWHERE_RISKY, 0),  # one drop takes both
        # the newest spot agent came up 9 h ago: the pool has held still, no cover
        (MARGIN, 2, ((A, 9 * HOURS), (B, 10 * HOURS)), None, EVERYWHERE_RISKY, 0),
        (MARGIN, 2, ((A, 9 * HOURS), (B, 600)), None, EVERYWHERE_RISKY, 1),
        # target 3 and one ready spot agent: on-demand carries two, more than the margin;
        # the margin comes only once that cover has run for the shortage time
        (MARGIN, 3, ((A, 3000),), 600.0, EVERYWHERE_RISKY, 0),
        (MARGIN, 3, ((A, 3000),), 1800.0, EVERYWHERE_RISKY, 1),
        (MARGIN, 3, ((A, 3000),), None, EVERYWHERE_RISKY, 0),  # no cover running yet
        (MARGIN, 2, (), None, EVERYWHERE_RISKY, 0),  # no spot ready: on-demand holds it all
    ],
)
def test_the_on_demand_margin_is_held_only_while_a_loss_it_absorbs_is_likely(
    settings: PolicySettings,
    target: int,
    spot: tuple[tuple[PlacementOption, float], ...],
    cover_since: float | None,
    risky: dict[tuple[str, str], float],
    expected: int,
) -> None:
    ready = [
        agent(f"spot-{n}", placement=p, launched_at=NOW - age - 120, ready_at=NOW - age)
        for n, (p, age) in enumerate(spot)
    ]
    cover = (
        []
        if cover_since is None
        else [agent(f"od-{n}", "on-demand", C, launched_at=NOW - cover_since) for n in range(2)]
    )
    pool = snapshot(target, *ready, *cover, risky=risky)
    assert margin_cover(target, ready, cover, pool, settings) == expected


# --- SpotHedge, for comparison -----------------------------------------------------------


@pytest.mark.parametrize(
    ("ready_spot", "on_demand", "expected"),
    [
        # max(0, min(target, target + 1 - ready spot)) on-demand, target 2
        (3, 0, []),
        (2, 0, [od(C)]),  # unlike spotgate's: the margin missing is covered too
        (1, 0, [od(C), od(C)]),
        (0, 0, [od(C), od(C)]),  # never more than the target
        (3, 2, [Terminate("od-1", "spot recovered"), Terminate("od-0", "spot recovered")]),
        (2, 2, [Terminate("od-1", "spot recovered")]),  # dropped as soon as spot recovers
    ],
)
def test_spothedge_runs_on_demand_for_each_ready_spot_agent_short_of_target_plus_one(
    ready_spot: int, on_demand: int, expected: list[PoolAction]
) -> None:
    placements = (A, B, C)
    spot = [agent(f"spot-{n}", placement=placements[n]) for n in range(ready_spot)]
    booting = [
        agent(f"spot-new-{n}", placement=placements[n], phase="starting")
        for n in range(ready_spot, 3)
    ]
    cover = [agent(f"od-{n}", "on-demand", C, launched_at=NOW - 900 + n) for n in range(on_demand)]
    pool = replace(snapshot(2, *spot, *booting, *cover), warm=(stopped("w"),))
    actions = SpotHedge().decide(pool, WARM)
    assert actions[0] == TerminateWarm("w", "this policy keeps no warm pool")
    assert on_demand_and_warm(actions[1:]) == expected


def test_the_baselines_keep_no_warm_pool() -> None:
    pool = replace(snapshot(1), warm=(stopped("w"),))
    for policy in (OnDemandOnly(), SpotCheapestZone(), EvenSpread()):
        assert TerminateWarm("w", "this policy keeps no warm pool") in policy.decide(pool, WARM)
