"""Shared helpers for benchmarks: statistics, machine facts, and `docs/benchmarks.md` sections.

Each benchmark owns one section of the report, between `<!-- bench:NAME -->` and
`<!-- /bench:NAME -->`, and rewrites only that section, so benchmarks run separately still
produce one document.
"""

from __future__ import annotations

import platform
import re
import statistics
import sys
import time
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

REPORT_TITLE = (
    "# Benchmarks\n\nEach section names the command that produced it; `make bench` runs them "
    "all and rewrites each section between its markers.\n"
)


def percentile(values: Sequence[float], fraction: float) -> float:
    """The `fraction` quantile (0–1) by nearest rank."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))
    return ordered[index]


def median(values: Sequence[float]) -> float:
    """The median."""
    return statistics.median(values)


def machine_facts(packages: Sequence[str] = ()) -> str:
    """One line: CPU model, cores, Python and the versions of `packages`."""
    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        match = re.search(r"^model name\s*:\s*(.+)$", cpuinfo.read_text(), re.M)
        if match:
            cpu = match.group(1).strip()
    cores = len(re.findall(r"^processor\s*:", cpuinfo.read_text(), re.M)) if cpuinfo.exists() else 0
    versions = ", ".join(f"{name} {metadata.version(name)}" for name in packages)
    facts = f"{cpu}, {cores} cores, Python {platform.python_version()}"
    return f"{facts}, {versions}" if versions else facts


def write_section(report: Path, name: str, body: str) -> None:
    """Replace (or append) the section `name` of the report with `body`."""
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    section = f"{start}\n{body.strip()}\n{end}"
    text = report.read_text() if report.exists() else REPORT_TITLE
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: section, text)
    else:
        text = f"{text.rstrip()}\n\n{section}\n"
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(text)


def publish(section: str, name: str, report: Path | None, started: float) -> None:
    """Print a benchmark's section and its wall time (since `started`); write it to `report`."""
    print(section)
    print(f"wall time {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    if report is not None:
        write_section(report, name, section)
