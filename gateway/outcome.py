"""How a client stream went (`RelayOutcome`), and what ends or moves it when its agent's does.

Plain data: the stream's `Failover` (gateway/failover.py) fills the outcome in and makes the
decisions; the relay (gateway/relay.py) carries them out; metrics, limits and usage read the
outcome once the stream is over.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from gateway.charges import Capped
from spotgate.protocol import ErrorCode, ErrorFrame, Timings


@dataclass
class RelayOutcome:
    """How a relayed stream went, for metrics and limits."""

    agent_id: str | None = None
    resumes: int = 0
    completion_tokens: int = 0
    prompt_tokens: int = 0
    relayed_tokens: int = 0  # sent to the client so far
    queue_ms: float = 0.0
    ttft_ms: float | None = None
    added_ttft_ms: float | None = None  # the gateway's own share of `ttft_ms`, if not queued
    error: ErrorCode | None = None
    early_moves: int = 0  # moves made before the break (`moving`)
    preemptions: int = 0  # places given to interactive streams (a flex stream's)
    # The checks of each next agent's first tokens against the draining agent's, switched to
    # or dropped: tokens compared, and how many next agents differed (batch-dependent
    # numerics; either continues what the client holds).
    early_move_checked_tokens: int = 0
    early_move_diverged: int = 0
    # Counts agents reported above what the gateway measured (`gateway.charges`), by agent.
    capped: list[tuple[str, Capped]] = field(default_factory=list)

    def timings(self, total_ms: float) -> Timings:
        """The stream's timings once it ends `total_ms` after it arrived (TTFT: none yet, all)."""
        ttft_ms = self.ttft_ms if self.ttft_ms is not None else total_ms
        return Timings(queue_ms=self.queue_ms, ttft_ms=ttft_ms, total_ms=total_ms)


class Unplaced(Enum):
    """Why the dispatcher found no agent for the stream."""

    UNKNOWN_MODEL = "unknown_model"  # no agent serves it, nor can one be started for it
    QUEUE_FULL = "queue_full"  # too many streams already wait for the model
    NO_CAPACITY = "no_capacity"  # no agent had room before the deadline


@dataclass(frozen=True, slots=True)
class ResumeElsewhere:
    """Place the stream again: `failed_agent` is excluded, the wait has a fresh deadline."""

    failed_agent: str
    tokens_so_far: int


@dataclass(frozen=True, slots=True)
class WaitForRoom:
    """`full_agent` refused the stream for capacity: place it again within the same deadline."""

    full_agent: str


@dataclass(frozen=True, slots=True)
class GiveUp:
    """End the client's stream with `error`."""

    error: ErrorFrame


Decision = ResumeElsewhere | WaitForRoom | GiveUp
