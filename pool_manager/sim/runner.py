"""`spotgate sim`: run policies over a trace directory and print a table or JSON."""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import replace
from pathlib import Path

from pool_manager.policy import POLICIES, Policy
from pool_manager.sim.config import SimConfig
from pool_manager.sim.results import ModelResult, SimResult
from pool_manager.sim.simulator import simulate_windows
from pool_manager.sim.traces import load_traces, trace_regions

DEFAULT_POLICY = "spotgate"
ALL_POLICIES = "all"


def policies_named(spec: str | None) -> list[Policy]:
    """Policies from `--policy`: one name, a comma-separated list, or `all`; raise if unknown."""
    if spec is None:
        return [POLICIES[DEFAULT_POLICY]]
    names = list(POLICIES) if spec == ALL_POLICIES else [n.strip() for n in spec.split(",")]
    unknown = [name for name in names if name not in POLICIES]
    if unknown or not names:
        known = ", ".join([*POLICIES, ALL_POLICIES])
        raise ValueError(f"unknown policy {', '.join(unknown) or spec!r}; choose from {known}")
    return [POLICIES[name] for name in names]


def run_policies(
    traces_dir: Path,
    policies: Sequence[Policy],
    config: SimConfig,
    *,
    windows: int = 0,
    window_hours: float = 24.0,
    regions: Collection[str] = (),
) -> list[SimResult]:
    """Each policy over the traces in `traces_dir`, in the zones of `regions` (none: all).

    Raises `TraceError` for bad traces, or a region the traces do not have.
    """
    traces = load_traces(traces_dir, regions)
    placed_in = trace_regions(traces)
    return [
        replace(
            simulate_windows(traces, policy, config, windows=windows, window_hours=window_hours),
            regions=placed_in,
        )
        for policy in policies
    ]


def render_json(results: Sequence[SimResult]) -> str:
    """One JSON object for one run, a list for several (ARCHITECTURE.md)."""
    documents = [result.as_json() for result in results]
    return json.dumps(documents[0] if len(documents) == 1 else documents)


def render_table(results: Sequence[SimResult]) -> str:
    """A plain-text table, one row per policy; under it, one per model when there are several."""
    several = any(len(r.models) > 1 for r in results)
    header = (
        f"{'policy':<20} {'availability':>12} {'cost vs OD':>10} {'preempted':>9} "
        f"{'launches':>8} {'warm':>6} {'refused':>8} {'resumed':>8} {'rejected':>8} {'lost':>6}"
    )
    rows = [header + ("  types" if several else "")]
    for r in results:
        rows.append(
            f"{r.policy:<20} {r.availability * 100:>11.3f}% {r.cost_vs_on_demand * 100:>9.1f}% "
            f"{r.preemptions:>9} {r.launches:>8} {r.warm_starts:>6} {r.refused_launches:>8} "
            f"{r.streams_resumed:>8} "
            f"{r.streams_rejected:>8} {r.lost_streams:>6}"
        )
        if len(r.models) > 1:
            rows += [_model_row(m) for m in r.models]
    if results:
        rows.append(f"regions: {', '.join(results[0].regions)}")
    batched = [r for r in results if r.batch_stream_hours > 0]
    rows += [f"batch work, {r.policy}: {_batch_done(r)}" for r in batched]
    return "\n".join(rows)


def _batch_done(result: SimResult) -> str:
    if result.batch_done_hours is None:
        return "not done within the span"
    return f"done after {result.batch_done_hours:.1f} h (the slowest)"


def _model_row(m: ModelResult) -> str:
    """One model's figures, indented under its policy's row."""
    label = f"  {m.name} ({m.target})"
    return (
        f"{label:<20} {m.availability * 100:>11.3f}% {m.cost_vs_on_demand * 100:>9.1f}% "
        f"{m.preemptions:>9} {m.launches:>8} {m.warm_starts:>6} {'':>8} {m.streams_resumed:>8} "
        f"{m.streams_rejected:>8} {m.lost_streams:>6}  {','.join(m.instance_types) or '-'}"
    )
