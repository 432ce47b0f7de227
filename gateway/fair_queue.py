"""Who waits ahead when a model's agents are full: start-time fair queueing over tenants.

First come, first served let one tenant's burst (a thousand streams, each within its key's
limits) hold every other tenant's first token behind the whole backlog. Each waiting stream
is tagged with a virtual start instead: the later of the queue's virtual time and the end of
its tenant's previous share (a stream's share is its cost in tokens), and the queue serves
in tag order. A tenant with a thousand waiting then gets one turn in each round of the
tenants waiting, each turn as long as its stream's tokens; a light tenant's stream waits
behind at most one turn of each other tenant. Pure: the dispatcher holds one per model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.ratelimit import prompt_tokens_estimate
from spotgate.protocol import GenerateFrame

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


def place_in_line(waiters: list[Waiter], me: Waiter) -> int:
    """Where `me` joins the line: those under way first, the rest in order of their tags.

    Under way, it goes after those under way already; otherwise after every tag not later
    than its own (equal tags: first come, first served).
    """
    if me.under_way:
        return sum(w.under_way for w in waiters)
    return next(
        (i for i, w in enumerate(waiters) if not w.under_way and w.tag > me.tag), len(waiters)
    )


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
