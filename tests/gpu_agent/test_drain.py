from __future__ import annotations

import pytest

from gpu_agent.drain import StreamLoad, streams_to_hand_back


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
    assert streams_to_hand_back(streams, now=now, deadline=100.0, margin_seconds=15.0) == expected
