"""The pool simulator benchmark's runs: its set-ups, and every run its tables need, named."""

from __future__ import annotations

from dataclasses import replace

from pool_manager.policy import POLICIES
from pool_manager.sim.config import WARM_START_SECONDS, SimConfig
from pool_manager.sim.results import SimResult
from pool_manager.sim.simulator import simulate_windows
from pool_manager.sim.traces import BUNDLED_TRACES_DIR, ZoneTrace, load_traces

COMMAND = "python -m loadtest.bench.pool_sim --write docs/benchmarks.md"


TRACE_SETS = ("aws-16node-3zone", "aws-1node-9zone")


COLD_STARTS_SECONDS = (180.0, 600.0)


HOLDS_SECONDS = (0.0, 900.0, 1800.0, 3600.0)


TARGET_AGENTS = 4


GOAL_AVAILABILITY = 0.995


GOAL_COST = 0.50


REFERENCE = {  # SpotHedge on the same traces, from the traces' README: (availability, cost)
    "aws-16node-3zone": ((0.9758, 0.573), "100 % / 48.0 %"),
    "aws-1node-9zone": ((0.9971, 0.456), "100 % / 34.0 %"),
}


REFERENCE_CONFIG = SimConfig(target=3, cold_start_seconds=120.0)


REFERENCE_WINDOWS = 10


REFERENCE_WINDOW_HOURS = 24.0


CROSS_HOLDS_SECONDS = (0.0, 300.0, 900.0, 1800.0, 3600.0)


HARSHER = replace(REFERENCE_CONFIG, on_demand_refusal_rate=0.2, spot_price_step=0.1)
"""The reference set-up where on-demand is refused a fifth of the time and spot prices move."""


LONG_STREAMS_SECONDS = (600.0, 3600.0)
"""Streams that outlive the 2-minute notice: a preempted agent's are resumed or lost."""


SEEDS = range(5)
"""Seeds of the window offsets (and of the simulator's draws): each gives ten other windows."""


HELD_OUT_SEEDS = range(5, 10)
"""Other windows, not looked at while the on-demand margin's rule and durations were chosen."""


TRACES: dict[str, tuple[str, tuple[str, ...], int]] = {  # name: (bundled set, regions, target)
    "aws-16node-3zone": ("aws-16node-3zone", (), 3),
    "aws-1node-9zone": ("aws-1node-9zone", (), 3),
    "aws-1node-9zone, us-east-1 only": ("aws-1node-9zone", ("us-east-1",), 3),
    "aws-16node-3zone, target 6": ("aws-16node-3zone", (), 6),
}
"""The bundled sets at the README's target, and two derived: fewer zones, a larger pool."""


WARM_HOLD_SECONDS = 0.0
"""A warm start brings cover back in a minute: on-demand goes as soon as spot holds the
target (the hold the cross-validation above chose without a warm pool too)."""


MARGIN_ROW = "spotgate + warm pool + on-demand margin"


PolicyKnobs = tuple[str, int, float, bool]  # policy, warm pool (× target), hold, margin


REFERENCE_ROW = "SpotHedge (as the README states it)"
"""The row SpotHedge runs in, as the traces' README states it: what the others are compared with."""


POLICY_ROWS: dict[str, PolicyKnobs] = {
    REFERENCE_ROW: ("spothedge", 0, 0.0, False),
    "spotgate (no warm pool, hold 1800 s)": ("spotgate", 0, 1800.0, False),
    "spotgate + warm pool": ("spotgate", 1, WARM_HOLD_SECONDS, False),
    MARGIN_ROW: ("spotgate", 1, WARM_HOLD_SECONDS, True),
}


WARM_STARTS_SECONDS = (WARM_START_SECONDS, 90.0, 120.0)


MARGIN_DEFAULTS = SimConfig()


MARGIN_VARIANTS: dict[str, dict[str, float]] = {
    "spot age 4 h": {"on_demand_margin_spot_age_seconds": 4 * 3600.0},
    "spot age 12 h": {"on_demand_margin_spot_age_seconds": 12 * 3600.0},
    "shortage 900 s": {"on_demand_margin_shortage_seconds": 900.0},
    "shortage 3600 s": {"on_demand_margin_shortage_seconds": 3600.0},
}
"""The margin's two durations moved one at a time from their defaults (8 h, 1800 s)."""


CROSS_KNOBS: list[PolicyKnobs] = [
    ("spotgate", warm, hold, margin)
    for warm in (0, 1)
    for hold in (0.0, 300.0, 1800.0)
    for margin in (False, True)
]


GOAL_POINTS = 0.1
"""The goal over SpotHedge measured in this simulator: availability up by 0.1 point or more
at no more cost."""


Job = tuple[str, str, SimConfig, int]


def bundled_traces(trace_set: str, regions: tuple[str, ...] = ()) -> list[ZoneTrace]:
    """A bundled set's traces, of the zones in `regions` (none: every zone)."""
    return load_traces(BUNDLED_TRACES_DIR / trace_set, regions)


def _traces(name: str) -> list[ZoneTrace]:
    directory, regions, _ = TRACES.get(name, (name, (), 0))
    return bundled_traces(directory, regions)


def run_job(job: Job) -> SimResult:
    """One run: a policy over a trace set in a set-up (over windows, or the whole trace)."""
    trace_set, policy, config, windows = job
    traces = _traces(trace_set)
    hours = REFERENCE_WINDOW_HOURS
    return simulate_windows(traces, POLICIES[policy], config, windows=windows, window_hours=hours)


def _knobs_config(trace: str, knobs: PolicyKnobs, seed: int, **changes: float) -> SimConfig:
    """The reference set-up for `trace` with a policy's knobs, at one seed."""
    return knobs_config(TRACES[trace][2], knobs, seed, **changes)


def knobs_config(target: int, knobs: PolicyKnobs, seed: int, **changes: float) -> SimConfig:
    """The reference set-up at `target` with a policy's knobs, at one seed."""
    _, warm, hold, margin = knobs
    config = replace(
        REFERENCE_CONFIG,
        target=target,
        warm_pool_size=warm * target,
        on_demand_hold_seconds=hold,
        on_demand_margin=margin,
        seed=seed,
    )
    return replace(config, **changes)  # type: ignore[arg-type]


def _seeded_jobs(name: str, trace: str, knobs: PolicyKnobs, **changes: float) -> dict[str, Job]:
    """One job per seed, keyed `name trace seed`."""
    return _jobs_over(name, trace, knobs, SEEDS, changes)


def _jobs_over(
    name: str, trace: str, knobs: PolicyKnobs, seeds: range, changes: dict[str, float]
) -> dict[str, Job]:
    """One job per seed of `seeds`, keyed `name trace seed`."""
    return {
        f"{name} {trace} {seed}": (
            trace,
            knobs[0],
            _knobs_config(trace, knobs, seed, **changes),
            REFERENCE_WINDOWS,
        )
        for seed in seeds
    }


def knobs_label(knobs: PolicyKnobs) -> str:
    """How the tables name a combination of the warm pool's knobs."""
    _, warm, hold, margin = knobs
    pool = "warm pool" if warm else "no warm pool"
    return f"{pool}, hold {hold:.0f} s" + (", on-demand margin" if margin else "")


def all_jobs() -> dict[str, Job]:
    """Every run the section reports, by name (tables share runs)."""
    base = SimConfig(target=TARGET_AGENTS)
    policies = list(POLICIES)
    jobs: dict[str, Job] = {}
    for trace_set in TRACE_SETS:
        for cold in COLD_STARTS_SECONDS:
            config = replace(base, cold_start_seconds=cold)
            for policy in policies:
                jobs[f"policy {trace_set} {cold} {policy}"] = (trace_set, policy, config, 0)
            for hold in HOLDS_SECONDS:
                held = replace(config, on_demand_hold_seconds=hold)
                jobs[f"hold {trace_set} {cold} {hold}"] = (trace_set, "spotgate", held, 0)
        for hold in CROSS_HOLDS_SECONDS:
            held = replace(REFERENCE_CONFIG, on_demand_hold_seconds=hold)
            jobs[f"reference {trace_set} {hold}"] = (
                trace_set, "spotgate", held, REFERENCE_WINDOWS
            )  # fmt: skip
        jobs[f"whole {trace_set}"] = (trace_set, "spotgate", REFERENCE_CONFIG, 0)
        jobs[f"harsher {trace_set}"] = (trace_set, "spotgate", HARSHER, REFERENCE_WINDOWS)
        for seconds in LONG_STREAMS_SECONDS:
            long_streams = replace(REFERENCE_CONFIG, stream_seconds=seconds)
            jobs[f"long {trace_set} {seconds}"] = (
                trace_set, "spotgate", long_streams, REFERENCE_WINDOWS
            )  # fmt: skip
    reference_row = REFERENCE_ROW
    for trace in TRACES:
        for row, knobs in POLICY_ROWS.items():
            jobs |= _seeded_jobs(row, trace, knobs)
    for trace in TRACES:
        for row in (reference_row, MARGIN_ROW):
            jobs |= _jobs_over(f"held out {row}", trace, POLICY_ROWS[row], HELD_OUT_SEEDS, {})
        for name, changes in MARGIN_VARIANTS.items():
            jobs |= _seeded_jobs(name, trace, POLICY_ROWS[MARGIN_ROW], **changes)
    warm_row = POLICY_ROWS["spotgate + warm pool"]
    for trace in TRACE_SETS:
        for seconds in WARM_STARTS_SECONDS:
            jobs |= _seeded_jobs(f"warm {seconds}", trace, warm_row, warm_start_seconds=seconds)
        jobs |= _seeded_jobs("warm empty", trace, warm_row, warm_pool_filled=False)
        for knobs in CROSS_KNOBS:
            jobs |= _seeded_jobs(knobs_label(knobs), trace, knobs)
    return jobs
