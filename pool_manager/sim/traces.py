"""Spot availability traces: how many spot instances each zone could hold, over time.

One JSON file per zone, `{"metadata": {"gap_seconds": 300}, "data": [16, 12, 0, …]}`, named
`<zone>_<gpu>_<count>.json` (as published with SkyPilot's SpotHedge work).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from spotgate.regions import zone_region

BUNDLED_TRACES_DIR = Path(__file__).parent / "traces"
TRACE_INSTANCE_TYPES = {"v100": "p3.2xlarge"}


class TraceError(ValueError):
    """A trace directory or file that cannot be used, with the reason."""


@dataclass(frozen=True)
class ZoneTrace:
    """Spot capacity of one (instance type, zone) at each sample."""

    zone: str
    instance_type: str
    gap_seconds: float
    capacity: tuple[int, ...]

    def capacity_at(self, seconds: float) -> int:
        """Capacity at a time offset from the start of the trace (the sample it falls in)."""
        index = min(int(seconds // self.gap_seconds), len(self.capacity) - 1)
        return self.capacity[index]

    @property
    def region(self) -> str:
        """The region the zone is in."""
        return zone_region(self.zone)

    @property
    def duration_seconds(self) -> float:
        """How long the trace covers."""
        return self.gap_seconds * len(self.capacity)


def load_trace(path: Path) -> ZoneTrace:
    """One zone's trace file."""
    try:
        document = json.loads(path.read_text())
        gap = float(document["metadata"]["gap_seconds"])
        capacity = tuple(int(value) for value in document["data"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise TraceError(f"{path}: not a spot trace ({err})") from err
    if gap <= 0 or not capacity or min(capacity) < 0:
        raise TraceError(f"{path}: needs a positive gap_seconds and non-negative capacities")
    zone, _, gpu = path.stem.partition("_")
    gpu_kind = gpu.split("_")[0]
    return ZoneTrace(
        zone=zone,
        instance_type=TRACE_INSTANCE_TYPES.get(gpu_kind, gpu_kind or "gpu"),
        gap_seconds=gap,
        capacity=capacity,
    )


def load_traces(directory: Path, regions: Collection[str] = ()) -> list[ZoneTrace]:
    """Every zone trace in a directory (of the zones in `regions`; none: all), sorted by zone."""
    if not directory.is_dir():
        raise TraceError(f"{directory}: no such directory of spot traces")
    traces = [load_trace(path) for path in sorted(directory.glob("*.json"))]
    if not traces:
        raise TraceError(f"{directory}: no *.json trace files")
    return in_regions(traces, regions) if regions else traces


def trace_regions(traces: Sequence[ZoneTrace]) -> tuple[str, ...]:
    """The regions the traces' zones are in, sorted."""
    return tuple(sorted({trace.region for trace in traces}))


def in_regions(traces: Sequence[ZoneTrace], regions: Collection[str]) -> list[ZoneTrace]:
    """The traces of zones in `regions`; raise naming a region the traces do not have."""
    known = trace_regions(traces)
    if unknown := sorted(set(regions) - set(known)):
        raise TraceError(
            f"--regions {', '.join(unknown)}: not a region of these traces "
            f"(theirs: {', '.join(known)})"
        )
    return [trace for trace in traces if trace.region in regions]


def shortfall_share(traces: list[ZoneTrace], target: int) -> float:
    """Share of samples in which all zones together could hold fewer than `target` instances."""
    samples = max(len(t.capacity) for t in traces)
    short = sum(
        1
        for index in range(samples)
        if sum(t.capacity[min(index, len(t.capacity) - 1)] for t in traces) < target
    )
    return short / samples
