"""The queue's rules when a model's agents are full: who waits ahead, and until when.

First come, first served let one tenant's burst (a thousand streams, each within its key's
limits) hold every other tenant's first token behind the whole backlog. Each waiting stream
is tagged with a virtual start instead: the later of the queue's virtual time and the end of
its tenant's previous share (a stream's share is its cost in tokens), and the queue serves
in tag order. A tenant with a thousand waiting then gets one turn in each round of the
tenants waiting, each turn as long as its stream's tokens; a light tenant's stream waits
behind at most one turn of each other tenant. Flex streams (`service_tier: flex`, every
request of a batch) wait behind every interactive one, in fair turns of their own, and each
interactive stream that must wait stops one running flex stream of its model (`RunningFlex`),
which waits again, in its tier, to resume where it was. Pure but for the stops it calls: the
dispatcher holds a `FairQueue` per model and tier, and one `RunningFlex`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gateway.ratelimit import prompt_tokens_estimate
from spotgate.protocol import GenerateFrame

if TYPE_CHECKING:  # a decision module imports no I/O library: the registry's package does
    from spotgate.registry import PoolForecast

FORECAST_GRACE_SECONDS = 60.0
"""How long past a forecast a stream still waits: registration and the view's refresh,
and a boot a little slower than the ones seen."""
DEFAULT_REPLY_TOKENS = 1_024
"""A stream's reply, counted in its cost where it names no `max_tokens`."""


def stream_cost_tokens(frame: GenerateFrame) -> int:
    """What a stream weighs in the queue: its prompt and the most it may generate."""
    caps = [cap for cap in (frame.max_tokens, frame.max_tokens_cap) if cap is not None]
    reply = min(caps) if caps else DEFAULT_REPLY_TOKENS
    return max(1, prompt_tokens_estimate(frame.prompt_chars()) + reply)


@dataclass(eq=False, slots=True)
class Waiter:
    """A stream in a model's queue (each one itself: compared by identity)."""

    under_way: bool
    tag: float = 0.0  # its virtual start (`FairQueue`); those under way wait ahead of all
    flex: bool = False  # it waits behind every interactive stream not under way
    tenant: str = ""
    held_since: float | None = None  # first held back for another replica's turn

    @property
    def rank(self) -> tuple[int, float]:
        """Its place by kind, then by tag: under way, interactive, flex (flex under way first)."""
        if self.flex:
            return (2, -1.0 if self.under_way else self.tag)
        return (0, 0.0) if self.under_way else (1, self.tag)


def place_in_line(waiters: list[Waiter], me: Waiter) -> int:
    """Where `me` joins the line: those under way, interactive then flex ones by their tags.

    It goes after every waiter of its kind whose tag is not later than its own (equal tags,
    and those under way: first come, first served).
    """
    return next((i for i, w in enumerate(waiters) if w.rank > me.rank), len(waiters))


@dataclass(slots=True)
class FairQueue:
    """Virtual time and each waiting tenant's end of share (SFQ, Goyal et al. 1996)."""

    virtual_time: float = 0.0
    _share_ends: dict[str, float] = field(default_factory=dict)

    def tag(self, tenant: str, cost_tokens: int, weight: float = 1.0) -> float:
        """The virtual start of a stream of `tenant` that joins the queue now.

        Its share lasts its tokens over the tenant's `weight`: a tenant of weight 2 gets
        twice the tokens of one of weight 1 in each round.
        """
        start = max(self.virtual_time, self._share_ends.get(tenant, 0.0))
        self._share_ends[tenant] = start + max(1, cost_tokens) / weight
        return start

    def served(self, tag: float) -> None:
        """A stream tagged `tag` left the queue for an agent: virtual time moves to its start.

        Tenants whose shares ended by then start afresh, as if they had not waited.
        """
        if tag > self.virtual_time:
            self.virtual_time = tag
            self._share_ends = {t: end for t, end in self._share_ends.items() if end > tag}


@dataclass(frozen=True, slots=True)
class Queued:
    """The stream waits; `position` 0 is next; `eta_seconds`: the pool's expected wait."""

    position: int
    eta_seconds: float | None = None


def wait_deadline(
    deadline: float, forecast: PoolForecast | None, queued_at: float, max_wait_seconds: float
) -> float:
    """Until when a queued stream waits: its deadline, stretched to cover a booting agent."""
    if forecast is None:
        return deadline
    covered = forecast.ready_at + FORECAST_GRACE_SECONDS
    return max(deadline, min(covered, queued_at + max_wait_seconds))


def eta_seconds(forecast: PoolForecast | None, now: float) -> float | None:
    """The pool's expected wait for the model's next agent, in whole seconds (None: unknown)."""
    if forecast is None:
        return None
    return float(max(0, math.ceil(forecast.ready_at - now)))


@dataclass(slots=True)
class RunningFlex:
    """The flex streams running on each model's agents, each with what stops it there."""

    _stops: dict[str, dict[int, Callable[[], None]]] = field(default_factory=dict)
    _count: int = 0

    def add(self, model: str, stop: Callable[[], None]) -> int:
        """A flex stream started on one of the model's agents: its key, to remove it by."""
        self._count += 1
        self._stops.setdefault(model, {})[self._count] = stop
        return self._count

    def remove(self, model: str, key: int) -> None:
        """The flex stream ended there (or was stopped)."""
        self._stops.get(model, {}).pop(key, None)

    def counts(self) -> dict[str, int]:
        """Flex streams running per model."""
        return {model: len(stops) for model, stops in self._stops.items() if stops}

    def preempt_one(self, model: str) -> bool:
        """Stop the model's newest flex stream (its place goes to a waiting stream); whether any."""
        stops = self._stops.get(model)
        if not stops:
            return False
        stops.pop(max(stops))()
        return True
