"""How far the gateway trusts an agent: as far as the pool manager vouches for it.

An agent writes its own registry row, and a compromised one can write anything there: a
model it was not launched for, a capacity of a million (to draw every stream), a URL of its
choosing. The pool manager writes a launch record for each agent it starts (the `launches`
table, which agents cannot write): the model, the instance type, the most streams such an
instance serves, and the agent's URL where it is known at launch. `vouch` (pure) holds each
row against it: a row with no launch record, for another model or at another URL is not
routed; a capacity above the launch record's is capped to it. What an agent says it used is
held against what the gateway measured (`gateway/charges.py`). Each finding is logged once
per agent and counted in `spotgate_gateway_rogue_agents_total{reason}`.

Launch records never change, so each is read once (`LaunchBook`); an agent without one is
looked up again every `LAUNCH_RECHECK_SECONDS` (its launcher writes the record just after the
launch, before the agent can be ready).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace
from typing import Protocol

from prometheus_client import Counter

from gateway.charges import Capped, RogueReason
from spotgate.logging import get_logger
from spotgate.registry import AgentRecord, AgentState, LaunchRecord

LAUNCH_RECHECK_SECONDS = 2.0
"""How often the launch record of an agent that had none is looked up again."""

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Vouched:
    """A row as routing may use it (None: not routed), and what was wrong with it."""

    record: AgentRecord | None
    findings: tuple[RogueReason, ...] = ()


def vouch(record: AgentRecord, launch: LaunchRecord | None) -> Vouched:
    """Hold an agent's row against its launch record.

    A `gone` row passes as it is: nothing routes to it, and it stays in the view only so a
    late copy of an older write cannot bring the agent back.
    """
    if record.state is AgentState.GONE:
        return Vouched(record)
    if launch is None:
        return Vouched(None, (RogueReason.UNKNOWN_AGENT,))
    if record.model != launch.model:
        return Vouched(None, (RogueReason.OTHER_MODEL,))
    if launch.url is not None and record.url != launch.url:
        return Vouched(None, (RogueReason.OTHER_URL,))
    capacity = min(record.capacity, launch.capacity)
    findings = (RogueReason.CAPACITY,) if record.capacity > launch.capacity else ()
    # The reported load only ranks agents; held within what the agent may serve.
    active = min(max(record.active, 0), capacity)
    return Vouched(replace(record, capacity=capacity, active=active), findings)


class LaunchReader(Protocol):
    """What `LaunchBook` reads launch records from (the registry)."""

    async def get_launches(self, agent_ids: Collection[str]) -> dict[str, LaunchRecord]:
        """The launch records of these agents (absent: none)."""
        ...


@dataclass
class LaunchBook:
    """Launch records as read, each once; agents without one are looked up again later."""

    clock: Callable[[], float]
    known: dict[str, LaunchRecord] = field(default_factory=dict)
    missing_at: dict[str, float] = field(default_factory=dict)

    async def launches(
        self, reader: LaunchReader, agent_ids: Collection[str]
    ) -> dict[str, LaunchRecord]:
        """The launch records of these agents, reading only those not known yet."""
        now = self.clock()
        wanted = [
            agent_id
            for agent_id in agent_ids
            if agent_id not in self.known
            and now - self.missing_at.get(agent_id, -LAUNCH_RECHECK_SECONDS)
            >= LAUNCH_RECHECK_SECONDS
        ]
        if wanted:
            found = await reader.get_launches(wanted)
            self.known.update(found)
            for agent_id in wanted:
                if agent_id in found:
                    self.missing_at.pop(agent_id, None)
                else:
                    self.missing_at[agent_id] = now
        return {agent_id: self.known[agent_id] for agent_id in agent_ids if agent_id in self.known}

    def retain(self, agent_ids: Collection[str]) -> None:
        """Forget agents no longer in the registry (a whole read of its feed)."""
        keep = set(agent_ids)
        self.known = {key: value for key, value in self.known.items() if key in keep}
        self.missing_at = {key: value for key, value in self.missing_at.items() if key in keep}


@dataclass
class RogueAgents:
    """What agents were caught at: each finding logged once per agent, counted in metrics."""

    counter: Counter | None = None  # `spotgate_gateway_rogue_agents_total`, by reason
    reported: set[tuple[str, RogueReason]] = field(default_factory=set)

    def __post_init__(self) -> None:
        if self.counter is not None:  # every reason exported from the start, at 0
            for reason in RogueReason:
                self.counter.labels(reason=reason.value)

    def row_refused(self, agent_id: str, reason: RogueReason, record: AgentRecord) -> None:
        """A row was not routed, or capped: once per agent and reason (it comes back often)."""
        if (agent_id, reason) in self.reported:
            return
        self.reported.add((agent_id, reason))
        self._count(reason)
        log.warning(
            "agent row not taken at its word: its launch record disagrees",
            agent_id=agent_id,
            reason=reason.value,
            model=record.model,
            capacity=record.capacity,
            url=record.url,
        )

    def usage_capped(self, agent_id: str, capped: Capped) -> None:
        """An agent said a stream used more than the gateway measured: counted per stream."""
        self._count(capped.reason)
        if (agent_id, capped.reason) in self.reported:
            return
        self.reported.add((agent_id, capped.reason))
        log.warning(
            "agent reported more usage than the gateway measured; charged the measure",
            agent_id=agent_id,
            reason=capped.reason.value,
            reported=capped.reported,
            charged=capped.charged,
        )

    def retain(self, agent_ids: Collection[str]) -> None:
        """Forget findings of agents no longer in the registry."""
        keep = set(agent_ids)
        self.reported = {found for found in self.reported if found[0] in keep}

    def _count(self, reason: RogueReason) -> None:
        if self.counter is not None:
            self.counter.labels(reason=reason.value).inc()
