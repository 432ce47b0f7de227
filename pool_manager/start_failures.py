"""Agents that could not start, in a row: when to stop launching more of them (pure).

An agent that cannot start (a bad engine argument, a model it cannot read) registers `gone`
with the reason (`AgentRecord.failure`), and its replacement would fail the same way: a pool
that kept relaunching would pay for GPU instances that boot, fail and are terminated in a loop.
Two failures of a model's agents in a row with the same reason hold its launches (and warm
starts) for `LAUNCH_HOLD_SECONDS`, longer each time the next one after a hold fails the same
way; an agent of the model that comes up ready ends the row, as does a new reason.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from spotgate.registry import AgentRecord, AgentState

FAILURES_BEFORE_HOLD = 2
"""Failures with the same reason in a row that hold a model's launches."""
LAUNCH_HOLD_SECONDS = (300.0, 900.0, 3600.0)
"""How long launches are held after the second such failure, the third, the fourth and on."""
LAUNCHES_HELD_LOG_EVENT = "launches held: agents keep failing to start"
"""What the pool manager logs (`event`) at each pass while a model's launches are held (the
CDK's `StartFailures` alarm counts it)."""


@dataclass(frozen=True)
class StartFailures:
    """A model's agents that could not start since its last agent came up ready."""

    reason: str | None = None  # the latest failure's
    in_a_row: int = 0  # failures with that reason, one after another
    last_at: float = 0.0  # when the latest was written
    counted: frozenset[str] = field(default_factory=frozenset)  # the agents already counted

    def held_until(self) -> float | None:
        """Until when launches are held (None: they are not)."""
        if self.in_a_row < FAILURES_BEFORE_HOLD:
            return None
        step = min(self.in_a_row - FAILURES_BEFORE_HOLD, len(LAUNCH_HOLD_SECONDS) - 1)
        return self.last_at + LAUNCH_HOLD_SECONDS[step]

    def is_holding(self, now: float) -> bool:
        """Whether the model's launches are held at `now`."""
        until = self.held_until()
        return until is not None and now < until


def note_starts(failures: StartFailures, records: Iterable[AgentRecord]) -> StartFailures:
    """The row after reading a model's registry entries (the newest failures last).

    A failure not counted yet lengthens the row if its reason is the row's, else starts a new
    one; an agent that became ready after the latest failure ends it.
    """
    entries = list(records)
    # An entry TTL deleted never comes back: its agent need not be remembered.
    failures = replace(failures, counted=failures.counted & {r.agent_id for r in entries})
    if any(
        r.state is AgentState.READY and r.ready_at is not None and r.ready_at > failures.last_at
        for r in entries
    ):
        failures = StartFailures(counted=failures.counted)
    new = sorted(
        (r for r in entries if r.failure is not None and r.agent_id not in failures.counted),
        key=lambda r: r.changed_at,
    )
    for record in new:
        same = record.failure == failures.reason
        failures = StartFailures(
            reason=record.failure,
            in_a_row=failures.in_a_row + 1 if same else 1,
            last_at=record.changed_at,
            counted=failures.counted | {record.agent_id},
        )
    return failures
