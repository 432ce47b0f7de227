"""Which streams to hand back while draining: a pure function over what each has left.

A stream that cannot finish before the deadline (less a safety margin) at the rate it is
going is handed back at once, so the gateway resumes it elsewhere while this agent still
runs; the others finish here. A stream whose gateway moves streams make-before-break
(`move_early`) is told `moving` instead and streams on while the gateway prepares its next
agent. At the margin, everything left is ended with `interrupted`.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

HANDBACK_MARGIN_SECONDS = 15.0
"""Streams still running this close to the deadline are handed back, whatever they have left."""


@dataclass(frozen=True, slots=True)
class StreamLoad:
    """A running stream: tokens still allowed and the rate it has been produced at."""

    key: Hashable
    remaining_tokens: int
    tokens_per_second: float | None  # None until it has produced enough to tell
    moves_early: bool = False  # its gateway takes `moving` and moves it before the break
    told_to_move: bool = False  # `moving` was sent: it streams on until the margin


@dataclass(frozen=True, slots=True)
class HandBack:
    """What the drain does now: streams to tell `moving`, streams to end `interrupted`."""

    move: list[Hashable]
    end: list[Hashable]


def plan_hand_back(
    streams: Sequence[StreamLoad],
    *,
    now: float,
    deadline: float,
    margin_seconds: float = HANDBACK_MARGIN_SECONDS,
) -> HandBack:
    """The streams to tell to move and those to end, at `now`."""
    time_left = deadline - margin_seconds - now
    if time_left <= 0:
        return HandBack(move=[], end=[stream.key for stream in streams])
    late = [
        stream
        for stream in streams
        if stream.tokens_per_second is not None
        and stream.tokens_per_second > 0
        and stream.remaining_tokens / stream.tokens_per_second > time_left
    ]
    return HandBack(
        move=[s.key for s in late if s.moves_early and not s.told_to_move],
        end=[s.key for s in late if not s.moves_early],
    )
