"""`python -m loadtest.chaos`: run the scenarios, print (and optionally write) the table."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from loadtest.bench.report import write_section
from loadtest.chaos.report import REPORT_TITLE, render
from loadtest.chaos.run import DEFAULT_AGENTS, DEFAULT_STREAMS, run_all
from loadtest.chaos.stack import ENGINES, SYNTHETIC


def main() -> None:
    """Run the scenarios and print (and optionally write) the table."""
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.chaos", description="spotgate fault scenarios"
    )
    parser.add_argument("--engine", choices=sorted(ENGINES), default="synthetic")
    parser.add_argument("--agents", type=int, default=DEFAULT_AGENTS)
    parser.add_argument("--streams", type=int, default=DEFAULT_STREAMS)
    parser.add_argument("--aws-down-seconds", type=float, default=30.0)
    parser.add_argument("--settle-seconds", type=float, default=5.0)
    parser.add_argument("--write", type=Path)
    parser.add_argument(
        "--scenario", action="append", default=[], help="run only this one (repeatable)"
    )
    args = parser.parse_args()
    engine = ENGINES[args.engine]
    if args.write and args.scenario:
        parser.error("--write records every scenario: leave out --scenario")
    outcomes = asyncio.run(
        run_all(
            args.agents,
            args.streams,
            args.aws_down_seconds,
            args.settle_seconds,
            engine,
            args.scenario,
        )
    )
    section = render(outcomes, args.agents, args.streams, engine)
    print(section)
    if args.write:
        if not args.write.exists():
            args.write.write_text(REPORT_TITLE)
        write_section(args.write, "chaos" if engine is SYNTHETIC else "chaos-vllm", section)
    if any(outcome.tally.lost for outcome in outcomes):
        raise SystemExit("streams were lost")


if __name__ == "__main__":
    main()
