"""What the gateway's metrics count of a finished stream."""

from __future__ import annotations

import pytest

from gateway.metrics import GatewayMetrics
from gateway.outcome import RelayOutcome


@pytest.mark.parametrize(
    ("outcome", "counted"),
    [
        # Switched to its next agent before the break, its 3 repeats checked.
        (RelayOutcome(resumes=1, early_moves=1, early_move_checked_tokens=3), (1, 1, 3, 0)),
        # Its next agent went another way and was dropped: moved at the break.
        (
            RelayOutcome(resumes=1, early_move_checked_tokens=2, early_move_diverged=1),
            (1, 0, 2, 1),
        ),
        # Not moved at all.
        (RelayOutcome(), (0, 0, 0, 0)),
    ],
)
def test_moves_and_the_checks_of_next_agents_are_counted(
    outcome: RelayOutcome, counted: tuple[int, int, int, int]
) -> None:
    metrics = GatewayMetrics()
    metrics.record(outcome)
    assert (
        metrics.resumes._value.get(),
        metrics.early_moves._value.get(),
        metrics.early_move_checked_tokens._value.get(),
        metrics.early_move_divergences._value.get(),
    ) == counted
