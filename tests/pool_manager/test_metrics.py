from __future__ import annotations

from prometheus_client import generate_latest

from pool_manager.controller import PassReport
from pool_manager.events import PoolEvent
from pool_manager.metrics import PoolMetrics
from pool_manager.policy import Drain, Launch, PoolAgent, Terminate


def agent(agent_id: str, phase: str, lifecycle: str = "spot") -> PoolAgent:
    return PoolAgent(agent_id, lifecycle, "g5", "a", phase, 0.0)  # type: ignore[arg-type]


def test_a_pass_counts_its_actions_and_sets_the_gauges() -> None:
    metrics = PoolMetrics()
    report = PassReport(
        targets={"m": 2},
        actions=[
            Launch("g5", "a", "spot"),
            Launch("g5", "a", "on-demand"),
            Drain("x", "scale down"),
            Terminate("y", "heartbeat stopped"),
        ],
        refused=[Launch("g5", "b", "spot")],
        agents=[
            ("m", agent("1", "ready")),
            ("m", agent("2", "ready")),
            ("m", agent("3", "starting")),
        ],
    )
    metrics.record_pass(report, now=123.0)
    metrics.record_event(PoolEvent("interruption", "i-1", 1.0, deadline=121.0))
    text = generate_latest(metrics.registry).decode()
    for line in (
        'spotgate_pool_launches_total{lifecycle="spot"} 1.0',
        'spotgate_pool_launches_total{lifecycle="on-demand"} 1.0',
        'spotgate_pool_refused_launches_total{lifecycle="spot"} 1.0',
        "spotgate_pool_drains_total 1.0",
        'spotgate_pool_terminations_total{reason="heartbeat stopped"} 1.0',
        'spotgate_pool_events_total{kind="interruption"} 1.0',
        'spotgate_pool_target_agents{model="m"} 2.0',
        'spotgate_pool_agents{lifecycle="spot",model="m",phase="ready"} 2.0',
        'spotgate_pool_agents{lifecycle="spot",model="m",phase="starting"} 1.0',
        "spotgate_pool_last_pass_timestamp_seconds 123.0",
    ):
        assert line in text, line
    # the next pass replaces the agent gauge: gone agents leave no stale series
    metrics.record_pass(PassReport({"m": 0}, [], [], []), now=124.0)
    assert "spotgate_pool_agents{" not in generate_latest(metrics.registry).decode()
