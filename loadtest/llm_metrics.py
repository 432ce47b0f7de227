"""LLM metrics of a load test: per-stream timings in, percentiles and totals out.

Locust knows requests and response times; a streamed completion needs more: time to first
token, the gaps between tokens, tokens per second per stream and in total, queue time,
streams resumed on another agent, and failures by error code. Users record each stream
here; the summary is written as JSON next to locust's own CSVs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from loadtest.bench.report import percentile


@dataclass(frozen=True)
class StreamResult:
    """How one stream went, as its client saw it."""

    started_at: float  # epoch seconds
    ttft_seconds: float | None  # None: no token came
    token_times: Sequence[float]  # monotonic seconds at which each token chunk arrived
    tokens: int
    total_seconds: float
    queue_seconds: float | None = None
    resumed: bool = False
    error: str | None = None  # the error code, if it failed
    cancelled: bool = False


def _spread(values: Sequence[float], scale: float = 1.0) -> dict[str, float | None]:
    def scaled(value: float | None) -> float | None:
        return None if value is None else value * scale

    return {
        "p50": scaled(percentile(values, 0.5) if values else None),
        "p90": scaled(percentile(values, 0.9) if values else None),
        "p99": scaled(percentile(values, 0.99) if values else None),
        "count": len(values),
    }


@dataclass
class LlmMetrics:
    """Everything recorded during a run."""

    streams: list[StreamResult] = field(default_factory=list)

    def record(self, result: StreamResult) -> None:
        """Add one finished (or failed) stream."""
        self.streams.append(result)

    def summary(self, duration_seconds: float) -> dict[str, Any]:
        """Percentiles (ms, tokens/s), totals and failures by code over the run."""
        done = [s for s in self.streams if s.error is None]
        ttfts = [s.ttft_seconds for s in done if s.ttft_seconds is not None]
        gaps = [
            later - earlier
            for s in done
            for earlier, later in zip(s.token_times, s.token_times[1:], strict=False)
        ]
        rates = [
            (s.tokens - 1) / (s.total_seconds - s.ttft_seconds)
            for s in done
            if s.ttft_seconds is not None and s.tokens > 1 and s.total_seconds > s.ttft_seconds
        ]
        queued = [s.queue_seconds for s in done if s.queue_seconds is not None]
        tokens = sum(s.tokens for s in self.streams)
        return {
            "streams": len(self.streams),
            "completed": len(done),
            "cancelled": sum(1 for s in done if s.cancelled),
            "resumed": sum(1 for s in self.streams if s.resumed),
            "failures_by_code": dict(Counter(s.error for s in self.streams if s.error)),
            "error_rate": (len(self.streams) - len(done)) / len(self.streams)
            if self.streams
            else 0.0,
            "ttft_ms": _spread(ttfts, 1000),
            "inter_token_ms": _spread(gaps, 1000),
            "stream_tokens_per_second": _spread(rates),
            "queue_ms": _spread(queued, 1000),
            "output_tokens": tokens,
            "output_tokens_per_second": tokens / duration_seconds if duration_seconds else 0.0,
            "streams_per_second": len(done) / duration_seconds if duration_seconds else 0.0,
        }
