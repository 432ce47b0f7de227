from __future__ import annotations

from dataclasses import replace

import pytest
from prometheus_client import generate_latest

from pool_manager.cold_starts import TimedBoot
from pool_manager.controller import PassReport
from pool_manager.events import PoolEvent
from pool_manager.metrics import PoolMetrics, stopped_volume_dollars_per_hour
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
from spotgate.settings import Placement


def agent(
    agent_id: str, phase: str, lifecycle: str = "spot", zone: str = "us-east-1a"
) -> PoolAgent:
    return PoolAgent(agent_id, lifecycle, "g5", zone, phase, 0.0)  # type: ignore[arg-type]


def test_a_pass_counts_its_actions_and_sets_the_gauges() -> None:
    metrics = PoolMetrics()
    report = PassReport(
        targets={"m": 2, "held": 1},
        actions=[
            Launch("g5", "us-east-1a", "spot"),
            Launch("g5", "us-west-2a", "on-demand"),
            Drain("x", "scale down"),
            Terminate("y", "heartbeat stopped"),
        ],
        refused=[Launch("g5", "us-east-1b", "spot")],
        agents=[
            ("m", agent("1", "ready")),
            ("m", agent("2", "ready", zone="us-west-2b")),
            ("m", agent("3", "starting")),
        ],
        held={"held": "OSError: no config.json"},
    )
    metrics.record_pass(report, now=123.0)
    metrics.record_event(PoolEvent("interruption", "i-1", 1.0, deadline=121.0))
    text = generate_latest(metrics.registry).decode()
    for line in (
        'spotgate_pool_launches_total{lifecycle="spot",region="us-east-1"} 1.0',
        'spotgate_pool_launches_total{lifecycle="on-demand",region="us-west-2"} 1.0',
        'spotgate_pool_refused_launches_total{lifecycle="spot",region="us-east-1"} 1.0',
        "spotgate_pool_drains_total 1.0",
        'spotgate_pool_terminations_total{reason="heartbeat stopped"} 1.0',
        'spotgate_pool_events_total{kind="interruption"} 1.0',
        'spotgate_pool_target_agents{model="m"} 2.0',
        'spotgate_pool_launches_held{model="m"} 0.0',
        'spotgate_pool_launches_held{model="held"} 1.0',
        'spotgate_pool_agents{lifecycle="spot",model="m",phase="ready",region="us-east-1"} 1.0',
        'spotgate_pool_agents{lifecycle="spot",model="m",phase="ready",region="us-west-2"} 1.0',
        'spotgate_pool_agents{lifecycle="spot",model="m",phase="starting",region="us-east-1"} 1.0',
        "spotgate_pool_last_pass_timestamp_seconds 123.0",
    ):
        assert line in text, line
    # the next pass replaces the agent gauge: gone agents leave no stale series
    metrics.record_pass(PassReport({"m": 0}, [], [], []), now=124.0)
    assert "spotgate_pool_agents{" not in generate_latest(metrics.registry).decode()


def test_cost_per_hour_and_cold_starts_per_placement() -> None:
    prices = Placement(
        instance_type="g5",
        zone="us-east-1a",
        spot_price_per_hour=0.45,
        on_demand_price_per_hour=1.0,
    )
    metrics = PoolMetrics(placements=(prices,))
    ready = replace(agent("1", "ready"), launched_at=100.0, ready_at=190.0)
    booting = agent("2", "starting", lifecycle="on-demand")
    metrics.record_pass(PassReport({"m": 2}, [], [], [("m", ready), ("m", booting)]), 200.0)
    metrics.record_boots(
        [TimedBoot("cold", ("g5", "us-west-2a"), 90.0), TimedBoot("warm", ("g5", "a"), 20.0)]
    )
    text = generate_latest(metrics.registry).decode()
    for line in (
        'spotgate_pool_cost_dollars_per_hour{lifecycle="spot",region="us-east-1"} 0.45',
        'spotgate_pool_cost_dollars_per_hour{lifecycle="on-demand",region="us-east-1"} 1.0',
        'spotgate_pool_cost_dollars_per_hour{lifecycle="stopped",region="us-east-1"} 0.0',
        'spotgate_pool_cold_start_seconds_count{instance_type="g5",region="us-west-2",'
        'zone="us-west-2a"} 1.0',
        'spotgate_pool_cold_start_seconds_sum{instance_type="g5",region="us-west-2",'
        'zone="us-west-2a"} 90.0',
        'spotgate_pool_cold_start_seconds_bucket{instance_type="g5",le="90.0",'
        'region="us-west-2",zone="us-west-2a"} 1.0',
        'spotgate_pool_warm_start_seconds_count{instance_type="g5",region="a",zone="a"} 1.0',
        'spotgate_pool_warm_start_seconds_sum{instance_type="g5",region="a",zone="a"} 20.0',
    ):
        assert line in text, line


@pytest.mark.parametrize(
    ("gib", "price", "dollars_per_hour"),
    [
        (200, 0.08, 200 * 0.08 / 730),  # the default: a 200 GiB gp3 root volume, $0.0219/h
        (730, 0.08, 0.08),
        (100, 0.0, 0.0),
    ],
)
def test_a_stopped_instance_costs_its_volume(
    gib: float, price: float, dollars_per_hour: float
) -> None:
    assert stopped_volume_dollars_per_hour(gib, price) == pytest.approx(dollars_per_hour)


def test_the_warm_pools_are_counted_and_their_volumes_costed() -> None:
    # Model o's volume is larger than the pool's: its stopped instance costs more.
    metrics = PoolMetrics(stopped_dollars_per_hour=0.25, stopped_dollars_per_hour_by_model={"o": 1})
    warm = [
        ("m", WarmInstance("i-1", "g5", "us-east-1a", 10.0)),
        ("m", WarmInstance("i-2", "g5", "us-west-2b", 20.0)),
        ("n", WarmInstance("i-3", "g5", "us-east-1a", 30.0)),
        ("o", WarmInstance("i-6", "g5", "us-west-2b", 30.0)),
    ]
    actions = [StartWarm("i-4", "cover"), StopToWarm("x", "idle"), TerminateWarm("i-5", "extra")]
    metrics.record_pass(PassReport({"m": 0, "n": 0, "o": 0}, actions, [], [], warm=warm), now=1.0)
    text = generate_latest(metrics.registry).decode()
    for line in (
        'spotgate_pool_warm_instances{model="m"} 2.0',
        'spotgate_pool_warm_instances{model="n"} 1.0',
        'spotgate_pool_warm_instances{model="o"} 1.0',
        'spotgate_pool_cost_dollars_per_hour{lifecycle="stopped",region="us-east-1"} 0.5',
        'spotgate_pool_cost_dollars_per_hour{lifecycle="stopped",region="us-west-2"} 1.25',
        'spotgate_pool_warm_pool_actions_total{action="start"} 1.0',
        'spotgate_pool_warm_pool_actions_total{action="stop"} 1.0',
        'spotgate_pool_warm_pool_actions_total{action="terminate"} 1.0',
    ):
        assert line in text, line
    metrics.record_pass(PassReport({"m": 0}, [], [], []), now=2.0)  # the pools were emptied
    assert "spotgate_pool_warm_instances{" not in generate_latest(metrics.registry).decode()


def test_each_regions_api_is_up_or_not() -> None:
    metrics = PoolMetrics()
    metrics.record_regions(("us-east-1", "us-west-2"), {"us-west-2": "no answer"})
    text = generate_latest(metrics.registry).decode()
    assert 'spotgate_pool_region_api_up{region="us-east-1"} 1.0' in text
    assert 'spotgate_pool_region_api_up{region="us-west-2"} 0.0' in text
