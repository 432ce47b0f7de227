"""The switch-floor benchmark's arithmetic: waits in their own run's gaps, goals from the rows."""

from __future__ import annotations

import pytest

from loadtest.bench.switch_floor import ContextRuns, aligned_held, in_gaps, render


def test_each_wait_is_told_in_its_own_runs_gap() -> None:
    # A slow run's waits are not judged against a fast run's pace.
    assert in_gaps([[0.02, 0.04], [0.1]], [0.02, 0.05]) == pytest.approx([1.0, 2.0, 2.0])


@pytest.mark.parametrize(
    ("prompt_tokens", "block_tokens", "held"),
    [
        (32_000, 128, 1),  # the prompt fills whole blocks: one more token is the last
        (8_000, 128, 65),  # 8,064 whole, then the one computed
        (1_000, 128, 25),
        (1_025, 128, 128),  # one past a block already: the next such place is a block on
        (1_000, 16, 9),
    ],
)
def test_an_aligned_round_computes_one_token(
    prompt_tokens: int, block_tokens: int, held: int
) -> None:
    assert aligned_held(prompt_tokens, block_tokens) == held
    assert (prompt_tokens + held - 1) % block_tokens == 0


def test_the_switch_is_judged_on_its_worst_run() -> None:
    runs = ContextRuns(
        8_000,
        128,
        gaps=[0.03, 0.03],
        rounds=[[0.12, 0.15], [0.09]],
        aligned=[[0.06], [0.075]],
        chunks=[[0.03], [0.036]],
        switches=[0.033, 0.039],
    )

    section = render([runs], runs=2, cpu=0)

    # Row: gap median; fresh rounds 120 / 150 ms, 4.00x / 5.00x; aligned; a chunk; the switch.
    assert "| 8,000 | 30.0 ms | 120 / 150 ms | 4.00× / 5.00× | 68 / 75 ms | 2.25× / 2.50× |" in (
        section
    )
    assert "| 33 / 36 ms |" in section
    assert "whole blocks of the engine's cache (128 tokens each)" in section
    assert "| 36 / 39 ms | 1.20× / 1.30× |" in section
    assert (
        "worst 1.30× (not met); a fresh round's, worst 5.00×; an aligned round's, worst 2.50×"
        in (section)
    )
    assert "Tokens that were not the reply's: 0." in section


def test_a_switch_within_the_goal_is_met() -> None:
    runs = ContextRuns(
        1_000,
        128,
        gaps=[0.02],
        rounds=[[0.06]],
        aligned=[[0.04]],
        chunks=[[0.02]],
        switches=[0.021],
    )

    assert "worst 1.05× (met)" in render([runs], runs=1, cpu=1)
