"""The switch-floor benchmark's arithmetic: waits in their own run's gaps, goals from the rows."""

from __future__ import annotations

import pytest

from loadtest.bench.switch_floor import ContextRuns, in_gaps, render


def test_each_wait_is_told_in_its_own_runs_gap() -> None:
    # A slow run's waits are not judged against a fast run's pace.
    assert in_gaps([[0.02, 0.04], [0.1]], [0.02, 0.05]) == pytest.approx([1.0, 2.0, 2.0])


def test_the_switch_is_judged_on_its_worst_run() -> None:
    runs = ContextRuns(
        8_000,
        gaps=[0.03, 0.03],
        rounds=[[0.12, 0.15], [0.09]],
        chunks=[[0.03], [0.036]],
        switches=[0.033, 0.039],
    )

    section = render([runs], runs=2, cpu=0)

    # Row: gap median; fresh rounds 120 / 150 ms, 4.00x / 5.00x; the switch 36 / 39 ms.
    assert "| 8,000 | 30.0 ms | 120 / 150 ms | 4.00× / 5.00× | 33 / 36 ms |" in section
    assert "| 36 / 39 ms | 1.20× / 1.30× |" in section
    assert "switch ≤ 1.2× the gap, worst 1.30× (not met); a fresh round's, worst 5.00×" in section
    assert "Tokens that were not the reply's: 0." in section


def test_a_switch_within_the_goal_is_met() -> None:
    runs = ContextRuns(1_000, gaps=[0.02], rounds=[[0.06]], chunks=[[0.02]], switches=[0.021])

    assert "worst 1.05× (met)" in render([runs], runs=1, cpu=1)
