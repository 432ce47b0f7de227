from __future__ import annotations

from dataclasses import replace

import pytest

from pool_manager.cold_starts import COLD_START_SAMPLES, ColdStarts, TimedBoot, quantile
from pool_manager.pool_view import PoolAgent
from spotgate.registry import BootKind, PoolForecast

DEFAULT_SECONDS = 600.0


def agent(
    agent_id: str,
    *,
    launched_at: float = 0.0,
    ready_at: float | None = None,
    placement: tuple[str, str] = ("g6", "a"),
) -> PoolAgent:
    phase = "starting" if ready_at is None else "ready"
    return PoolAgent(agent_id, "spot", *placement, phase, launched_at, ready_at=ready_at)


@pytest.mark.parametrize(
    ("samples", "q", "expected"),
    [
        ([5.0], 0.9, 5.0),
        ([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0], 0.9, 9.0),
        ([10.0, 1.0, 5.0], 0.5, 5.0),
        ([3.0, 1.0], 1.0, 3.0),
    ],
)
def test_quantile_is_the_nearest_rank(samples: list[float], q: float, expected: float) -> None:
    assert quantile(samples, q) == expected


def test_each_agent_is_timed_once_when_first_seen_ready() -> None:
    cold = ColdStarts(DEFAULT_SECONDS)
    ready = agent("1", launched_at=100.0, ready_at=190.0)
    assert cold.observe([("m", ready), ("m", agent("2"))]) == [TimedBoot("cold", ("g6", "a"), 90.0)]
    assert cold.observe([("m", ready)]) == []  # seen again: not timed again
    assert list(cold.samples[("cold", ("g6", "a"))]) == [90.0]


def test_estimates_fall_back_from_the_placement_to_every_placement_to_the_default() -> None:
    cold = ColdStarts(DEFAULT_SECONDS)
    assert cold.estimate_seconds(("g6", "a")) == DEFAULT_SECONDS  # nothing timed yet
    cold.observe([("m", agent(str(n), ready_at=float(n * 10))) for n in range(1, 11)])
    assert cold.estimate_seconds(("g6", "a")) == 90.0  # the 0.9 quantile of 10..100
    assert cold.estimate_seconds(("g6", "b")) == 90.0  # a placement not seen: all of them
    cold.observe([("m", agent("b1", ready_at=300.0, placement=("g6", "b")))])
    assert cold.estimate_seconds(("g6", "b")) == 300.0  # its own once it has one


def test_only_the_latest_cold_starts_count() -> None:
    cold = ColdStarts(DEFAULT_SECONDS)
    slow = [("m", agent(f"old{n}", ready_at=900.0)) for n in range(COLD_START_SAMPLES)]
    cold.observe(slow)
    fast = [("m", agent(f"new{n}", ready_at=60.0)) for n in range(COLD_START_SAMPLES)]
    cold.observe(fast)  # a faster image: the old boots age out
    assert cold.estimate_seconds(("g6", "a")) == 60.0


def test_an_agent_that_left_is_forgotten_but_its_cold_start_kept() -> None:
    cold = ColdStarts(DEFAULT_SECONDS)
    cold.observe([("m", agent("1", ready_at=50.0))])
    cold.observe([])
    assert cold.observe([("m", agent("1", ready_at=50.0))], warm={"1"}) == [
        TimedBoot("warm", ("g6", "a"), 50.0)
    ]  # its id came back: a new boot of that instance (started from the warm pool)
    assert len(cold.samples[("cold", ("g6", "a"))]) == 1
    assert len(cold.samples[("warm", ("g6", "a"))]) == 1


@pytest.mark.parametrize(
    ("agents", "now", "expected"),
    [
        # nothing booting: no forecast for a model the pass sized
        ([("m", agent("r", ready_at=10.0))], 100.0, {"m": None}),
        # one booting: its launch plus the estimate (the default, nothing timed)
        ([("m", agent("b", launched_at=100.0))], 150.0, {"m": PoolForecast(700.0, 600.0)}),
        # several: the first expected ready
        (
            [("m", agent("b1", launched_at=100.0)), ("m", agent("b2", launched_at=50.0))],
            150.0,
            {"m": PoolForecast(650.0, 600.0)},
        ),
        # overdue: any moment now, never in the past
        ([("m", agent("b", launched_at=0.0))], 900.0, {"m": PoolForecast(900.0, 600.0)}),
        # per model
        (
            [("m", agent("b", launched_at=0.0)), ("other", agent("c", launched_at=60.0))],
            0.0,
            {"m": PoolForecast(600.0, 600.0), "other": PoolForecast(660.0, 600.0)},
        ),
    ],
)
def test_forecasts_are_the_first_booting_agents_expected_ready(
    agents: list[tuple[str, PoolAgent]], now: float, expected: dict[str, PoolForecast | None]
) -> None:
    cold = ColdStarts(DEFAULT_SECONDS)
    assert cold.forecasts(agents, ["m"], now) == expected


def test_forecasts_use_the_booting_agents_own_placement() -> None:
    cold = ColdStarts(DEFAULT_SECONDS)
    cold.observe([("m", agent("fast", ready_at=60.0, placement=("g6", "a")))])
    cold.observe([("m", agent("slow", ready_at=400.0, placement=("g5", "b")))])
    booting = replace(agent("x", launched_at=1000.0), instance_type="g5", zone="b")
    assert cold.forecasts([("m", booting)], ["m"], 1000.0) == {"m": PoolForecast(1400.0, 400.0)}


A, B = ("g6", "a"), ("g5", "b")


@pytest.mark.parametrize(
    ("cold_boots", "warm_boots", "kind", "expected"),
    [
        # nothing timed: a cold start is the default, a warm one no longer than that
        ([], [], "cold", DEFAULT_SECONDS),
        ([], [], "warm", DEFAULT_SECONDS),
        # cold starts only: a warm start is expected within a cold one's time
        ([(A, 200.0)], [], "warm", 200.0),
        # each kind its own samples
        ([(A, 200.0)], [(A, 40.0)], "warm", 40.0),
        ([(A, 200.0)], [(A, 40.0)], "cold", 200.0),
        # a placement without warm starts of its own: every placement's warm starts
        ([(A, 200.0)], [(B, 70.0)], "warm", 70.0),
        # warm starts never stand in for cold ones
        ([], [(A, 40.0)], "cold", DEFAULT_SECONDS),
    ],
)
def test_warm_and_cold_starts_are_estimated_apart(
    cold_boots: list[tuple[tuple[str, str], float]],
    warm_boots: list[tuple[tuple[str, str], float]],
    kind: BootKind,
    expected: float,
) -> None:
    cold = ColdStarts(DEFAULT_SECONDS)
    booted = [
        (f"{boot_kind}{n}", placement, seconds)
        for boot_kind, boots in (("cold", cold_boots), ("warm", warm_boots))
        for n, (placement, seconds) in enumerate(boots)
    ]
    cold.observe(
        [("m", agent(name, ready_at=seconds, placement=where)) for name, where, seconds in booted],
        warm={name for name, _, _ in booted if name.startswith("warm")},
    )
    assert cold.estimate_seconds(A, kind) == expected


def test_a_model_with_a_warm_instance_starting_is_forecast_by_the_warm_start() -> None:
    """A scale from zero through the warm pool: the gateways hear the warm start's ETA."""
    cold = ColdStarts(DEFAULT_SECONDS)
    cold.observe([("m", agent("c", ready_at=240.0))])  # a cold start: 240 s
    cold.observe([("m", agent("w", launched_at=1000.0, ready_at=1030.0))], warm={"w"})  # 30 s
    starting = agent("w", launched_at=5000.0)  # stopped, then started again
    cold_booting = agent("c2", launched_at=5000.0)
    assert cold.forecasts([("m", starting)], ["m"], 5000.0, warm={"w"}) == {
        "m": PoolForecast(5030.0, 30.0)
    }
    assert cold.forecasts([("m", cold_booting)], ["m"], 5000.0) == {
        "m": PoolForecast(5240.0, 240.0)
    }
    # both booting: the first expected ready is the warm one
    both = [("m", cold_booting), ("m", starting)]
    assert cold.forecasts(both, ["m"], 5000.0, warm={"w"}) == {"m": PoolForecast(5030.0, 30.0)}
