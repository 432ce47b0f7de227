from __future__ import annotations

import pytest

from loadtest.llm_metrics import LlmMetrics, StreamResult


def stream(ttft: float, tokens: int, total: float, **extra: object) -> StreamResult:
    times = [100.0 + ttft + n * (total - ttft) / max(tokens - 1, 1) for n in range(tokens)]
    return StreamResult(0.0, ttft, times, tokens, total, **extra)  # type: ignore[arg-type]


def test_summary_has_ttft_gaps_rates_queue_resumes_and_failures() -> None:
    metrics = LlmMetrics()
    metrics.record(stream(0.05, 11, 1.05, queue_seconds=0.002))  # 10 gaps of 100 ms
    metrics.record(stream(0.15, 11, 0.65, resumed=True))  # 10 gaps of 50 ms, 20 tokens/s
    metrics.record(StreamResult(0.0, None, [], 0, 5.0, error="no_capacity"))
    summary = metrics.summary(duration_seconds=2.0)
    assert summary["streams"] == 3
    assert summary["completed"] == 2
    assert summary["resumed"] == 1
    assert summary["failures_by_code"] == {"no_capacity": 1}
    assert summary["error_rate"] == pytest.approx(1 / 3)
    assert summary["ttft_ms"]["p50"] == pytest.approx(50)
    assert summary["ttft_ms"]["p99"] == pytest.approx(150)
    assert summary["inter_token_ms"]["count"] == 20
    assert summary["inter_token_ms"]["p50"] == pytest.approx(50)
    assert summary["stream_tokens_per_second"]["p50"] == pytest.approx(10)
    assert summary["stream_tokens_per_second"]["p99"] == pytest.approx(20)
    assert summary["queue_ms"]["p50"] == pytest.approx(2)
    assert summary["output_tokens_per_second"] == pytest.approx(11.0)


def test_an_empty_run_has_no_percentiles() -> None:
    summary = LlmMetrics().summary(10.0)
    assert summary["ttft_ms"] == {"p50": None, "p90": None, "p99": None, "count": 0}
    assert summary["error_rate"] == 0.0
