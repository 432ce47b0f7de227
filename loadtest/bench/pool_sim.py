"""Pool simulator benchmark: availability and cost vs on-demand, our policy and the baselines.

    python -m loadtest.bench.pool_sim [--write docs/benchmarks.md]

Both bundled trace sets, target 4 agents, cold start 3 and 10 minutes, the 2-minute notice,
on-demand at 3× the spot price: every policy over the whole trace; then the on-demand hold
of spotgate's policy swept, the knob that trades cost for availability; then the reference
set-up of the traces' README (target 3, cold start 120 s, ten 24-hour windows, and the whole
trace) next to the figures measured for SpotHedge, with the hold cross-validated: chosen on
one trace set, measured on the other. Then SpotHedge as the README states it, spotgate's
policy, and spotgate's with a warm pool (and with the spot margin covered on-demand while
spot has nowhere to place it and its loss is likely), in that set-up over five seeds of
window offsets, on the two bundled sets and two derived from them; that margin on other
windows and with its durations moved; the warm start's assumption varied; and the warm
pool's knobs cross-validated between the bundled sets. Runs are spread over the CPUs; each
is deterministic.
"""

from __future__ import annotations

import argparse
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from loadtest.bench.pool_sim_runs import (
    POLICY_ROWS,
    REFERENCE_ROW,
    all_jobs,
    run_job,
)
from loadtest.bench.pool_sim_tables import (
    policy_lines,
    policy_table_lines,
    reference_lines,
    shortfall_lines,
)
from loadtest.bench.report import write_section


def main() -> None:
    """Run every simulation and print (and optionally write) the section."""
    parser = argparse.ArgumentParser(description="pool simulator benchmark")
    parser.add_argument("--write", type=Path)
    args = parser.parse_args()
    jobs = all_jobs()
    unique = list(dict.fromkeys(jobs.values()))  # tables share runs: each is done once
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        done = dict(zip(unique, pool.map(run_job, unique), strict=True))
    results = {name: done[job] for name, job in jobs.items()}

    spothedge = POLICY_ROWS[REFERENCE_ROW]
    lines = [*policy_table_lines(results), *reference_lines(results), *shortfall_lines()]
    lines += policy_lines(results, spothedge)
    section = "\n".join(lines)
    print(section)
    if args.write:
        write_section(args.write, "pool-sim", section)


if __name__ == "__main__":
    main()
