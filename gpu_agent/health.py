"""Whether the engine still produces tokens: a wedged GPU behind a live agent is caught.

The event loop, `/healthz` and the heartbeats all stay alive when the engine core hangs (a
GPU fault, a stuck collective), so only tokens prove the engine works. While streams run, the
tokens they produce are the proof; while none runs, a one-token probe generation is
(ARCHITECTURE.md). What to do is decided here, from plain numbers; the runtime runs the probe
and acts.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum


class EngineCheck(Enum):
    """What the engine's last signs of life call for."""

    PRODUCING = "producing"  # a stream made a token (or started) within the stall limit
    PROBE = "probe"  # nothing runs: ask for one token
    STALLED = "stalled"  # streams run and none made a token within the stall limit


def engine_check(now: float, last_progress: Iterable[float], stall_seconds: float) -> EngineCheck:
    """The check due, given when each running stream last made progress (monotonic).

    A stream with no token yet counts from its start.
    """
    latest = max(last_progress, default=None)
    if latest is None:
        return EngineCheck.PROBE
    return EngineCheck.STALLED if now - latest > stall_seconds else EngineCheck.PRODUCING
