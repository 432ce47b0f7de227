from __future__ import annotations

from loadtest.bench.seeded_draw import check_batch_invariance, measure, render


def test_the_benchmark_times_both_draws_and_checks_the_batched_one() -> None:
    check_batch_invariance(vocabulary=2_000)  # raises if a row's batched draw is not its own
    measured = measure(streams=4, runs=2, steps=3, vocabulary=2_000)

    assert len(measured.per_row_seconds) == len(measured.batched_seconds) == 6
    table = render([measured], runs=2, steps=3, vocabulary=2_000)
    assert "| 4 |" in table
    assert "2,000-token vocabulary" in table
