"""Which agent gets a stream: a pure function over the gateway's view of the pool.

Least outstanding streams relative to capacity; never a `draining`, expired or excluded
agent; a `session` sticks to one agent by rendezvous hashing (so vLLM's prefix cache hits)
while that agent is healthy, and spills to the next in its ranking when it is full.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from spotgate.registry import AgentState


@dataclass(frozen=True, slots=True)
class Candidate:
    """An agent as the router sees it."""

    agent_id: str
    state: AgentState
    capacity: int
    outstanding: int
    expires_at: float

    def routable(self, now: float) -> bool:
        """Ready and not expired."""
        return self.state is AgentState.READY and self.expires_at > now

    def has_room(self) -> bool:
        """Fewer streams than its capacity."""
        return self.outstanding < self.capacity

    @property
    def load(self) -> float:
        """Outstanding streams as a share of capacity."""
        return self.outstanding / self.capacity if self.capacity > 0 else 1.0


def rendezvous_score(session: str, agent_id: str) -> int:
    """Highest-random-weight score of `agent_id` for `session` (stable across gateways)."""
    digest = hashlib.blake2b(f"{session}\x00{agent_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def choose_agent(
    candidates: Sequence[Candidate],
    *,
    now: float,
    session: str | None = None,
    exclude: Collection[str] = (),
) -> Candidate | None:
    """The agent for a new stream, or None when no healthy agent has room."""
    healthy = [c for c in candidates if c.routable(now) and c.agent_id not in exclude]
    if session:
        ranked = sorted(healthy, key=lambda c: rendezvous_score(session, c.agent_id), reverse=True)
        return next((c for c in ranked if c.has_room()), None)
    with_room = [c for c in healthy if c.has_room()]
    if not with_room:
        return None
    return min(with_room, key=lambda c: (c.load, c.outstanding, c.agent_id))
