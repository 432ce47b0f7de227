"""`spotgate sim`: replay spot availability traces through the pool policies."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cli.args import (
    CommandError,
    Commands,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    share,
)

if TYPE_CHECKING:
    from pool_manager.sim.simulator import SimModel

REFERENCE_WINDOWS = 10
"""The traces' reference set-up: ten 24-hour windows, averaged (as SpotHedge was measured)."""
MODEL_SPEC = "NAME=TARGET[:LOAD[:TYPE,TYPE...]]"


@dataclass(frozen=True)
class ModelSpec:
    """One `--model`: its load is `--load` where the spec leaves it out."""

    name: str
    target: int
    load: float | None
    instance_types: tuple[str, ...]


def model_spec(text: str) -> ModelSpec:
    """An argument type: `NAME=TARGET[:LOAD[:TYPE,TYPE...]]`."""
    name, equals, rest = text.partition("=")
    parts = rest.split(":")
    if not name.strip() or not equals or len(parts) > 3:
        raise argparse.ArgumentTypeError(f"{text!r} is not {MODEL_SPEC}")
    try:
        target = non_negative_int(parts[0])
        load = non_negative_float(parts[1]) if len(parts) > 1 and parts[1] else None
    except argparse.ArgumentTypeError as err:
        raise argparse.ArgumentTypeError(f"{text!r}: {err}") from err
    types = tuple(t.strip() for t in parts[2].split(",")) if len(parts) > 2 else ()
    if any(not t for t in types):
        raise argparse.ArgumentTypeError(f"{text!r}: an empty instance type")
    return ModelSpec(name.strip(), target, load, types)


def _models(specs: list[ModelSpec], load: float) -> tuple[SimModel, ...]:
    """The `--model` specs as the simulator's models; raise for a name given twice."""
    from pool_manager.sim.simulator import SimModel

    names = [spec.name for spec in specs]
    if twice := sorted({name for name in names if names.count(name) > 1}):
        raise CommandError(f"--model {', '.join(twice)} given more than once")
    return tuple(
        SimModel(
            spec.name,
            spec.target,
            load if spec.load is None else spec.load,
            spec.instance_types,
        )
        for spec in specs
    )


def _sim(args: argparse.Namespace) -> int:
    from pool_manager.sim.runner import policies_named, render_json, render_table, run_policies
    from pool_manager.sim.simulator import SimConfig
    from pool_manager.sim.traces import TraceError

    try:
        policies = policies_named(args.policy)
    except ValueError as err:
        raise CommandError(str(err)) from err
    config = SimConfig(
        target=args.target,
        cold_start_seconds=args.cold_start,
        cold_start_samples=_cold_starts(args.cold_starts) if args.cold_starts else (),
        notice_seconds=args.notice,
        tick_seconds=args.tick,
        on_demand_price_ratio=args.on_demand_price_ratio,
        spot_overprovision=args.overprovision,
        on_demand_hold_seconds=args.on_demand_hold,
        stream_seconds=args.stream_seconds,
        on_demand_refusal_rate=args.on_demand_refusal_rate,
        spot_price_step=args.spot_price_step,
        load=args.load,
        seed=args.seed,
        models=_models(args.model or [], args.load),
    )
    try:
        results = run_policies(
            args.traces, policies, config, windows=args.windows, window_hours=args.window_hours
        )
    except TraceError as err:
        raise CommandError(str(err)) from err
    print(render_json(results) if args.json else render_table(results))
    return 0


def _cold_starts(path: Path) -> tuple[float, ...]:
    """Observed cold starts: `spotgate pool boots --json` output, or a JSON list of seconds."""
    try:
        document = json.loads(path.read_text())
        samples = tuple(
            float(item["cold_start_seconds"] if isinstance(item, dict) else item)
            for item in document
        )
    except (OSError, ValueError, TypeError, KeyError) as err:
        raise CommandError(
            f"{path}: not a list of cold starts (`spotgate pool boots --json`): {err}"
        ) from err
    if not samples or min(samples) < 0:
        raise CommandError(f"{path}: needs at least one cold start, none negative")
    return samples


def setup_sim(commands: Commands) -> None:
    """Add `sim`."""
    sim = commands.add_parser("sim", help="replay spot traces through the pool policy")
    sim.add_argument("--traces", type=Path, required=True, help="directory of zone traces")
    sim.add_argument(
        "--policy",
        help="spotgate (default), on-demand-only, spot-cheapest-zone, even-spread, "
        "a comma-separated list, or all",
    )
    sim.add_argument(
        "--target", type=positive_int, default=3, help="agents to keep ready (one model)"
    )
    sim.add_argument(
        "--cold-start", type=non_negative_float, default=120.0, help="launch to ready, seconds"
    )
    sim.add_argument(
        "--cold-starts",
        type=Path,
        help="observed cold starts to draw each launch's from: `spotgate pool boots --json` "
        "output or a JSON list of seconds (instead of --cold-start)",
    )
    sim.add_argument(
        "--notice", type=non_negative_float, default=120.0, help="spot notice, seconds"
    )
    sim.add_argument("--on-demand-price-ratio", type=positive_float, default=3.0)
    sim.add_argument("--overprovision", type=non_negative_int, default=1, help="spare spot")
    sim.add_argument(
        "--on-demand-hold",
        type=non_negative_float,
        default=1800.0,
        help="seconds spot must hold the target before on-demand agents go",
    )
    sim.add_argument(
        "--stream-seconds",
        type=positive_float,
        default=60.0,
        help="how long each stream runs; past the notice, a preempted agent's streams are "
        "resumed elsewhere or lost",
    )
    sim.add_argument(
        "--load",
        type=non_negative_float,
        default=0.5,
        help="streams offered, as a share of the target's capacity",
    )
    sim.add_argument(
        "--model",
        type=model_spec,
        action="append",
        metavar=MODEL_SPEC,
        help="a model sharing the pool's spot capacity, sized and placed on its own: its "
        "target, its load (default --load) and the instance types it may use (default all); "
        "repeat for each model, instead of --target",
    )
    sim.add_argument(
        "--on-demand-refusal-rate",
        type=share,
        default=0.0,
        help="share of on-demand launches refused for capacity (0 to 1)",
    )
    sim.add_argument(
        "--spot-price-step",
        type=share,
        default=0.0,
        help="each hour every spot price moves by up to this share (a seeded random walk "
        "between half and twice the starting price); 0: prices never move",
    )
    sim.add_argument("--tick", type=positive_float, default=30.0, help="step, seconds")
    sim.add_argument(
        "--windows",
        type=non_negative_int,
        default=REFERENCE_WINDOWS,
        help="average over this many windows at seeded random offsets (default: ten of 24 "
        "hours, the traces' reference set-up); 0: the whole trace",
    )
    sim.add_argument("--window-hours", type=positive_float, default=24.0)
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument("--json", action="store_true", help="JSON instead of a table")
    sim.set_defaults(handler=_sim)
