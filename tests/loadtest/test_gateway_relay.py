"""The relay benchmark's arithmetic: rows against their baseline, and the goals judged from them."""

from __future__ import annotations

import pytest

from loadtest.bench.gateway_relay import _row, goal_lines, path_stats, render
from loadtest.bench.harness import Sample

PATHS = ["direct", "gateway", "litellm", "direct ws", "gateway ws"]


def _sample(ttft_ms: float, tokens_per_second: float = 1000.0) -> Sample:
    return Sample(
        tokens_per_second=tokens_per_second,
        total_tokens=2000,
        server_cpu_seconds=0.5,
        ttfts_seconds=[ttft_ms / 1000] * 100,
        added_ttft_buckets={0.001: 90.0, 0.002: 100.0, float("inf"): 100.0},
    )


def _results(concurrency: int, ttft_ms: dict[str, float]) -> dict[tuple[str, int], list[Sample]]:
    return {(path, concurrency): [_sample(ttft_ms[path])] * 3 for path in PATHS}


def test_each_run_is_also_compared_with_the_baseline_run_beside_it() -> None:
    results = _results(
        100, {"direct": 80, "gateway": 70, "litellm": 400, "direct ws": 50, "gateway ws": 52}
    )
    results[("gateway ws", 100)] = [_sample(52), _sample(70), _sample(51)]  # one noisy run
    stats = path_stats(results, 100, PATHS)
    assert stats["gateway ws"].added_ms == pytest.approx((2, 20))  # over all samples
    assert stats["gateway ws"].added_p99_per_run_ms == pytest.approx((2, 20, 1))
    assert "run beside it +2.0, +20.0, +1.0 ms (median **+2.0 ms**)" in "\n".join(
        goal_lines({100: stats})
    )


def test_rows_add_over_their_own_baseline() -> None:
    results = _results(
        100, {"direct": 80, "gateway": 70, "litellm": 400, "direct ws": 50, "gateway ws": 52}
    )
    stats = path_stats(results, 100, PATHS)
    assert stats["direct"].added_ms is None
    assert stats["direct ws"].added_ms is None  # websocket rows restart the baseline
    assert stats["gateway"].added_ms == (-10, -10)
    assert stats["gateway ws"].added_ms == (2, 2)
    assert stats["gateway"].tokens_per_relay_cpu_second == 4000  # 3 × 2000 tokens / 1.5 CPU-s
    assert stats["direct"].tokens_per_relay_cpu_second is None
    assert stats["gateway"].samples == 300


def test_goals_are_judged_from_the_rows() -> None:
    results = {
        **_results(
            1, {"direct": 50, "gateway": 51, "litellm": 74, "direct ws": 50, "gateway ws": 51}
        ),
        **_results(
            100, {"direct": 80, "gateway": 70, "litellm": 400, "direct ws": 50, "gateway ws": 53}
        ),
    }
    stats = {c: path_stats(results, c, PATHS) for c in (1, 100)}
    lines = "\n".join(goal_lines(stats))
    assert "+1.0 vs +24.0 ms: 24.0× lower" in lines  # 1 stream: a real ratio
    assert "ours -10.0 ms (nothing added) vs +320.0 ms" in lines  # offload: no ratio to take
    assert "relay throughput" not in lines  # no 1000-stream rows


def test_the_1000_stream_goals_are_judged_per_transport() -> None:
    results = _results(
        1000, {"direct": 80, "gateway": 70, "litellm": 400, "direct ws": 50, "gateway ws": 53}
    )
    results[("gateway", 1000)] = [_sample(70, tokens_per_second=900.0)] * 3
    lines = "\n".join(goal_lines({1000: path_stats(results, 1000, PATHS)}))
    # 3 × 2000 tokens over 1.5 CPU-seconds: 4,000 a CPU-second; the own p99 bucket is 2 ms.
    assert "(SSE): relayed tokens per gateway CPU-second ≥ 50,000: **4,000** (not met)" in lines
    assert "900 vs 1,000 tok/s, **90%** (not met)" in lines
    assert "1,000 vs 1,000 tok/s, **100%** (met)" in lines
    assert lines.count("TTFT p99 ≤ 10 ms: **≤ 2 ms** (met)") == 2


def test_the_1000_stream_relay_cost_is_told_run_by_run_with_its_worst() -> None:
    results = _results(
        1000, {"direct": 80, "gateway": 70, "litellm": 400, "direct ws": 50, "gateway ws": 53}
    )
    runs = [_sample(53), _sample(53), _sample(53)]
    for run, cpu_seconds in zip(runs, (0.5, 0.4, 1.0), strict=True):
        run.server_cpu_seconds = cpu_seconds
    results[("gateway ws", 1000)] = runs

    stats = path_stats(results, 1000, PATHS)
    lines = "\n".join(goal_lines({1000: stats}))

    assert stats["gateway ws"].tokens_per_relay_cpu_second_per_run == (4000, 5000, 2000)
    # 6,000 tokens over 1.9 CPU-seconds in all; the worst run is the one to plan for.
    assert "**3,158** (not met), run by run 4,000, 5,000, 2,000 (median 4,000, worst 2,000)" in (
        lines
    )


def test_a_row_says_what_its_failures_were_most_first() -> None:
    results = _results(
        1000, {"direct": 80, "gateway": 70, "litellm": 400, "direct ws": 50, "gateway ws": 52}
    )
    failing = [_sample(400), _sample(400), _sample(400)]
    failing[0].failures, failing[1].failures = 3, 2
    failing[0].failure_kinds.update({"timeout": 2, "HTTP 500": 1})
    failing[1].failure_kinds.update({"timeout": 2})
    results[("litellm", 1000)] = failing

    stats = path_stats(results, 1000, PATHS)

    assert stats["litellm"].failure_kinds == {"timeout": 4, "HTTP 500": 1}
    assert _row(1000, "litellm", stats["litellm"]).endswith("| 5 (4 timeout, 1 HTTP 500) |")
    assert _row(1000, "gateway", stats["gateway"]).endswith("| 0 |")


def test_rows_of_clients_on_their_own_sockets_compare_with_direct_on_their_own_sockets() -> None:
    own = ["direct ws, own sockets", "gateway ws, own sockets"]
    ttft_ms = {"direct": 80, "gateway": 70, "litellm": 400, "direct ws": 50, "gateway ws": 52}
    results = _results(1000, ttft_ms)
    results[(own[0], 1000)] = [_sample(60, tokens_per_second=500.0)] * 3
    results[(own[1], 1000)] = [_sample(65, tokens_per_second=1000.0)] * 3

    stats = path_stats(results, 1000, [*PATHS, *own])
    lines = "\n".join(goal_lines({1000: stats}))
    section = render(results, [1000], 3, 32, [*PATHS, *own])

    assert stats[own[0]].added_ms is None  # its own baseline, not the shared socket's
    assert stats[own[1]].added_ms == pytest.approx((5.0, 5.0))
    assert "(websocket, a socket per client): relayed tokens per gateway CPU-second" in lines
    assert "1,000 vs 500 tok/s, **200%** (met)" in lines
    assert "| 1000 | gateway ws, own sockets | 1,000 |" in section
    assert "each client has a websocket of its own" in section


def test_goals_are_judged_from_the_paths_that_ran() -> None:
    ws_only = ["direct ws", "gateway ws"]
    results = {(path, 100): [_sample(50)] * 3 for path in ws_only}

    lines = goal_lines({100: path_stats(results, 100, ws_only)})

    assert lines == ["Goals, from the rows above:", ""]
