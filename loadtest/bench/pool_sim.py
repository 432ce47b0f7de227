"""Pool simulator benchmark: availability and cost vs on-demand, our policy and the baselines.

    python -m loadtest.bench.pool_sim [--write docs/benchmarks.md]

Both bundled trace sets, target 4 agents, cold start 3 and 10 minutes, the 2-minute notice,
on-demand at 3× the spot price: every policy over the whole trace; then the on-demand hold
of spotgate's policy swept, the knob that trades cost for availability; then the reference
set-up of the traces' README (target 3, cold start 120 s, ten 24-hour windows, and the whole
trace) next to the figures measured for SpotHedge, with the hold cross-validated: chosen on
one trace set, measured on the other. Runs are spread over the CPUs; each is deterministic.
"""

from __future__ import annotations

import argparse
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

from loadtest.bench.report import machine_facts, write_section
from pool_manager.policy import POLICIES
from pool_manager.sim.simulator import SimConfig, SimResult, simulate_windows
from pool_manager.sim.traces import BUNDLED_TRACES_DIR, load_traces, shortfall_share

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
CROSS_HOLDS_SECONDS = (0.0, 300.0, 900.0, 1800.0, 3600.0)
HARSHER = replace(REFERENCE_CONFIG, on_demand_refusal_rate=0.2, spot_price_step=0.1)
"""The reference set-up where on-demand is refused a fifth of the time and spot prices move."""
LONG_STREAMS_SECONDS = (600.0, 3600.0)
"""Streams that outlive the 2-minute notice: a preempted agent's are resumed or lost."""

Job = tuple[str, str, SimConfig, int]


def _run(job: Job) -> SimResult:
    trace_set, policy, config, windows = job
    traces = load_traces(BUNDLED_TRACES_DIR / trace_set)
    return simulate_windows(traces, POLICIES[policy], config, windows=windows)


def _cell(result: SimResult) -> str:
    return f"{result.availability * 100:.2f} % / {result.cost_vs_on_demand * 100:.1f} %"


def _served(result: SimResult) -> str:
    offered = result.streams_started + result.streams_rejected
    return f"{result.streams_started / offered * 100:.2f} %" if offered else "—"


def _meets(result: SimResult) -> str:
    ok = result.availability >= GOAL_AVAILABILITY and result.cost_vs_on_demand <= GOAL_COST
    return "yes" if ok else "no"


def _beats(result: SimResult, trace_set: str) -> str:
    (availability, cost), _ = REFERENCE[trace_set]
    ok = result.availability > availability and result.cost_vs_on_demand < cost
    return "yes" if ok else "no"


def _tuned_hold(tried: dict[float, SimResult], availability: float) -> float:
    """The cheapest hold reaching `availability`; the most available one if none does."""
    reaching = [hold for hold, r in tried.items() if r.availability >= availability]
    if reaching:
        return min(reaching, key=lambda hold: tried[hold].cost_vs_on_demand)
    return max(tried, key=lambda hold: tried[hold].availability)


def main() -> None:
    """Run every simulation and print (and optionally write) the section."""
    parser = argparse.ArgumentParser(description="pool simulator benchmark")
    parser.add_argument("--write", type=Path)
    args = parser.parse_args()
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
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        results = dict(zip(jobs, pool.map(_run, jobs.values()), strict=True))

    lines = [
        "## Pool simulator: availability and cost vs on-demand",
        "",
        f"Command: `{COMMAND}`.",
        "Traces: the bundled `pool_manager/sim/traces` (SkyPilot's published spot availability "
        "of p3.2xlarge, 5-minute samples: 3 zones × ~11 days probing 16 instances, and 9 zones "
        f"× ~70 days probing 1). Target {TARGET_AGENTS} agents; spot notice 120 s; on-demand "
        "price 3× spot; 30-second ticks over the whole trace; streams of 60 s offered at half "
        "the target's capacity. *Availability*: share of ticks with at least the target ready "
        "and not draining (an agent that got its notice no longer counts). *Cost*: spot and "
        "on-demand instance-hours (booting and draining ones included) over the target on "
        "on-demand all the time. *Streams served*: offered streams that got an agent within "
        "the 60-second queue deadline (the others were refused with `no_capacity`, a clear "
        "error; none of them had started). Goal: ≥ 99.5 % availability at ≤ 50 % cost.",
        f"Machine: {machine_facts()}.",
        "",
        "| trace | cold start | policy | availability / cost | streams served | preemptions "
        "| launches | resumed | lost streams | goal met |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for trace_set in TRACE_SETS:
        for cold in COLD_STARTS_SECONDS:
            for policy in policies:
                r = results[f"policy {trace_set} {cold} {policy}"]
                lines.append(
                    f"| {trace_set} | {cold / 60:.0f} min | {policy} | {_cell(r)} "
                    f"| {_served(r)} | {r.preemptions} | {r.launches} | {r.streams_resumed} "
                    f"| {r.lost_streams} | {_meets(r)} |"
                )
    lines += [
        "",
        "spotgate's policy, on-demand hold swept (how long spot must have held the target "
        "before on-demand agents are drained, unless spot's margin is ready first; default "
        "1800 s):",
        "",
        "| trace | cold start | "
        + " | ".join(f"hold {hold:.0f} s" for hold in HOLDS_SECONDS)
        + " |",
        "|---|---|" + "---|" * len(HOLDS_SECONDS),
    ]
    for trace_set in TRACE_SETS:
        for cold in COLD_STARTS_SECONDS:
            cells = [_cell(results[f"hold {trace_set} {cold} {hold}"]) for hold in HOLDS_SECONDS]
            lines.append(f"| {trace_set} | {cold / 60:.0f} min | " + " | ".join(cells) + " |")
    default_hold = REFERENCE_CONFIG.on_demand_hold_seconds
    lines += [
        "",
        "The traces' reference set-up (target 3, cold start 120 s, on-demand 3×, ten 24-hour "
        "windows at seeded random offsets, averaged: what `spotgate sim --traces DIR --target 3 "
        "--cold-start 120 --on-demand-price-ratio 3` runs), next to the figures in the traces' "
        "README, and the same set-up over the whole trace (`--windows 0`):",
        "",
        "| trace | spotgate, ten windows | SpotHedge (measured there) | beats it on both "
        "| oracle (knows the future) | spotgate, whole trace |",
        "|---|---|---|---|---|---|",
    ]
    for trace_set in TRACE_SETS:
        (availability, cost), oracle = REFERENCE[trace_set]
        ours = results[f"reference {trace_set} {default_hold}"]
        lines.append(
            f"| {trace_set} | {_cell(ours)} | {availability * 100:.2f} % / {cost * 100:.1f} % "
            f"| {_beats(ours, trace_set)} | {oracle} | {_cell(results[f'whole {trace_set}'])} |"
        )
    lines += [
        "",
        "Cross-validation of the one parameter searched, the on-demand hold: on one trace set, "
        "the cheapest hold whose availability reaches SpotHedge's there; that hold, measured on "
        "the other set (reference set-up):",
        "",
        "| tuned on | holds tried: availability / cost | chosen hold | measured on "
        "| result there | beats SpotHedge there |",
        "|---|---|---|---|---|---|",
    ]
    for tuned, measured in (TRACE_SETS, TRACE_SETS[::-1]):
        tried = {hold: results[f"reference {tuned} {hold}"] for hold in CROSS_HOLDS_SECONDS}
        chosen = _tuned_hold(tried, REFERENCE[tuned][0][0])
        there = results[f"reference {measured} {chosen}"]
        grid = "; ".join(f"{hold:.0f} s: {_cell(r)}" for hold, r in tried.items())
        lines.append(
            f"| {tuned} | {grid} | {chosen:.0f} s | {measured} | {_cell(there)} "
            f"| {_beats(there, measured)} |"
        )
    lines += [
        "",
        "The same set-up with on-demand launches refused for capacity a fifth of the time "
        f"(`--on-demand-refusal-rate {HARSHER.on_demand_refusal_rate}`) and every spot price "
        f"moving by up to {HARSHER.spot_price_step * 100:.0f} % an hour (`--spot-price-step "
        f"{HARSHER.spot_price_step}`): a refused placement is passed over and the next one "
        "tried in the same pass; costs are counted at the prices of the hour:",
        "",
        "| trace | spotgate | refused launches (spot and on-demand) |",
        "|---|---|---|",
    ]
    for trace_set in TRACE_SETS:
        r = results[f"harsher {trace_set}"]
        lines.append(f"| {trace_set} | {_cell(r)} | {r.refused_launches:,} |")
    lines += [
        "",
        "Streams that outlive the notice (reference set-up, spotgate's policy, streams "
        "offered at half the target's capacity): a preempted agent hands its unfinished "
        "streams back at its deadline, and each is *resumed* on another agent if one has room "
        "within the 60-second queue deadline, else *lost*:",
        "",
        "| trace | stream length | streams started | preempted | resumed | lost "
        "| refused at admission |",
        "|---|---|---|---|---|---|---|",
    ]
    for trace_set in TRACE_SETS:
        for seconds in LONG_STREAMS_SECONDS:
            r = results[f"long {trace_set} {seconds}"]
            lines.append(
                f"| {trace_set} | {seconds / 60:.0f} min | {r.streams_started:,} "
                f"| {r.preemptions} | {r.streams_resumed:,} | {r.lost_streams:,} "
                f"| {r.streams_rejected:,} |"
            )
    shortfalls = {
        trace_set: shortfall_share(load_traces(BUNDLED_TRACES_DIR / trace_set), TARGET_AGENTS)
        for trace_set in TRACE_SETS
    }
    lines += [
        "",
        "Where the goal falls short, and why: the zones together offer fewer than "
        f"{TARGET_AGENTS} spot instances "
        + " and ".join(
            f"{share * 100:.1f} % of the time ({name})" for name, share in shortfalls.items()
        )
        + ", so on-demand must cover those stretches at 3× the price; and every time spot "
        "capacity collapses with no on-demand agent already up, the pool is short for a full "
        "cold start, because an agent that got its notice takes no new streams and the "
        "replacement needs longer than the 2-minute notice. On-demand agents go once spot "
        "holds the target with its spare ready, not after a fixed hold: that is what brings "
        "the cost down, and the hold now matters only while spot has no spare (on the 3-zone "
        "trace hardly ever, the sweep above). Its price is a second spot loss within one cold "
        "start of the first, which finds no cover: a 10-minute cold start makes that likelier, "
        "and costs the 3-zone trace availability there. The 9-zone trace, with more "
        "independent zones, comes closest to the goal. No stream was lost in any run: "
        "60-second streams finish within the notice, and longer ones are handed back and "
        "resumed (the table above).",
    ]
    section = "\n".join(lines)
    print(section)
    if args.write:
        write_section(args.write, "pool-sim", section)


if __name__ == "__main__":
    main()
