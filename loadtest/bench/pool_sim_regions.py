"""Pool simulator benchmark by region: each trace set's regions alone, beside all of them.

    python -m loadtest.bench.pool_sim_regions [--write docs/benchmarks.md]

A pool deployed in one region places only in that region's zones; the bundled trace sets span
two and three regions. For each set, each of its regions alone and all of them together, in the
traces' reference set-up over the seeds of the policy table: SpotHedge as the traces' README
states it, and spotgate's policy with a warm pool and the on-demand margin, SpotHedge's gain
and cost paired seed by seed (the same windows).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from loadtest.bench.pool_sim_runs import (
    GOAL_POINTS,
    MARGIN_ROW,
    POLICY_ROWS,
    REFERENCE_CONFIG,
    REFERENCE_ROW,
    REFERENCE_WINDOW_HOURS,
    REFERENCE_WINDOWS,
    SEEDS,
    TRACE_SETS,
    bundled_traces,
    knobs_config,
)
from loadtest.bench.pool_sim_tables import goal_met, paired, spread
from loadtest.bench.report import write_section
from pool_manager.policy import POLICIES
from pool_manager.sim.results import SimResult
from pool_manager.sim.simulator import simulate_windows
from pool_manager.sim.traces import trace_regions

COMMAND = "python -m loadtest.bench.pool_sim_regions --write docs/benchmarks.md"
ROWS = (REFERENCE_ROW, MARGIN_ROW)
RegionJob = tuple[str, tuple[str, ...], str, int]  # trace set, regions (none: all), row, seed


def region_jobs() -> list[RegionJob]:
    """Every run of the table: each set's regions one by one, then all, each row, each seed."""
    return [
        (trace_set, regions, row, seed)
        for trace_set in TRACE_SETS
        for regions in [
            *((region,) for region in trace_regions(bundled_traces(trace_set))),
            (),
        ]
        for row in ROWS
        for seed in SEEDS
    ]


def run_region_job(job: RegionJob) -> SimResult:
    """One run: a row's policy over a set's zones in some regions, at one seed."""
    trace_set, regions, row, seed = job
    knobs = POLICY_ROWS[row]
    config = knobs_config(REFERENCE_CONFIG.target, knobs, seed)
    return simulate_windows(
        bundled_traces(trace_set, regions),
        POLICIES[knobs[0]],
        config,
        windows=REFERENCE_WINDOWS,
        window_hours=REFERENCE_WINDOW_HOURS,
    )


def _cell(results: Sequence[SimResult]) -> str:
    availability = spread([r.availability for r in results], 3)
    return f"{availability} / {spread([r.cost_vs_on_demand for r in results], 1)}"


def region_lines(results: dict[RegionJob, SimResult]) -> list[str]:
    """The table, one row per trace set and regions."""
    lines = [
        "### One region, or all of a trace's regions",
        "",
        "A pool deployed in one region places only in that region's zones (`spotgate sim "
        "--regions`). Each bundled set's regions alone and all of them together, in the "
        f"traces' reference set-up over {len(SEEDS)} seeds of window offsets (availability % "
        "/ cost vs on-demand %, mean ± standard deviation over the seeds); gain and cost over "
        "SpotHedge are paired seed by seed, in points. Goal as above: availability ≥ "
        f"SpotHedge's + {GOAL_POINTS} point at no more cost. `{COMMAND}`",
        "",
        f"| trace | regions (zones) | SpotHedge | {MARGIN_ROW} | availability gain over "
        "SpotHedge, points | cost over SpotHedge, points | goal met |",
        "|---|---|---|---|---|---|---|",
    ]
    for trace_set in TRACE_SETS:
        every = trace_regions(bundled_traces(trace_set))
        for regions in [*((region,) for region in every), ()]:
            zones = len(bundled_traces(trace_set, regions))
            theirs = [results[(trace_set, regions, REFERENCE_ROW, s)] for s in SEEDS]
            ours = [results[(trace_set, regions, MARGIN_ROW, s)] for s in SEEDS]
            gain, cost = paired(ours, theirs)
            named = ", ".join(regions) if regions else f"all: {', '.join(every)}"
            lines.append(
                f"| {trace_set} | {named} ({zones}) | {_cell(theirs)} | {_cell(ours)} | "
                f"{gain:+.3f} | {cost:+.2f} | {goal_met(gain, cost)} |"
            )
    lines += ["", *(_cost_line(results, trace_set) for trace_set in TRACE_SETS)]
    return lines


def _cost_line(results: dict[RegionJob, SimResult], trace_set: str) -> str:
    """What one region alone costs against all of the set's regions, each row's policy."""
    every = trace_regions(bundled_traces(trace_set))

    def cost(regions: tuple[str, ...], row: str) -> float:
        seeded = [results[(trace_set, regions, row, s)].cost_vs_on_demand for s in SEEDS]
        return sum(seeded) / len(seeded) * 100

    parts = []
    for row in ROWS:
        alone = sorted(cost((region,), row) for region in every)
        parts.append(
            f"{row}: {cost((), row):.1f} % of on-demand over all {len(every)} regions, "
            f"{alone[0]:.1f}–{alone[-1]:.1f} % in one alone"
        )
    return f"- {trace_set}: " + "; ".join(parts) + "."


def main() -> None:
    """Run every simulation and print (and optionally write) the section."""
    parser = argparse.ArgumentParser(description="pool simulator benchmark by region")
    parser.add_argument("--write", type=Path)
    args = parser.parse_args()
    jobs = region_jobs()
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        results = dict(zip(jobs, pool.map(run_region_job, jobs), strict=True))
    section = "\n".join(region_lines(results))
    print(section)
    if args.write:
        write_section(args.write, "pool-sim-regions", section)


if __name__ == "__main__":
    main()
