"""The cold-start benchmark's table: a row per run, then the median and the worst phase by phase."""

from __future__ import annotations

from loadtest.bench.cold_start import PHASES, render


def test_each_run_is_a_row_then_median_and_worst_and_a_phase_not_gone_through_is_a_dash() -> None:
    boots = [
        {"agent_start": 1.0, "engine_loaded": 60.0, "warmed_up": 61.0, "ready": 62.0},
        {"agent_start": 1.2, "engine_loaded": 70.0, "warmed_up": 71.0, "ready": 72.0},
        {"agent_start": 1.1, "engine_loaded": 64.0, "warmed_up": 65.0, "ready": 66.0},
    ]
    lines = render(boots, runs=3).splitlines()

    assert f"| run | {' | '.join(PHASES)} |" in lines
    assert "| 2 | 1.2 | — | 70.0 | 71.0 | 72.0 |" in lines
    assert "| median | 1.1 | — | 64.0 | 65.0 | 66.0 |" in lines
    assert "| worst | 1.2 | — | 70.0 | 71.0 | 72.0 |" in lines
    assert "`--runs" not in lines[2]  # the default number of runs goes unsaid
