"""The move-gap benchmark reads a stream's arrivals into the gap its move left."""

from __future__ import annotations

import pytest

from loadtest.bench.move_gap_figures import (
    AFTER_SWITCH_DELTAS,
    IMDS_POLL_SECONDS,
    MAX_MODEL_LEN,
    StreamRecord,
    first_difference,
    imds_poll_seconds,
    move_figures,
    move_window_seconds,
    stream_timeout_seconds,
)
from spotgate.settings import AgentSettings


def record(times: list[float], notice_at: float, switch_at: float) -> StreamRecord:
    return StreamRecord(
        delta_times=times,
        delta_tokens=[1] * len(times),
        starts=[(0.0, "a", 0), (switch_at, "b", 4)],
        notice_at=notice_at,
        done_at=times[-1] + 0.001,
    )


def test_the_move_gap_is_the_longest_wait_after_the_notice() -> None:
    # Deltas every 20 ms; the switch at 0.095 s, the next agent's first token at 0.150 s.
    times = [0.02, 0.04, 0.06, 0.08, 0.15, 0.17, 0.19]
    figures = move_figures(record(times, notice_at=0.05, switch_at=0.095))

    assert figures.median_gap == pytest.approx(0.02)
    assert figures.move_gap == pytest.approx(0.07)
    assert figures.ratio == pytest.approx(3.5)
    assert figures.warming_gap == pytest.approx(0.02)  # 0.06 and 0.08, before the switch
    assert figures.after_gap == pytest.approx(0.02)  # 0.17 and 0.19, after the switch's
    assert figures.last_delta_to_start == pytest.approx(0.015)
    assert figures.continuation_ttft == pytest.approx(0.055)
    assert figures.switched_at == 4
    assert figures.reply_seconds == pytest.approx(0.171)
    assert figures.window == (1, 6)  # the last token before the notice, the move gap's last
    assert figures.window_seconds == pytest.approx(0.15)


def test_the_streams_own_pace_is_its_median_gap_before_the_notice() -> None:
    """Gaps slowed by the move (or its warming rounds on a shared machine) are not its pace."""
    times = [0.02, 0.04, 0.06, 0.08, 0.11, 0.14, 0.17, 0.20, 0.23, 0.26, 0.30, 0.32]
    figures = move_figures(record(times, notice_at=0.09, switch_at=0.28))
    assert figures.median_gap == pytest.approx(0.02)
    assert figures.warming_gap == pytest.approx(0.03)


def test_the_move_gap_ends_a_few_deltas_past_the_switch() -> None:
    # After the switch at 0.095 s, a stall well past the next agent's first deltas.
    times = [0.02, 0.04, 0.06, 0.08, *(0.10 + 0.02 * i for i in range(AFTER_SWITCH_DELTAS)), 0.5]
    figures = move_figures(record(times, notice_at=0.05, switch_at=0.095))
    assert figures.move_gap == pytest.approx(0.02)
    assert figures.after_gap == pytest.approx(0.5 - 0.08 - 0.02 * AFTER_SWITCH_DELTAS)


def test_a_longer_wait_before_the_notice_is_not_the_moves() -> None:
    times = [0.02, 0.5, 0.52, 0.54, 0.56, 0.58]  # a slow first token, then the move
    figures = move_figures(record(times, notice_at=0.51, switch_at=0.55))
    assert figures.move_gap == pytest.approx(0.02)


def test_a_stream_that_never_moved_has_no_figures() -> None:
    unmoved = StreamRecord(delta_times=[0.1, 0.2, 0.3], starts=[(0.0, "a", 0)], notice_at=0.15)
    with pytest.raises(ValueError, match="second `start`"):
        move_figures(unmoved)


@pytest.mark.parametrize(
    ("moved", "reference", "expected"),
    [([1, 2, 3], [1, 2, 3], None), ([1, 9, 3], [1, 2, 3], 1), ([1, 2], [1, 2, 3], 2)],
)
def test_where_a_moved_reply_first_differs(
    moved: list[int], reference: list[int], expected: int | None
) -> None:
    assert first_difference(moved, reference) == expected


@pytest.mark.parametrize(
    ("prompt_tokens", "window_seconds"), [(1000, 6.0), (8000, 6.0), (16000, 12.0), (32000, 24.0)]
)
def test_a_longer_conversation_gets_a_longer_window_to_move_in(
    prompt_tokens: int, window_seconds: float
) -> None:
    """Its first round prefills the whole conversation: the notice comes that much earlier."""
    assert move_window_seconds(prompt_tokens) == pytest.approx(window_seconds)
    assert prompt_tokens < MAX_MODEL_LEN


def test_with_aws_notice_the_window_is_the_notice_less_the_drains_margin() -> None:
    """Whatever the context: the notice, not the conversation, decides how long there is."""
    for prompt_tokens in (1000, 32000):
        assert move_window_seconds(prompt_tokens, 120.0, 15.0) == pytest.approx(105.0)


def test_with_aws_notice_the_agents_poll_as_deployed_agents_do() -> None:
    assert imds_poll_seconds(None) == IMDS_POLL_SECONDS
    assert imds_poll_seconds(120.0) == AgentSettings.model_fields["imds_poll_seconds"].default


def test_a_long_reply_gets_longer_than_the_usual_timeout() -> None:
    """Its decode slows as its context grows: from 8,000 tokens of context, ~30 ms a token."""
    assert stream_timeout_seconds(1200) == 300.0
    assert stream_timeout_seconds(12000) > 12000 * 0.03
