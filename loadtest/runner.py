"""`spotgate loadtest`: headless locust runs, their reports and plots, and a capacity search.

A run is locust itself (`python -m locust -f loadtest/locustfile.py --headless …`) in a
subprocess, so its gevent patching never touches the caller. It leaves in the output folder
locust's CSVs (`locust_stats.csv`, `locust_stats_history.csv`, …) and HTML report, the LLM
summary (`llm.json`), and PNG plots. The capacity search steps the number of users up until
TTFT p99 or the error rate passes its threshold, and reports the last step that held: the
sustained streams and tokens/s an operator sizes `max_agents` from.
"""

from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from stack.local import LocalStackInfo, find_local_stack

LOCUSTFILE = Path(__file__).with_name("locustfile.py")
USER_CLASSES = {
    "ws": ["WebsocketUser"],
    "sse": ["OpenAISseUser"],
    "token": ["TokenUser"],
    "mix": ["WebsocketUser", "OpenAISseUser"],
}
LOCUST_GRACE_SECONDS = 120.0  # beyond the run's duration: spawn, stop, report
STACK_STOP_SECONDS = 120.0


class LoadTestError(RuntimeError):
    """A run could not be made or read; the message says why and where to look."""


@dataclass(frozen=True)
class RunSpec:
    """One headless locust run."""

    host: str
    api_key: str
    out_dir: Path
    users: int = 10
    spawn_rate: float = 10.0
    duration_seconds: int = 60
    user_class: str = "mix"
    model: str = ""
    workload: Path | None = None
    cancel_share: float = 0.0
    streams_per_user: int = 1
    # More gateways of the same deployment: users are spread over `host` and these.
    replicas: tuple[str, ...] = ()


@dataclass(frozen=True)
class RunResult:
    """What a run measured: the LLM summary, and where its files are."""

    spec: RunSpec
    llm: dict[str, Any]
    files: list[Path] = field(default_factory=list)

    @property
    def concurrency(self) -> int:
        """Streams in flight at full spawn."""
        return self.spec.users * self.spec.streams_per_user


def locust_command(spec: RunSpec) -> list[str]:
    """The locust command line for a run."""
    prefix = spec.out_dir / "locust"
    command = [
        sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless",
        "-u", str(spec.users), "-r", str(spec.spawn_rate), "-t", f"{spec.duration_seconds}s",
        "--host", spec.host, "--csv", str(prefix), "--csv-full-history",
        "--html", str(spec.out_dir / "report.html"), "--only-summary",
        "--stop-timeout", "30",
        "--api-key", spec.api_key, "--metrics-out", str(spec.out_dir / "llm.json"),
        "--cancel-share", str(spec.cancel_share),
        "--streams-per-user", str(spec.streams_per_user),
    ]  # fmt: skip
    if spec.model:
        command += ["--model", spec.model]
    if spec.workload is not None:
        command += ["--workload", str(spec.workload)]
    if spec.replicas:
        command += ["--replicas", ",".join(spec.replicas)]
    return command + USER_CLASSES[spec.user_class]


def run_locust(spec: RunSpec) -> RunResult:
    """Run locust headless and read what it wrote."""
    spec.out_dir.mkdir(parents=True, exist_ok=True)
    log = spec.out_dir / "locust.log"
    with log.open("wb") as output:
        try:
            finished = subprocess.run(  # noqa: S603 - our interpreter, our locustfile
                locust_command(spec),
                stdout=output,
                stderr=subprocess.STDOUT,
                timeout=spec.duration_seconds + LOCUST_GRACE_SECONDS,
                check=False,
            )
        except subprocess.TimeoutExpired as err:
            raise LoadTestError(f"locust did not finish in time; see {log}") from err
    summary = spec.out_dir / "llm.json"
    if not summary.exists():
        raise LoadTestError(f"locust exited {finished.returncode} without results; see {log}")
    result = RunResult(spec, json.loads(summary.read_text()), sorted(spec.out_dir.iterdir()))
    plot_run(spec.out_dir)
    return result


def _history(out_dir: Path, name: str) -> list[dict[str, str]]:
    path = out_dir / "locust_stats_history.csv"
    if not path.exists():
        return []
    with path.open() as handle:
        return [row for row in csv.DictReader(handle) if row.get("Name") == name]


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text not in (None, "", "N/A") else None
    except ValueError:
        return None


def plot_run(out_dir: Path) -> list[Path]:
    """TTFT and per-stream tokens/s over time, from locust's history CSV, as PNG files."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    written = []
    for name, title, filename in (
        ("ttft", "time to first token (ms)", "ttft_over_time.png"),
        ("tokens/s per stream", "tokens/s per stream", "tokens_per_second_over_time.png"),
    ):
        rows = _history(out_dir, name)
        if not rows:
            continue
        start = float(rows[0]["Timestamp"])
        figure, axes = plt.subplots(figsize=(8, 4))
        for column in ("50%", "99%"):
            points = [(float(row["Timestamp"]) - start, _number(row.get(column))) for row in rows]
            axes.plot(
                [t for t, v in points if v is not None],
                [v for _, v in points if v is not None],
                label=f"p{column.rstrip('%')}",
            )
        axes.set_xlabel("seconds into the run")
        axes.set_title(title)
        axes.legend()
        path = out_dir / filename
        figure.savefig(path, dpi=100, bbox_inches="tight")
        plt.close(figure)
        written.append(path)
    return written


@dataclass(frozen=True)
class Thresholds:
    """When a step no longer counts as sustained."""

    ttft_p99_ms: float = 2000.0
    error_rate: float = 0.01


def step_holds(llm: dict[str, Any], thresholds: Thresholds) -> bool:
    """Whether a step's TTFT p99 and error rate are within the thresholds."""
    p99 = llm["ttft_ms"]["p99"]
    return (
        llm["completed"] > 0
        and p99 is not None
        and p99 <= thresholds.ttft_p99_ms
        and llm["error_rate"] <= thresholds.error_rate
    )


def sustained(steps: Sequence[RunResult], thresholds: Thresholds) -> RunResult | None:
    """The last step before the first one that failed the thresholds (None: even the first)."""
    held = None
    for step in steps:
        if not step_holds(step.llm, thresholds):
            break
        held = step
    return held


def capacity_search(
    base: RunSpec,
    users: Sequence[int],
    thresholds: Thresholds,
    *,
    announce: Callable[[str], None] = print,
) -> tuple[RunResult | None, list[RunResult]]:
    """Run `users` steps in order until one fails the thresholds; the knee and every step."""
    steps: list[RunResult] = []
    for count in users:
        spec = replace(base, users=count, spawn_rate=max(base.spawn_rate, count),
                       out_dir=base.out_dir / f"users-{count}")  # fmt: skip
        step = run_locust(spec)
        steps.append(step)
        llm = step.llm
        announce(
            f"{step.concurrency} streams: TTFT p99 {llm['ttft_ms']['p99'] or 0:.0f} ms, "
            f"errors {llm['error_rate'] * 100:.1f} %, "
            f"{llm['output_tokens_per_second']:.0f} tokens/s"
        )
        if not step_holds(llm, thresholds):
            break
    plot_search(steps, base.out_dir)
    return sustained(steps, thresholds), steps


def plot_search(steps: Sequence[RunResult], out_dir: Path) -> Path | None:
    """TTFT percentiles and tokens/s against concurrent streams, as one PNG."""
    if not steps:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [step.concurrency for step in steps]
    figure, (ttft, rate) = plt.subplots(1, 2, figsize=(11, 4))
    for key in ("p50", "p99"):
        ttft.plot(x, [step.llm["ttft_ms"][key] or 0 for step in steps], marker="o", label=key)
    ttft.set_xlabel("concurrent streams")
    ttft.set_title("time to first token (ms)")
    ttft.legend()
    rate.plot(x, [step.llm["output_tokens_per_second"] for step in steps], marker="o")
    rate.set_xlabel("concurrent streams")
    rate.set_title("output tokens/s (total)")
    path = out_dir / "capacity.png"
    figure.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(figure)
    return path


@contextmanager
def local_stack(directory: Path, agents: int, gateways: int = 1) -> Iterator[LocalStackInfo]:
    """`spotgate up --engine synthetic` in `directory`, stopped (drained) when the block ends."""
    directory.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "cli", "up", "--engine", "synthetic",
               "--agents", str(agents), "--gateways", str(gateways),
               "--port", "0"]  # fmt: skip
    process = subprocess.Popen(  # noqa: S603 - our own CLI
        command, cwd=directory, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        line = process.stdout.readline() if process.stdout else ""
        info = find_local_stack(directory)
        if not line.startswith("spotgate ready:") or info is None:
            process.kill()
            _, errors = process.communicate(timeout=STACK_STOP_SECONDS)
            raise LoadTestError(f"the local stack did not start: {errors.strip()[-500:]}")
        yield info
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=STACK_STOP_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
