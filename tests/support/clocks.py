"""Clocks a test moves by hand, injected wherever a service reads the time."""

from __future__ import annotations

import time


class FakeClock:
    """A clock the test moves by hand (epoch seconds)."""

    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class ShiftedClock:
    """Wall-clock time moved ahead by hand: an expiry comes at once, everything else flows."""

    def __init__(self) -> None:
        self.offset_seconds = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset_seconds

    def advance(self, seconds: float) -> None:
        self.offset_seconds += seconds
