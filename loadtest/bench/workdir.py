"""Where a benchmark keeps its files: its servers' logs, kept if asked, and scratch space."""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path


def add_logs_option(parser: argparse.ArgumentParser) -> None:
    """Give a benchmark's command line `--logs DIR`: keep its servers' logs there."""
    parser.add_argument("--logs", type=Path, help="keep the servers' logs here")


@contextlib.contextmanager
def scratch_dir() -> Iterator[Path]:
    """A temporary directory for a benchmark's files (its model, say), removed after."""
    with tempfile.TemporaryDirectory(prefix="spotgate-bench-") as scratch:
        yield Path(scratch)


@contextlib.contextmanager
def logs_dir(kept: Path | None) -> Iterator[Path]:
    """Where a benchmark's servers log: `kept` (made if missing, left after), or a temporary one."""
    if kept is not None:
        kept.mkdir(parents=True, exist_ok=True)
        yield kept
        return
    with scratch_dir() as scratch:
        yield scratch


def print_log_tails(logs: Path, lines: int = 30) -> None:
    """The last lines of every server log, to stderr (when a benchmark cannot start)."""
    for log in sorted(logs.glob("*.log")):
        tail = log.read_text(errors="replace").splitlines()[-lines:]
        print(f"--- {log.name} (last lines)", file=sys.stderr)
        print("\n".join(tail), file=sys.stderr)
