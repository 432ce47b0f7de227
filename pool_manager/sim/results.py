"""What a simulation reports: the pool's figures and each model's, over one window or several."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class ModelResult:
    """What one model of the pool got: its own availability, cost and streams."""

    name: str
    target: int
    availability: float
    cost_vs_on_demand: float
    preemptions: int
    launches: int
    warm_starts: int
    streams_started: int
    streams_resumed: int
    streams_rejected: int
    lost_streams: int
    instance_types: tuple[str, ...]  # those it launched
    # Hours from the span's opening until its batch work was done (None: none, or not done).
    batch_done_hours: float | None = None


@dataclass
class SimResult:
    """What one policy achieved over one span of the traces, for the whole pool.

    Availability counts the ticks in which every model had its target; the cost is relative
    to running every model's target on-demand; counts are summed over the models, whose own
    figures are in `models`.
    """

    policy: str
    availability: float
    cost_vs_on_demand: float
    preemptions: int
    launches: int
    warm_starts: int  # stopped instances of the warm pool started (not counted as launches)
    refused_launches: int
    streams_started: int
    streams_resumed: int
    streams_rejected: int
    lost_streams: int
    hours: float  # instance-hours running
    on_demand_share_of_hours: float
    stopped_hours: float  # instance-hours stopped in the warm pool
    models: list[ModelResult] = field(default_factory=list)
    regions: tuple[str, ...] = ()  # those whose zones it placed in
    batch_stream_hours: float = 0.0  # the batch work each model was given (0: none)
    batch_done_hours: float | None = None  # the slowest model's batch (`ModelResult`'s)

    def as_json(self) -> dict[str, Any]:
        """Plain dict for `spotgate sim --json`."""
        return asdict(self)


def merged_windows(windows: list[ModelResult]) -> ModelResult:
    """One model's figures over several windows: rates averaged, counts summed."""
    first = windows[0]
    return ModelResult(
        name=first.name,
        target=first.target,
        availability=sum(w.availability for w in windows) / len(windows),
        cost_vs_on_demand=sum(w.cost_vs_on_demand for w in windows) / len(windows),
        preemptions=sum(w.preemptions for w in windows),
        launches=sum(w.launches for w in windows),
        warm_starts=sum(w.warm_starts for w in windows),
        streams_started=sum(w.streams_started for w in windows),
        streams_resumed=sum(w.streams_resumed for w in windows),
        streams_rejected=sum(w.streams_rejected for w in windows),
        lost_streams=sum(w.lost_streams for w in windows),
        instance_types=tuple(sorted({t for w in windows for t in w.instance_types})),
        batch_done_hours=latest_done([w.batch_done_hours for w in windows]),
    )


def latest_done(hours: list[float | None]) -> float | None:
    """The slowest batch's hours to done over windows or models; None if any was not done."""
    return None if not hours or None in hours else max(h for h in hours if h is not None)
