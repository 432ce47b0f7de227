"""`python -m loadtest.hostile`: run the battery, print (and optionally write) its table."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from loadtest.bench.report import write_section
from loadtest.chaos.report import REPORT_TITLE
from loadtest.hostile.battery import run_battery
from loadtest.hostile.report import render


def main() -> None:
    """Run the battery and print (and optionally write) the table."""
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.hostile", description="spotgate hostile input battery"
    )
    parser.add_argument("--examples", type=int, default=500)
    parser.add_argument("--slow-connections", type=int, default=200)
    parser.add_argument("--guesses", type=int, default=40)
    parser.add_argument("--write", type=Path)
    parser.add_argument("--keep-logs", type=Path, help="copy the processes' logs here")
    args = parser.parse_args()
    rows = asyncio.run(
        run_battery(args.examples, args.slow_connections, args.guesses, args.keep_logs)
    )
    section = render(rows, args.examples)
    print(section)
    if args.write:
        if not args.write.exists():
            args.write.write_text(REPORT_TITLE)
        write_section(args.write, "hostile", section)
    if not all(row.passed for row in rows):
        raise SystemExit("hostile input found a problem")


if __name__ == "__main__":
    main()
