"""The engine check: tokens of running streams prove the engine works; else a probe."""

from __future__ import annotations

import pytest

from gpu_agent.health import EngineCheck, engine_check

STALL_SECONDS = 60.0
NOW = 1000.0


@pytest.mark.parametrize(
    ("last_progress", "check"),
    [
        ([], EngineCheck.PROBE),  # nothing runs: ask the engine for a token
        ([NOW - 1], EngineCheck.PRODUCING),
        ([NOW - STALL_SECONDS], EngineCheck.PRODUCING),  # at the limit, not past it
        ([NOW - STALL_SECONDS - 0.1], EngineCheck.STALLED),
        ([NOW - 500, NOW - 2], EngineCheck.PRODUCING),  # one stream moving: the engine runs
        ([NOW - 500, NOW - 90], EngineCheck.STALLED),  # every stream silent past the limit
    ],
)
def test_what_an_engines_last_progress_calls_for(
    last_progress: list[float], check: EngineCheck
) -> None:
    assert engine_check(NOW, last_progress, STALL_SECONDS) is check
