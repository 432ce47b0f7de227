"""Which streams to hand back while draining: a pure function over what each has left.

A stream that cannot finish before the deadline (less a safety margin) at the rate it is
going is handed back at once, so the gateway resumes it elsewhere while this agent still
runs; the others finish here. At the margin, everything left is handed back.
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


def streams_to_hand_back(
    streams: Sequence[StreamLoad],
    *,
    now: float,
    deadline: float,
    margin_seconds: float = HANDBACK_MARGIN_SECONDS,
) -> list[Hashable]:
    """Keys of the streams to end with `interrupted` now."""
    time_left = deadline - margin_seconds - now
    if time_left <= 0:
        return [stream.key for stream in streams]
    return [
        stream.key
        for stream in streams
        if stream.tokens_per_second is not None
        and stream.tokens_per_second > 0
        and stream.remaining_tokens / stream.tokens_per_second > time_left
    ]
