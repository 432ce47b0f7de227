"""`spotgate up` run as a user runs it: started, read until ready, stopped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stack.local import UP_FILE

UP_COMMAND = (sys.executable, "-m", "cli", "up")
STOP_TIMEOUT_SECONDS = 60.0


@dataclass(frozen=True)
class RunningUp:
    """A running `spotgate up`: its process and what it wrote to `up.json`."""

    process: subprocess.Popen[str]
    info: dict[str, Any]


@contextmanager
def running_up(
    directory: Path, arguments: Sequence[str], env: Mapping[str, str] | None = None
) -> Iterator[RunningUp]:
    """Run `spotgate up ARGUMENTS` in `directory` until its ready line; stop it after the block.

    A test that stopped it itself leaves nothing to stop; one that failed first has `up` stop
    the rest (SIGTERM), or SIGKILL after `STOP_TIMEOUT_SECONDS`.
    """
    process = subprocess.Popen(
        [*UP_COMMAND, *arguments],
        cwd=directory,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    try:
        line = process.stdout.readline()
        assert line.startswith("spotgate ready:"), line + (
            process.stderr.read() if process.stderr and process.poll() is not None else ""
        )
        yield RunningUp(process, json.loads((directory / UP_FILE).read_text()))
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=STOP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
