"""`spotgate loadtest`: locust against a gateway (or a local synthetic stack it starts)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from dataclasses import replace
from pathlib import Path

from cli.args import CommandError, Commands, positive_float, positive_int, share


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
        url, key, model, replicas = args.url, args.api_key, args.model, args.replica
        if url is None:
            info = stack.enter_context(local_stack(out / "stack", args.agents, args.gateways))
            url, key, model = info.gateway_url, info.api_key, model or info.model or ""
            replicas = info.gateways[1:]
            print(
                f"local stack (synthetic engine, {args.agents} agents) at {url}"
                + (f" and {', '.join(replicas)}" if replicas else ""),
                flush=True,
            )
        if not key:
            raise CommandError("--api-key (or SPOTGATE_API_KEY) is needed with --url")
        spec = RunSpec(
            host=str(url), api_key=key, out_dir=out, users=args.users,
            spawn_rate=args.spawn_rate, duration_seconds=args.duration,
            user_class=args.user_class, model=model or "", workload=args.workload,
            cancel_share=args.cancel_share, streams_per_user=args.streams_per_user,
            replicas=tuple(replicas),
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


def setup_loadtest(commands: Commands) -> None:
    """Add `loadtest`."""
    loadtest = commands.add_parser("loadtest", help="run locust against a gateway")
    loadtest.add_argument("--url", help="the gateway (default: start a local synthetic stack)")
    loadtest.add_argument("--api-key", default=os.environ.get("SPOTGATE_API_KEY", ""))
    loadtest.add_argument("--model", default="", help="default: the first served model")
    loadtest.add_argument("--users", type=positive_int, default=10)
    loadtest.add_argument("--spawn-rate", type=positive_float, default=10.0)
    loadtest.add_argument("--duration", type=positive_int, default=60, help="seconds")
    loadtest.add_argument("--user-class", choices=["ws", "sse", "token", "mix"], default="mix")
    loadtest.add_argument("--workload", type=Path, help="JSONL prompts (default: built-in mix)")
    loadtest.add_argument("--cancel-share", type=share, default=0.0)
    loadtest.add_argument("--streams-per-user", type=positive_int, default=1)
    loadtest.add_argument("--agents", type=positive_int, default=1, help="for the local stack")
    loadtest.add_argument(
        "--gateways", type=positive_int, default=1, help="gateway replicas of the local stack"
    )
    loadtest.add_argument(
        "--replica",
        action="append",
        default=[],
        metavar="URL",
        help="another gateway of the --url deployment (repeat); users are spread over them",
    )
    loadtest.add_argument("--out", type=Path, help="default: loadtest-results/<time>")
    loadtest.add_argument("--capacity-search", action="store_true")
    loadtest.add_argument("--start-users", type=positive_int, default=4)
    loadtest.add_argument("--step-users", type=positive_int, default=4)
    loadtest.add_argument("--max-users", type=positive_int, default=256)
    loadtest.add_argument("--step-seconds", type=positive_int, default=30)
    loadtest.add_argument("--max-ttft-p99-ms", type=positive_float, default=2000.0)
    loadtest.add_argument("--max-error-rate", type=share, default=0.01)
    loadtest.set_defaults(handler=_loadtest)
