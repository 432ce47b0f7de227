"""Which agent gets a stream: a pure function over the gateway's view of the pool.

Least loaded relative to capacity, where load is the larger of this gateway's own streams on
an agent and the agent's own count at its last heartbeat (other gateways' streams included);
never a `draining`, expired or excluded agent, nor one that just said it is full. A `session`
sticks to one agent by rendezvous hashing (so vLLM's prefix cache hits) while that agent is
healthy, and spills to the next in its ranking when it is full.

A stream with no session goes where its prompt's prefix was sent before (`PrefixAffinity`, from
gateway/prefix.py), so that agent's prefix cache skips most of its prefill: among the agents
with room no busier than the least loaded by more than a bound (`max_load_skew`, a share of
capacity), the one sent the longest prefix of it wins, ties broken by rendezvous hashing on
its conversation. Past the bound a hot prefix spills to a less loaded agent, which learns it.

At equal load (or equal prefix), an agent in the gateway's own region goes first: one in another
region adds a round trip to each token's way (us-east-1 to us-west-2: about 65 ms), so it is
chosen when it is the one with room or the less loaded.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Network, IPv6Network, ip_address
from urllib.parse import urlsplit

from spotgate.registry import AgentState


@dataclass(frozen=True, slots=True)
class Candidate:
    """An agent as the router sees it."""

    agent_id: str
    state: AgentState
    capacity: int
    outstanding: int
    expires_at: float
    reported: int = 0
    """Streams the agent said it served at its last heartbeat, over every gateway."""
    full: bool = False
    """The agent just refused a stream for capacity (other gateways' streams fill it)."""
    adapters: frozenset[str] = frozenset()
    """LoRA adapters this gateway sent it lately: most likely loaded there still."""
    remote: bool = False
    """In another region than this gateway: its tokens come a round trip later."""

    def routable(self, now: float) -> bool:
        """Ready and not expired."""
        return self.state is AgentState.READY and self.expires_at > now

    def has_room(self) -> bool:
        """Fewer of this gateway's streams than its capacity, and not just refused for it.

        The reported count is not trusted for this: it is a heartbeat old, and the agent itself
        refuses what it has no room for.
        """
        return not self.full and self.outstanding < self.capacity

    @property
    def load(self) -> float:
        """Streams on it as a share of capacity (this gateway's, or all at the last heartbeat)."""
        busy = max(self.outstanding, self.reported)
        return busy / self.capacity if self.capacity > 0 else 1.0


@dataclass(frozen=True, slots=True)
class PrefixAffinity:
    """What a stream's prompt says about each agent."""

    matched_blocks: Mapping[str, int]
    """Leading blocks of the prompt this gateway sent each agent (its prefix cache may hold)."""
    conversation: str
    """The prompt's conversation key: ties go by rendezvous hashing on it, as sessions do."""
    max_load_skew: float
    """How much busier than the least loaded agent with room one may be and still be chosen."""


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
    affinity: PrefixAffinity | None = None,
    adapter: str | None = None,
) -> Candidate | None:
    """The agent for a new stream, or None when no healthy agent has room.

    A stream with a LoRA adapter goes among the agents that have it loaded, if one has room:
    elsewhere it would wait for the adapter to load.
    """
    healthy = [c for c in candidates if c.routable(now) and c.agent_id not in exclude]
    if adapter is not None:
        loaded = [c for c in healthy if adapter in c.adapters and c.has_room()]
        healthy = loaded or healthy
    if session:
        ranked = sorted(healthy, key=lambda c: rendezvous_score(session, c.agent_id), reverse=True)
        return next((c for c in ranked if c.has_room()), None)
    with_room = [c for c in healthy if c.has_room()]
    if not with_room:
        return None
    if affinity is None:
        return min(with_room, key=lambda c: (c.load, c.remote, c.outstanding, c.agent_id))
    # A hair over, so a load exactly at the bound stays within it whatever the float rounding.
    bound = min(c.load for c in with_room) + affinity.max_load_skew + 1e-9
    near = [c for c in with_room if c.load <= bound]
    return max(
        near,
        key=lambda c: (
            affinity.matched_blocks.get(c.agent_id, 0),
            not c.remote,
            rendezvous_score(affinity.conversation, c.agent_id),
        ),
    )


def agent_url_allowed(url: str, networks: Collection[IPv4Network | IPv6Network]) -> bool:
    """Whether the gateway may connect to an agent at `url`: an address in one of `networks`.

    With no networks every URL is allowed (local mode). A host name is refused when there
    are some: what it resolves to is not the registry's to decide.
    """
    if not networks:
        return True
    try:
        address = ip_address(urlsplit(url).hostname or "")
    except ValueError:
        return False
    return any(address in network for network in networks)
