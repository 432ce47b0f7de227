"""Cold starts as the pool has seen them, per placement, and what they promise the gateways.

An agent's cold start is its instance's launch to its first `ready`, timed once, when the
pool first sees it ready. Per (instance type, zone) the last `COLD_START_SAMPLES` are kept;
the estimate is their `COLD_START_QUANTILE` (most boots are faster), falling back to every
placement's samples and then to the configured default while the pool has seen none. A
model with agents booting gets a forecast: when the first of them is expected ready. The
gateways queue a scale from zero that long, and tell waiting clients.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from pool_manager.policy import PlacementKey, PoolAgent
from spotgate.registry import PoolForecast

COLD_START_SAMPLES = 20
"""Cold starts kept per placement: recent enough to follow a slower model or image."""
COLD_START_QUANTILE = 0.9


def quantile(samples: Sequence[float], q: float) -> float:
    """The `q` quantile of `samples` (nearest rank); `samples` must not be empty."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@dataclass
class ColdStarts:
    """The cold starts seen per placement, and the estimates drawn from them."""

    default_seconds: float
    samples: dict[PlacementKey, deque[float]] = field(default_factory=dict)
    _timed: set[str] = field(default_factory=set)

    def observe(self, agents: Sequence[tuple[str, PoolAgent]]) -> list[tuple[PlacementKey, float]]:
        """Time the agents seen ready for the first time; return those new cold starts."""
        new: list[tuple[PlacementKey, float]] = []
        for _model, agent in agents:
            if agent.ready_at is None or agent.agent_id in self._timed:
                continue
            self._timed.add(agent.agent_id)
            seconds = max(0.0, agent.ready_at - agent.launched_at)
            kept = self.samples.setdefault(agent.placement, deque(maxlen=COLD_START_SAMPLES))
            kept.append(seconds)
            new.append((agent.placement, seconds))
        # Only agents still in the pool need remembering: the set stays the pool's size.
        self._timed.intersection_update(agent.agent_id for _model, agent in agents)
        return new

    def estimate_seconds(self, placement: PlacementKey) -> float:
        """How long a launch in `placement` should take to be ready."""
        kept = self.samples.get(placement)
        if kept:
            return quantile(kept, COLD_START_QUANTILE)
        everywhere = [seconds for kept in self.samples.values() for seconds in kept]
        if everywhere:
            return quantile(everywhere, COLD_START_QUANTILE)
        return self.default_seconds

    def forecasts(
        self, agents: Sequence[tuple[str, PoolAgent]], models: Sequence[str], now: float
    ) -> dict[str, PoolForecast | None]:
        """Per model: when its first booting agent should be ready (None: none is booting).

        A boot already past its estimate is expected any moment (`now`), not in the past.
        """
        found: dict[str, PoolForecast | None] = dict.fromkeys(models)
        for model, agent in agents:
            if agent.phase != "starting":
                continue
            estimate = self.estimate_seconds(agent.placement)
            ready_at = max(now, agent.launched_at + estimate)
            known = found.get(model)
            if known is None or ready_at < known.ready_at:
                found[model] = PoolForecast(ready_at=ready_at, cold_start_seconds=estimate)
        return found
