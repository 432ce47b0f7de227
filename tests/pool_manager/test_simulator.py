from __future__ import annotations

import json
from dataclasses import replace

import pytest

from pool_manager.policy import POLICIES
from pool_manager.pool_view import StopToWarm
from pool_manager.sim.config import DEFAULT_MODEL, SimConfig, SimModel
from pool_manager.sim.results import ModelResult, SimResult
from pool_manager.sim.simulator import Simulation, simulate_windows
from pool_manager.sim.traces import BUNDLED_TRACES_DIR, TraceError, ZoneTrace, load_traces

GAP_SECONDS = 300.0


def zone(name: str, *capacity: int) -> ZoneTrace:
    return ZoneTrace(name, "p3.2xlarge", GAP_SECONDS, tuple(capacity))


def run(policy: str, traces: list[ZoneTrace], **config: float) -> SimResult:
    settings = SimConfig(**{"tick_seconds": 60.0, "cold_start_seconds": 120.0, **config})  # type: ignore[arg-type]
    return Simulation(traces, POLICIES[policy], settings).run()


def test_on_demand_only_is_available_after_its_cold_start_at_full_price() -> None:
    traces = [zone("a", *[0] * 12)]  # one hour, no spot at all: 60 one-minute ticks
    result = run("on-demand-only", traces, target=2)
    assert result.availability == pytest.approx(58 / 60)  # ready two ticks after launch
    assert result.cost_vs_on_demand == pytest.approx(59 / 60)  # paid from the next tick
    assert (result.launches, result.preemptions, result.lost_streams) == (2, 0, 0)


def test_launches_draw_their_cold_starts_from_the_observed_ones() -> None:
    traces = [zone("a", *[0] * 12)]
    observed = SimConfig(tick_seconds=60.0, target=2, cold_start_samples=(300.0, 300.0))
    fixed = SimConfig(tick_seconds=60.0, target=2, cold_start_seconds=300.0)
    replayed = Simulation(traces, POLICIES["on-demand-only"], observed).run()
    assert replayed == Simulation(traces, POLICIES["on-demand-only"], fixed).run()
    assert replayed.availability == pytest.approx(55 / 60)  # ready five ticks after launch
    mixed = SimConfig(tick_seconds=60.0, target=1, cold_start_samples=(60.0, 600.0), seed=3)
    draws = [Simulation(traces, POLICIES["on-demand-only"], replace(mixed, seed=n)).run()
             for n in range(8)]  # fmt: skip
    # one launch each: ready after one tick or after ten, as its draw fell
    assert {round(r.availability * 60) for r in draws} == {59, 50}


def test_a_warm_pool_covers_in_a_warm_start_and_its_volumes_are_paid_while_stopped() -> None:
    traces = [zone("a", *[0] * 12)]  # no spot at all: on-demand covers the target of 2
    cold = run("spotgate", traces, target=2)
    assert cold.availability == pytest.approx(58 / 60)  # launched: two-minute cold starts
    warm = run("spotgate", traces, target=2, warm_pool_size=2, warm_start_seconds=60.0)
    assert warm.availability == pytest.approx(59 / 60)  # started: one-minute warm starts
    assert (warm.warm_starts, warm.launches) == (2, 0)
    # both stopped during the first tick (their volumes), then both on-demand from the next
    stopped_price = SimConfig().stopped_price_per_hour
    assert warm.stopped_hours == pytest.approx(2 / 60)
    assert warm.cost_vs_on_demand == pytest.approx((59 / 60 * 2 * 3 + 2 * stopped_price / 60) / 6)
    empty = run("spotgate", traces, target=2, warm_pool_size=2, warm_pool_filled=False)
    # nothing stopped yet: launched cold, and the cover goes back to the pool later
    assert (empty.availability, empty.warm_starts, empty.stopped_hours) == (cold.availability, 0, 0)


def test_a_stopped_volume_is_priced_from_ebs_and_the_on_demand_price() -> None:
    config = SimConfig(on_demand_price_ratio=3.0)
    # 200 GiB of gp3 at $0.08 per GiB-month against p3.2xlarge's $3.06 on-demand (spot: a third)
    assert config.stopped_price_per_hour == pytest.approx(200 * 0.08 / 730 / (3.06 / 3))
    assert replace(config, volume_gib=100).stopped_price_per_hour == pytest.approx(
        config.stopped_price_per_hour / 2
    )


def test_warm_and_cold_starts_are_drawn_from_their_own_samples() -> None:
    traces = [zone("a", *[0] * 12)]
    slow_warm = {"warm_pool_size": 1, "warm_start_samples": (180.0,), "cold_start_samples": (60.0,)}
    assert run("spotgate", traces, target=1, **slow_warm).availability == pytest.approx(57 / 60)
    # with the pool empty the cover is launched: its cold start comes from the cold samples
    launched = run("spotgate", traces, target=1, warm_pool_filled=False, **slow_warm)
    assert launched.availability == pytest.approx(59 / 60)


def test_cover_goes_back_into_the_warm_pool_once_spot_holds_the_target_again() -> None:
    traces = [zone("a", *[0] * 4 + [16] * 8), zone("b", *[0] * 4 + [16] * 8)]  # spot at 20 min
    config = SimConfig(
        tick_seconds=60.0, cold_start_seconds=120.0, target=1, warm_pool_size=1,
        on_demand_hold_seconds=0.0,
    )  # fmt: skip
    simulation = Simulation(traces, POLICIES["spotgate"], config)
    result = simulation.run()
    stops = [action for _, action in simulation.decisions if isinstance(action, StopToWarm)]
    assert len(stops) == 1  # the cover, drained of its streams, then stopped (not terminated)
    assert result.warm_starts == 1
    assert result.launches == 2  # target + margin on spot, once the zones came back
    assert 30 / 60 < result.stopped_hours < 40 / 60  # stopped again for the last half hour


def test_a_published_day_is_more_available_with_a_warm_pool_at_about_the_same_cost() -> None:
    traces = load_traces(BUNDLED_TRACES_DIR / "aws-16node-3zone")
    config = SimConfig(target=3, cold_start_seconds=120.0, on_demand_hold_seconds=0.0, seed=1)
    plain = simulate_windows(traces, POLICIES["spotgate"], config, windows=1, window_hours=24)
    warm = replace(config, warm_pool_size=3)
    pooled = simulate_windows(traces, POLICIES["spotgate"], warm, windows=1, window_hours=24)
    assert pooled.warm_starts > 0
    assert pooled.availability > plain.availability
    assert abs(pooled.cost_vs_on_demand - plain.cost_vs_on_demand) < 0.02


def test_steady_spot_costs_a_third_per_agent_and_keeps_the_margin() -> None:
    traces = [zone("a", *[16] * 12), zone("b", *[16] * 12), zone("c", *[16] * 12)]
    result = run("spotgate", traces, target=3, on_demand_hold_seconds=0.0)
    # 4 spot (target + 1) at 1/3 of on-demand; on-demand covered the first cold start only
    assert result.preemptions == 0
    assert result.availability == pytest.approx(58 / 60)
    spot_share = 4 / (3 * 3)
    assert spot_share < result.cost_vs_on_demand < spot_share + 0.1


def test_a_zone_drop_is_absorbed_by_the_margin_and_replaced_elsewhere() -> None:
    steady = [16] * 12
    dropping = [16] * 4 + [0] * 8  # zone a loses all capacity after 20 minutes
    traces = [zone("a", *dropping), zone("b", *steady), zone("c", *steady)]
    result = run("spotgate", traces, target=2, on_demand_hold_seconds=0.0)
    assert result.preemptions == 1
    assert result.launches == 2 + 3 + 1  # on-demand cover, spot, then the replacement
    # only the initial cold start is unavailable: the margin held the target throughout
    assert result.availability == pytest.approx(58 / 60)
    assert result.lost_streams == 0


def test_streams_are_resumed_on_spares_and_lost_without_them() -> None:
    # No notice and streams longer than the trace: a preempted agent's streams must move.
    dropping = [16] * 4 + [0] * 8
    traces = [zone("a", *dropping), zone("b", *[16] * 12), zone("c", *[16] * 12)]
    config = {"target": 2, "notice_seconds": 0.0, "stream_seconds": 7200.0, "load": 0.3}
    ours = run("spotgate", traces, **config)
    assert ours.streams_resumed > 0
    assert ours.lost_streams == 0
    lonely = [zone("a", *dropping)]
    single = run("spot-cheapest-zone", lonely, **config)
    assert single.lost_streams > 0
    assert single.streams_resumed == 0


def test_refused_spot_falls_back_to_on_demand_and_returns_after_the_hold() -> None:
    # No spot for the first 30 minutes, then plenty.
    traces = [zone("a", *([0] * 6 + [16] * 18))]
    no_margin = {"target": 1, "spot_overprovision": 0}
    held = run("spotgate", traces, on_demand_hold_seconds=600.0, **no_margin)
    assert held.refused_launches > 0
    assert held.on_demand_share_of_hours > 0
    longer = run("spotgate", traces, on_demand_hold_seconds=1800.0, **no_margin)
    assert longer.cost_vs_on_demand > held.cost_vs_on_demand  # on-demand kept longer
    assert held.availability == longer.availability == pytest.approx(118 / 120)
    # With a margin, on-demand goes once spot's margin is ready too, whatever the hold.
    margin = run("spotgate", traces, target=1, on_demand_hold_seconds=1800.0)
    assert margin.on_demand_share_of_hours < held.on_demand_share_of_hours
    assert margin.availability == held.availability


def test_on_demand_refusals_are_retried_and_cost_availability_when_every_launch_fails() -> None:
    traces = [zone("a", *[0] * 12), zone("b", *[0] * 12)]  # no spot: on-demand carries it
    sometimes = run("spotgate", traces, target=2, on_demand_refusal_rate=0.5)
    assert sometimes.refused_launches > 0
    assert sometimes.availability > 0.9  # the next placement, or the next pass, has room
    never = run("spotgate", traces, target=2, on_demand_refusal_rate=1.0)
    assert (never.availability, never.launches) == (0.0, 0)


def test_spot_prices_move_hour_by_hour_within_their_bounds_and_are_paid() -> None:
    day = [zone("a", *[16] * 288), zone("b", *[16] * 288)]  # plenty of spot all day
    still = run("spotgate", day, target=1)
    moving = run("spotgate", day, target=1, spot_price_step=0.5)
    assert moving.cost_vs_on_demand != still.cost_vs_on_demand
    assert moving == run("spotgate", day, target=1, spot_price_step=0.5)  # seeded
    # two spot agents at between half and twice the price, over one on-demand at 3x
    assert 2 * 0.5 / 3 * 0.9 < moving.cost_vs_on_demand < 2 * 2.0 / 3


def test_policies_rank_as_expected_on_a_published_trace_day() -> None:
    traces = load_traces(BUNDLED_TRACES_DIR / "aws-16node-3zone")
    config = SimConfig(target=4, cold_start_seconds=180.0, seed=1)
    results = {
        name: simulate_windows(traces, policy, config, windows=2, window_hours=24)
        for name, policy in POLICIES.items()
    }
    ours = results["spotgate"]
    assert ours.cost_vs_on_demand < results["on-demand-only"].cost_vs_on_demand
    assert ours.availability > results["even-spread"].availability
    assert ours.availability > results["spot-cheapest-zone"].availability
    assert ours.lost_streams == 0
    again = simulate_windows(traces, POLICIES["spotgate"], config, windows=2, window_hours=24)
    assert json.dumps(again.as_json()) == json.dumps(ours.as_json())  # seeded: reproducible


def test_windows_cover_only_their_span() -> None:
    traces = load_traces(BUNDLED_TRACES_DIR / "aws-16node-3zone")
    result = simulate_windows(
        traces, POLICIES["on-demand-only"], SimConfig(), windows=3, window_hours=2
    )
    assert result.hours == pytest.approx(6.0)


def shared(traces: list[ZoneTrace], *models: SimModel, **config: float) -> Simulation:
    settings = SimConfig(tick_seconds=60.0, cold_start_seconds=120.0, models=models, **config)  # type: ignore[arg-type]
    return Simulation(traces, POLICIES["spotgate"], settings)


def by_name(result: SimResult) -> dict[str, ModelResult]:
    return {model.name: model for model in result.models}


def test_an_idle_model_beside_a_busy_one_gets_nothing_and_costs_the_pool_nothing() -> None:
    traces = [zone("a", *[4] * 12), zone("b", *[4] * 12)]
    result = shared(traces, SimModel("busy", 2, 0.5), SimModel("idle", 0, 0.0)).run()
    busy, idle = by_name(result)["busy"], by_name(result)["idle"]
    assert (idle.launches, idle.instance_types, idle.streams_started) == (0, (), 0)
    assert busy.launches >= 3  # its target and the spare
    assert busy.streams_started > 0
    assert (result.launches, result.streams_started) == (busy.launches, busy.streams_started)
    # the idle model always has its target of none: the pool is available when the busy one is
    assert idle.availability == 1.0
    assert result.availability == busy.availability == pytest.approx(58 / 60)
    assert result.cost_vs_on_demand == pytest.approx(busy.cost_vs_on_demand)


def test_each_model_launches_only_its_own_instance_types() -> None:
    # No p3 spot at all: a v100 model that ignored its types would take the plentiful g5 spot.
    v100 = [zone("a", *[0] * 12), zone("b", *[0] * 12)]
    a10 = [ZoneTrace(name, "g5.xlarge", GAP_SECONDS, (8,) * 12) for name in ("c", "d")]
    models = (SimModel("v100", 2, 0.3, ("p3.2xlarge",)), SimModel("a10", 2, 0.3, ("g5.xlarge",)))
    simulation = shared([*v100, *a10], *models, on_demand_hold_seconds=0.0)
    result = by_name(simulation.run())
    assert result["v100"].instance_types == ("p3.2xlarge",)
    assert result["a10"].instance_types == ("g5.xlarge",)
    assert result["v100"].cost_vs_on_demand > 0.9  # on-demand throughout
    assert result["a10"].cost_vs_on_demand < 0.7  # spot, once the first cold start is over
    with pytest.raises(TraceError, match="no spot trace for instance type g6"):
        shared(v100, SimModel("l4", 1, 0.3, ("g6",)))


def test_models_competing_for_a_scarce_zone_never_hold_more_spot_than_it_allows() -> None:
    # Zone a holds four spot instances, then one, then four again: each model wants three.
    scarce = zone("a", *[4] * 4 + [1] * 4 + [4] * 4)
    models = (SimModel("first", 2, 0.3), SimModel("second", 2, 0.3))
    simulation = shared([scarce], *models, on_demand_hold_seconds=0.0)
    held: list[dict[str, int]] = []

    def check(now: float) -> None:
        holdings = simulation.spot_held(("p3.2xlarge", "a"))
        assert sum(holdings.values()) <= scarce.capacity_at(now)
        held.append(holdings)

    result = simulation.run(check)
    assert len(held) == 60
    assert {"first": 1, "second": 3} in held  # the zone full, with both models in it
    assert result.refused_launches > 0  # launches into the zone the other model filled
    first, second = by_name(result)["first"], by_name(result)["second"]
    # the drop to one preempted three, victims drawn from both models' instances
    assert (first.preemptions, second.preemptions, result.preemptions) == (1, 2, 3)
    assert result.availability <= min(first.availability, second.availability)
    assert result.cost_vs_on_demand == pytest.approx(
        (first.cost_vs_on_demand + second.cost_vs_on_demand) / 2
    )


def test_one_model_named_alone_is_the_pool_configured_by_its_target() -> None:
    traces = load_traces(BUNDLED_TRACES_DIR / "aws-16node-3zone")
    config = SimConfig(target=3, load=0.6, stream_seconds=1800.0, seed=4)
    alone = replace(config, target=1, load=0.0, models=(SimModel(DEFAULT_MODEL, 3, 0.6),))
    pool = simulate_windows(traces, POLICIES["spotgate"], config, windows=1, window_hours=24)
    assert pool.preemptions > 0  # the seeded draws mattered
    assert pool.streams_resumed > 0
    assert simulate_windows(traces, POLICIES["spotgate"], alone, windows=1, window_hours=24) == pool
    assert [m.name for m in pool.models] == [DEFAULT_MODEL]
    assert pool.models[0].launches == pool.launches


def on_demand_hours(result: SimResult) -> float:
    return result.on_demand_share_of_hours * result.hours


def test_batch_work_that_would_miss_its_window_gets_spot_agents_which_go_back_after() -> None:
    traces = [zone("a", *[10] * 48), zone("b", *[10] * 48)]  # four hours of spot
    # The target's agent at half load and the margin's leave 48 of their 64 streams: 120
    # stream-hours take 2.5 h there.
    given = {"target": 1, "batch_stream_hours": 120.0, "batch_window_hours": 2.0}
    spare_only = run("spotgate", traces, **given, batch_spot_max_agents=0)
    assert spare_only.batch_done_hours == pytest.approx(2.5, abs=0.05)

    held: list[int] = []
    config = SimConfig(tick_seconds=60.0, cold_start_seconds=120.0, **given)  # type: ignore[arg-type]
    simulation = Simulation(traces, POLICIES["spotgate"], config)
    zones = [(trace.instance_type, trace.zone) for trace in traces]
    result = simulation.run(
        lambda _now: held.append(sum(simulation.spot_held(z)[DEFAULT_MODEL] for z in zones))
    )
    assert result.batch_done_hours is not None
    assert result.batch_done_hours < 2.0
    assert max(held) > 2  # beyond the target and its margin: the batch's
    assert held[-1] == 2  # given back once the work was done and the idle time passed
    without = run("spotgate", traces, target=1)  # on-demand covered the target's first boot
    assert on_demand_hours(result) <= on_demand_hours(without)  # none for the batch


def test_batch_work_never_launches_on_demand_where_spot_has_no_room() -> None:
    traces = [zone("a", *[2] * 24)]  # room for the target and its margin, no more
    given = {"target": 1, "batch_stream_hours": 120.0, "batch_window_hours": 2.0}
    without = run("spotgate", traces, target=1)
    batched = run("spotgate", traces, **given)
    assert on_demand_hours(batched) == pytest.approx(on_demand_hours(without))
    assert batched.refused_launches > 0  # it asked spot for more, and spot had none
    assert batched.batch_done_hours is None  # not done in two hours on what was left
