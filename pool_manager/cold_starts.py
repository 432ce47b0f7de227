"""Boots as the pool has seen them, per placement and kind, and what they promise the gateways.

An agent's boot is its instance's launch (a cold start) or its start from the warm pool (a
warm start) to its first `ready`, timed once, when the pool first sees it ready. Per kind
and (instance type, zone) the last `COLD_START_SAMPLES` are kept; the estimate is their
`COLD_START_QUANTILE` (most boots are faster), falling back to every placement's boots of
that kind; a warm start with none timed yet is expected within a cold start's time (it
skips what a cold one does first), and a cold start within the configured default while the
pool has timed none. A model with agents booting gets a forecast: when the first of them is
expected ready, by the estimate of its own kind. The gateways queue a scale from zero that
long, and tell waiting clients.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from pool_manager.pool_view import PlacementKey, PoolAgent
from spotgate.registry import BootKind, PoolForecast

COLD_START_SAMPLES = 20
"""Boots kept per placement and kind: recent enough to follow a slower model or image."""
COLD_START_QUANTILE = 0.9


def quantile(samples: Sequence[float], q: float) -> float:
    """The `q` quantile of `samples` (nearest rank); `samples` must not be empty."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@dataclass(frozen=True, slots=True)
class TimedBoot:
    """One boot just timed: its kind, placement, and seconds from launch (or start) to ready."""

    kind: BootKind
    placement: PlacementKey
    seconds: float


@dataclass
class ColdStarts:
    """The boots seen per kind and placement, and the estimates drawn from them."""

    default_seconds: float  # a cold start, until the pool has timed one
    samples: dict[tuple[BootKind, PlacementKey], deque[float]] = field(default_factory=dict)
    _timed: set[str] = field(default_factory=set)

    def observe(
        self, agents: Sequence[tuple[str, PoolAgent]], warm: Collection[str] = ()
    ) -> list[TimedBoot]:
        """Time the agents seen ready for the first time (`warm`: those started warm)."""
        new: list[TimedBoot] = []
        for _model, agent in agents:
            if agent.ready_at is None or agent.agent_id in self._timed:
                continue
            self._timed.add(agent.agent_id)
            kind: BootKind = "warm" if agent.agent_id in warm else "cold"
            seconds = max(0.0, agent.ready_at - agent.launched_at)
            kept = self.samples.setdefault(
                (kind, agent.placement), deque(maxlen=COLD_START_SAMPLES)
            )
            kept.append(seconds)
            new.append(TimedBoot(kind, agent.placement, seconds))
        # Only agents still in the pool need remembering: the set stays the pool's size, and
        # an instance stopped and started again is timed again.
        self._timed.intersection_update(agent.agent_id for _model, agent in agents)
        return new

    def estimate_seconds(self, placement: PlacementKey, kind: BootKind = "cold") -> float:
        """How long a boot of this kind in `placement` should take to be ready."""
        kept = self.samples.get((kind, placement))
        if kept:
            return quantile(kept, COLD_START_QUANTILE)
        everywhere = [
            seconds for (seen, _), kept in self.samples.items() if seen == kind for seconds in kept
        ]
        if everywhere:
            return quantile(everywhere, COLD_START_QUANTILE)
        if kind == "warm":
            return self.estimate_seconds(placement, "cold")
        return self.default_seconds

    def forecasts(
        self,
        agents: Sequence[tuple[str, PoolAgent]],
        models: Sequence[str],
        now: float,
        warm: Collection[str] = (),
    ) -> dict[str, PoolForecast | None]:
        """Per model: when its first booting agent should be ready (None: none is booting).

        An agent started from the warm pool (in `warm`) is expected by the warm estimate. A
        boot already past its estimate is expected any moment (`now`), not in the past.
        """
        found: dict[str, PoolForecast | None] = dict.fromkeys(models)
        for model, agent in agents:
            if agent.phase != "starting":
                continue
            kind: BootKind = "warm" if agent.agent_id in warm else "cold"
            estimate = self.estimate_seconds(agent.placement, kind)
            ready_at = max(now, agent.launched_at + estimate)
            known = found.get(model)
            if known is None or ready_at < known.ready_at:
                found[model] = PoolForecast(ready_at=ready_at, cold_start_seconds=estimate)
        return found
