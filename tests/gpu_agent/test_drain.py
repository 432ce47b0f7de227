from __future__ import annotations

import pytest

from gpu_agent.drain import HandBack, StreamLoad, plan_hand_back


@pytest.mark.parametrize(
    ("streams", "now", "expected"),
    [
        # 100 s to the deadline, 15 s margin: 85 s of work is possible.
        ([StreamLoad("short", 100, 10.0)], 0.0, []),  # 10 s of work
        ([StreamLoad("long", 2000, 10.0)], 0.0, ["long"]),  # 200 s of work
        ([StreamLoad("edge", 850, 10.0)], 0.0, []),  # exactly 85 s
        ([StreamLoad("edge", 851, 10.0)], 0.0, ["edge"]),
        ([StreamLoad("new", 5000, None)], 0.0, []),  # rate unknown yet: keep for now
        ([StreamLoad("new", 5000, None), StreamLoad("s", 1, 50.0)], 85.0, ["new", "s"]),
        ([StreamLoad("a", 10, 1.0), StreamLoad("b", 10_000, 1.0)], 50.0, ["b"]),
        ([], 0.0, []),
    ],
)
def test_hand_back_what_cannot_finish_before_the_margin(
    streams: list[StreamLoad], now: float, expected: list[str]
) -> None:
    plan = plan_hand_back(streams, now=now, deadline=100.0, margin_seconds=15.0)
    assert plan == HandBack(move=[], end=expected)


MOVES = dict(moves_early=True)
TOLD = dict(moves_early=True, told_to_move=True)


@pytest.mark.parametrize(
    ("streams", "now", "expected"),
    [
        # A stream that cannot finish is told to move, once, and streams on.
        ([StreamLoad("long", 2000, 10.0, **MOVES)], 0.0, HandBack(move=["long"], end=[])),
        ([StreamLoad("long", 2000, 10.0, **TOLD)], 0.0, HandBack(move=[], end=[])),
        # One that can finish stays, told or not.
        ([StreamLoad("short", 100, 10.0, **MOVES)], 0.0, HandBack(move=[], end=[])),
        # Beside a stream of a gateway that breaks, each is handed back its own way.
        (
            [StreamLoad("mbb", 2000, 10.0, **MOVES), StreamLoad("old", 2000, 10.0)],
            0.0,
            HandBack(move=["mbb"], end=["old"]),
        ),
        # At the margin everything ends, moved or not: the instance is about to go.
        (
            [StreamLoad("told", 2000, 10.0, **TOLD), StreamLoad("mbb", 1, 10.0, **MOVES)],
            85.0,
            HandBack(move=[], end=["told", "mbb"]),
        ),
    ],
)
def test_a_make_before_break_stream_is_told_to_move_then_ended_at_the_margin(
    streams: list[StreamLoad], now: float, expected: HandBack
) -> None:
    assert plan_hand_back(streams, now=now, deadline=100.0, margin_seconds=15.0) == expected
