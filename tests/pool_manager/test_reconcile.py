"""The reconcile step both drivers run: rounds, refusals, reaping, sizing (pure, no I/O)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pool_manager.policy import HedgedSpotPolicy
from pool_manager.pool_view import (
    Drain,
    Launch,
    PlacementOption,
    PolicySettings,
    PoolAction,
    PoolAgent,
    Sizing,
    StartWarm,
    StopToWarm,
    Terminate,
    WarmInstance,
)
from pool_manager.reconcile import (
    ON_DEMAND_REFUSED_SECONDS,
    RISKY_PLACEMENT_SECONDS,
    ReconcilePass,
    note_interruption,
    pool_target,
)
from tests.pool_manager.test_controller import SETTINGS, A, B

NOW = 50_000.0


def booting(
    agent_id: str, placement: PlacementOption = A, *, launched_at: float = NOW
) -> PoolAgent:
    return PoolAgent(
        agent_id, "spot", placement.instance_type, placement.zone, "starting", launched_at
    )


def ready(agent_id: str, placement: PlacementOption = A, *, active: int = 0) -> PoolAgent:
    return PoolAgent(
        agent_id, "spot", placement.instance_type, placement.zone, "ready", NOW - 600,
        active_streams=active, heartbeat_at=NOW - 1, ready_at=NOW - 500,
    )  # fmt: skip


def new_pass(target: int, *agents: PoolAgent, settings: PolicySettings = SETTINGS) -> ReconcilePass:
    return ReconcilePass(
        policy=HedgedSpotPolicy(),
        settings=settings,
        now=NOW,
        target=target,
        agents=list(agents),
        risky_until={},
    )


def launches(actions: list[PoolAction]) -> list[Launch]:
    return [action for action in actions if isinstance(action, Launch)]


def test_a_refusal_marks_the_placement_and_the_next_round_tries_another() -> None:
    step = new_pass(1)
    assert step.next_round() == [Launch("g5.xlarge", "zone-a", "spot")]  # cheapest
    step.refused(Launch("g5.xlarge", "zone-a", "spot"))
    assert step.risky_until == {A.key: NOW + RISKY_PLACEMENT_SECONDS}
    assert step.next_round() == [Launch("g5.xlarge", "zone-b", "spot")]
    step.launched(booting("i-1", B))
    assert step.next_round() == []  # nothing refused in that round: the pass is done


def test_a_placement_refused_in_this_pass_is_not_tried_again_in_it() -> None:
    step = new_pass(2)
    for launch in launches(step.next_round()):
        step.refused(launch)  # both placements full
    # every placement is risky: the policy would retry the first to clear, the pass waits
    assert step.next_round() == []


def test_an_on_demand_refusal_moves_on_demand_on_and_leaves_spot_alone() -> None:
    fallback = replace(SETTINGS, on_demand_fallback=True)
    step = new_pass(1, settings=fallback)
    step.risky_until = {A.key: NOW + 60, B.key: NOW + 90}  # spot refused everywhere lately
    actions = step.next_round()
    on_demand = Launch("g5.xlarge", "zone-a", "on-demand")
    assert on_demand in actions
    for launch in launches(actions):
        step.refused(launch)
    assert step.on_demand_refused_until == {A.key: NOW + ON_DEMAND_REFUSED_SECONDS}
    assert step.risky_until[A.key] == NOW + RISKY_PLACEMENT_SECONDS  # the spot launch's
    assert step.next_round() == [  # zone-b, whose spot risk clears first, for both
        Launch("g5.xlarge", "zone-b", "spot"),
        Launch("g5.xlarge", "zone-b", "on-demand"),
    ]


def test_the_rounds_end_after_one_per_placement_and_one_more() -> None:
    step = new_pass(1)
    rounds = 0
    while actions := launches(step.next_round()):
        rounds += 1
        step.refused(replace(actions[0], zone=f"elsewhere-{rounds}"))  # keeps asking again
    assert rounds == len(SETTINGS.placements) + 1


def test_the_dead_are_reaped_and_replaced_in_the_same_round() -> None:
    silent = replace(ready("i-dead", B), heartbeat_at=NOW - 60)
    step = new_pass(1, silent)
    assert step.next_round() == [
        Terminate("i-dead", "heartbeat stopped"),
        Launch("g5.xlarge", "zone-a", "spot"),
    ]


def test_what_a_driver_did_is_not_asked_for_again() -> None:
    busy = ready("i-2", B, active=3)
    step = new_pass(0, ready("i-1"), busy, booting("i-3", B))
    shed = "more spot than the target needs"
    assert sorted(step.next_round(), key=str) == [
        Drain("i-2", shed),  # has streams: drained, never cut
        Terminate("i-1", shed),
        Terminate("i-3", shed),
    ]
    step.terminated("i-1")
    step.terminated("i-3")
    step.drained(replace(busy, phase="draining", drain_deadline=NOW + 300))
    step.refused(Launch("g5.xlarge", "zone-x", "spot"))  # a refusal elsewhere: ask again
    assert step.next_round() == []


@pytest.mark.parametrize(
    ("previous", "pending", "active", "fixed", "expected"),
    [
        (Sizing(0, 0.0), 15, 0, None, Sizing(2, NOW)),  # up at once
        (Sizing(3, NOW - 60), 0, 5, None, Sizing(3, NOW - 60)),  # down only after the idle time
        (Sizing(3, NOW - 600), 0, 5, None, Sizing(1, NOW)),
        (Sizing(3, NOW - 60), 0, 0, 1, Sizing(1, NOW)),  # fixed: no hysteresis
    ],
)
def test_pool_target_sizes_from_streams_or_takes_the_fixed_count(
    previous: Sizing, pending: int, active: int, fixed: int | None, expected: Sizing
) -> None:
    assert pool_target(previous, pending, active, fixed, NOW, SETTINGS) == expected


def test_an_interruption_marks_its_placement_without_touching_the_old_map() -> None:
    before = {B.key: NOW + 5}
    after = note_interruption(before, A.key, NOW)
    assert after == {B.key: NOW + 5, A.key: NOW + RISKY_PLACEMENT_SECONDS}
    assert before == {B.key: NOW + 5}


WARM = replace(SETTINGS, on_demand_fallback=True, warm_pool_size=1)
EVERYWHERE_RISKY = {A.key: NOW + 600, B.key: NOW + 600}


def cover_pass() -> tuple[ReconcilePass, StartWarm]:
    """Target 1, spot refused everywhere, one stopped instance in zone-a: a warm start."""
    stopped = WarmInstance("i-warm", "g5.xlarge", "zone-a", NOW - 600)
    step = replace(new_pass(1, settings=WARM), risky_until=dict(EVERYWHERE_RISKY), warm=[stopped])
    return step, StartWarm("i-warm", "on-demand cover, from the warm pool")


def on_demand(actions: list[PoolAction]) -> list[PoolAction]:
    return [a for a in actions if not (isinstance(a, Launch) and a.lifecycle == "spot")]


def test_a_warm_start_refused_for_capacity_passes_its_placement_over_and_launches_elsewhere() -> (
    None
):
    step, start = cover_pass()
    assert on_demand(step.next_round()) == [start]
    step.start_refused(start)
    assert step.on_demand_refused_until == {A.key: NOW + ON_DEMAND_REFUSED_SECONDS}
    assert on_demand(step.next_round()) == [Launch("g5.xlarge", "zone-b", "on-demand")]


def test_a_drained_agent_stopped_into_the_warm_pool_is_counted_in_it_in_the_same_round() -> None:
    drained = PoolAgent(
        "i-od", "on-demand", "g5.xlarge", "zone-b", "draining", NOW - 900,
        heartbeat_at=NOW - 1, drain_deadline=NOW + 200, ready_at=NOW - 800,
    )  # fmt: skip
    step = new_pass(0, drained, settings=WARM)
    # stopped into the pool (it has room for one), and no launch to fill the pool besides
    assert step.next_round() == [StopToWarm("i-od", "drained, into the warm pool")]
    step.stopped(StopToWarm("i-od", "drained"), WarmInstance("i-od", "g5.xlarge", "zone-b", NOW))
    assert (step.agents, [w.instance_id for w in step.warm]) == ([], ["i-od"])
    step.started(
        StartWarm("i-od", "cover"),
        replace(drained, phase="starting", heartbeat_at=None, drain_deadline=None),
    )
    assert (step.warm, [a.agent_id for a in step.agents]) == ([], ["i-od"])
