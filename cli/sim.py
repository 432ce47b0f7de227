"""`spotgate sim`: replay spot availability traces through the pool policies."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from cli.args import (
    CommandError,
    Commands,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    region_list,
    share,
)
from pool_manager.sim.config import SimConfig, SimModel

DEFAULTS = SimConfig()
"""The options' defaults: the simulator's, whose pool settings are the pool manager's own
(`spotgate.settings.POOL_DEFAULTS`); only the target and the cold start differ, below."""
DEFAULT_TARGET = 3
DEFAULT_COLD_START_SECONDS = 120.0

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
    from pool_manager.sim.traces import TraceError

    try:
        policies = policies_named(args.policy)
    except ValueError as err:
        raise CommandError(str(err)) from err
    cold_starts, warm_starts = _boots(args.boots) if args.boots else ((), ())
    config = SimConfig(
        target=args.target,
        cold_start_seconds=args.cold_start,
        cold_start_samples=cold_starts,
        warm_pool_size=args.warm_pool,
        warm_pool_filled=not args.warm_pool_empty,
        warm_start_seconds=args.warm_start,
        warm_start_samples=warm_starts,
        on_demand_margin=args.on_demand_margin,
        volume_gib=args.volume_gib,
        volume_dollars_per_gib_month=args.volume_price,
        on_demand_dollars_per_hour=args.on_demand_dollars,
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
        batch_stream_hours=args.batch_stream_hours,
        batch_window_hours=args.batch_window_hours,
    )
    try:
        results = run_policies(
            args.traces,
            policies,
            config,
            windows=args.windows,
            window_hours=args.window_hours,
            regions=args.regions or (),
        )
    except TraceError as err:
        raise CommandError(str(err)) from err
    print(render_json(results) if args.json else render_table(results))
    return 0


def _boots(path: Path) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Observed (cold, warm) starts: `spotgate pool boots --json`, or a JSON list of seconds.

    Each boot feeds the distribution its `kind` names (cold where it names none, as older
    listings and a plain list of seconds are).
    """
    starts: dict[str, list[float]] = {"cold": [], "warm": []}
    try:
        for item in json.loads(path.read_text()):
            if isinstance(item, dict):
                kind = item.get("kind", "cold")
                starts[kind].append(float(item[f"{kind}_start_seconds"]))
            else:
                starts["cold"].append(float(item))
    except (OSError, ValueError, TypeError, KeyError) as err:
        raise CommandError(
            f"{path}: not a list of boots (`spotgate pool boots --json`): {err}"
        ) from err
    samples = starts["cold"] + starts["warm"]
    if not samples or min(samples) < 0:
        raise CommandError(f"{path}: needs at least one boot, none negative")
    return tuple(starts["cold"]), tuple(starts["warm"])


def setup_sim(commands: Commands) -> None:
    """Add `sim`."""
    sim = commands.add_parser("sim", help="replay spot traces through the pool policy")
    sim.add_argument("--traces", type=Path, required=True, help="directory of zone traces")
    sim.add_argument(
        "--regions",
        type=region_list,
        metavar="REGION,REGION...",
        help="place only in these regions' zones of the traces (default: every region of "
        "the traces; the output names those used)",
    )
    sim.add_argument(
        "--policy",
        help="spotgate (default), spothedge, on-demand-only, spot-cheapest-zone, even-spread, "
        "a comma-separated list, or all",
    )
    sim.add_argument(
        "--target",
        type=positive_int,
        default=DEFAULT_TARGET,
        help="agents to keep ready (one model)",
    )
    sim.add_argument(
        "--cold-start",
        type=non_negative_float,
        default=DEFAULT_COLD_START_SECONDS,
        help="launch to ready, seconds",
    )
    sim.add_argument(
        "--boots",
        "--cold-starts",
        type=Path,
        help="observed boots to draw each launch's cold start and each warm start from: "
        "`spotgate pool boots --json` output (each boot's kind says which) or a JSON list of "
        "cold starts in seconds (instead of --cold-start and --warm-start)",
    )
    _add_warm_pool_options(sim)
    _add_spot_options(sim)
    _add_workload_options(sim)
    sim.add_argument(
        "--tick", type=positive_float, default=DEFAULTS.tick_seconds, help="step, seconds"
    )
    sim.add_argument(
        "--windows",
        type=non_negative_int,
        default=REFERENCE_WINDOWS,
        help="average over this many windows at seeded random offsets (default: ten of 24 "
        "hours, the traces' reference set-up); 0: the whole trace",
    )
    sim.add_argument("--window-hours", type=positive_float, default=24.0)
    sim.add_argument("--seed", type=int, default=DEFAULTS.seed)
    sim.add_argument("--json", action="store_true", help="JSON instead of a table")
    sim.set_defaults(handler=_sim)


def _add_warm_pool_options(sim: argparse.ArgumentParser) -> None:
    """The warm pool and what its stopped volumes cost."""
    sim.add_argument(
        "--warm-pool",
        type=non_negative_int,
        default=DEFAULTS.warm_pool_size,
        help="stopped on-demand instances kept per model, started for on-demand cover before "
        "any launch (0: no warm pool)",
    )
    sim.add_argument(
        "--warm-start",
        type=non_negative_float,
        default=DEFAULTS.warm_start_seconds,
        help="a stopped instance's start to ready, seconds",
    )
    sim.add_argument(
        "--warm-pool-empty",
        action="store_true",
        help="start each window with the warm pool empty (default: full, as it is kept while "
        "the model is at zero)",
    )
    sim.add_argument(
        "--on-demand-margin",
        action="store_true",
        help="cover the spot margin on-demand too while spot cannot place it and its loss is "
        "likely (SpotHedge covers it wherever it is missing)",
    )
    sim.add_argument(
        "--volume-gib",
        type=non_negative_float,
        default=DEFAULTS.volume_gib,
        help="a stopped instance's volume, GiB (the deployment's rootVolumeGiB)",
    )
    sim.add_argument(
        "--volume-price",
        type=non_negative_float,
        default=DEFAULTS.volume_dollars_per_gib_month,
        help="its price, dollars per GiB-month (EBS gp3 in us-east-1: 0.08)",
    )
    sim.add_argument(
        "--on-demand-dollars",
        type=positive_float,
        default=DEFAULTS.on_demand_dollars_per_hour,
        help="the on-demand price per hour in dollars, against which the volume is priced",
    )


def _add_spot_options(sim: argparse.ArgumentParser) -> None:
    """Spot's notice, its price against on-demand, its margin and the hold."""
    sim.add_argument(
        "--notice",
        type=non_negative_float,
        default=DEFAULTS.notice_seconds,
        help="spot notice, seconds",
    )
    sim.add_argument(
        "--on-demand-price-ratio", type=positive_float, default=DEFAULTS.on_demand_price_ratio
    )
    sim.add_argument(
        "--overprovision",
        type=non_negative_int,
        default=DEFAULTS.spot_overprovision,
        help="spare spot",
    )
    sim.add_argument(
        "--on-demand-hold",
        type=non_negative_float,
        default=DEFAULTS.on_demand_hold_seconds,
        help="seconds spot must hold the target before on-demand agents go",
    )


def _add_workload_options(sim: argparse.ArgumentParser) -> None:
    """The streams offered, the models sharing the pool, refusals and prices."""
    sim.add_argument(
        "--stream-seconds",
        type=positive_float,
        default=DEFAULTS.stream_seconds,
        help="how long each stream runs; past the notice, a preempted agent's streams are "
        "resumed elsewhere or lost",
    )
    sim.add_argument(
        "--load",
        type=non_negative_float,
        default=DEFAULTS.load,
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
        default=DEFAULTS.on_demand_refusal_rate,
        help="share of on-demand launches refused for capacity (0 to 1)",
    )
    sim.add_argument(
        "--spot-price-step",
        type=share,
        default=DEFAULTS.spot_price_step,
        help="each hour every spot price moves by up to this share (a seeded random walk "
        "between half and twice the starting price); 0: prices never move",
    )
    sim.add_argument(
        "--batch-stream-hours",
        type=non_negative_float,
        default=DEFAULTS.batch_stream_hours,
        help="batch work each model is given as each window opens, in stream-hours: it runs "
        "on the streams interactive ones leave, and the policy may add spot for it",
    )
    sim.add_argument(
        "--batch-window-hours",
        type=positive_float,
        default=DEFAULTS.batch_window_hours,
        help="the batch work's completion window (default 24, OpenAI's)",
    )
