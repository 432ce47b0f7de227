"""Make-before-break: a moving stream's state and rules, as plain data (no I/O, no clock).

An agent that drains says `moving` for a stream that cannot finish in time, and streams on.
The stream's next agent is chosen meanwhile and its continuation opened there at once, from
the tokens the client holds then: it prefills while the draining agent's tokens reach the
client at their own pace. A continuation that came to its first token behind the client is
a warming round (`next_round`): it is cancelled and another opened on the same agent from
where the client is now, which prefills only the tokens the client received meanwhile (the
agent's prefix cache holds the rest), so each round is shorter than the one before. The last
round is opened as the switch. If the round before it was short (`HOLD_GAP_MULTIPLE` of the
stream's median gaps), the client is sent nothing more of the draining agent while it comes
to its first token, the client's next: it waits that once. Else (rounds that stopped
shrinking, `CONVERGED_TTFT_RATIO`, or were spent, `MOVE_WARM_ROUNDS`) the draining agent's
tokens reach the client paced a little slower than they come in (`MOVE_PACE_GAP_MULTIPLE`),
so that the client's stream falls back to where the next agent's stands, a last round's time
later by a few of them; a last round whose agent is too slow for that
(`PACE_GIVE_UP_GAP_MULTIPLE`) is waited for instead (`HoldForNext`), the client sent nothing
meanwhile. The stream switches at the first of the next agent's deltas by which its tokens
equal what the client holds (`early_move_checked_tokens`): the draining agent's later tokens
are dropped and the next agent's repeats of held ones too (`past_held`: of a delta that goes
on past them, the client is sent the rest).
If the draining agent breaks first, the next agent takes over where it stands, unless a
resume elsewhere is sooner (`worth_taking_over`). A next agent that goes another way
(`early_move_diverged`), fails or stays silent is dropped, as is a switch's continuation
that does not come in time (the client is sent the draining agent's tokens it held back):
the stream moves at the break as any stream does.

`Move` is that state, held by the stream's `Failover` (gateway/failover.py) as a value; the
Failover answers the relay (gateway/relay.py) with the effects below, which the relay
carries out: open the next agent (`OpenNext`), open it afresh (`Reopen`), pace the client
(`Pace`) or hold it (`HoldForNext`), relay deltas one at a time or merged (`MergeDeltas`),
switch to the next agent (`Switch`) or let it take over at the break (`TakeOver`), drop it
(`DropNext`), and go on after its repeats (`Repeated`).
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum

import msgspec

from spotgate.protocol import DeltaFrame, DoneFrame, StartFrame

MOVE_WARM_ROUNDS = 4
"""At most this many continuations warm a moving stream's next agent before the one the
stream switches to. Each prefills what the client received while the one before prefilled,
so each is shorter than the one before by a token's prefill over a decode step's gap (a
small share where prefill is batched): a few rounds reach the agent's own turn-around."""
HOLD_GAP_MULTIPLE = 1.2
"""A round that came to its first token within this many of the stream's median gaps is
warm enough: the next one is the switch, for which the client waits about as long, once."""
MOVE_PACE_GAP_MULTIPLE = 1.2
"""While a longer last round catches up, the draining agent's tokens reach the client at most
this many of the stream's median gaps apart (never faster than they come): the client's
stream falls back a fifth of a gap per token, so a last round that took P seconds to its
first token stands where the client does about 6·P seconds later."""
CONVERGED_TTFT_RATIO = 0.5
"""A round that took more than this share of the round before's no longer shrinks: what is
left is the agent's own turn-around (its batch's step, the link), which rounds do not cut."""
PACE_GIVE_UP_GAP_MULTIPLE = 1.1
"""A paced last round whose agent's own gap is this many of the stream's median gaps or more
is waited for instead (`Move.give_up_pacing`): against the paced client it would catch up in
more than a dozen of its lags, costing the reply twice what a wait for its lag's tokens
costs, or never, when the agent is slower than the pace (a busy machine)."""
HOLD_TTFT_MULTIPLE = 4.0
"""A held switch's continuation may take this many of the round before's time to its first
token (and at least as long as the first round's, a resume's prefill) before the client is
sent the draining agent's held tokens and the move is dropped."""
GAPS_REMEMBERED = 128
"""Gaps between a stream's deltas its pace is measured over: a next agent's prefill that slows
the draining agent for a few dozen tokens (one machine) barely moves their median, a lasting
slowdown (one batch) does."""


class CatchUp(Enum):
    """Where a moving stream's next agent stands against what the client holds."""

    BEHIND = "behind"  # not yet at a token boundary where the client is
    CAUGHT_UP = "caught_up"  # it repeated exactly what the client holds: switch to it now
    DIVERGED = "diverged"  # it went another way than the client's tokens: drop it
    FAILED = "failed"  # it ended or broke: drop it


@dataclass(frozen=True, slots=True)
class Repeat:
    """A next agent's delta after a switch, checked against the held tokens it repeats."""

    repeats: bool  # it repeats them (else the switch ends: `on_repeat_failed`)
    beyond: DeltaFrame | None = None  # what it adds past them: the client's next tokens


# The effects a moving stream asks of the relay.


@dataclass(frozen=True, slots=True)
class OpenNext:
    """Choose the stream's next agent and open its continuation there (`next_agent_frame`)."""


@dataclass(frozen=True, slots=True)
class Reopen:
    """Cancel the next agent's continuation and open another there from the client's tokens now.

    `hold_seconds` None: a warming round, or the last one, paced (`Move.pacing`); the draining
    agent's tokens still reach the client.
    Else the switch: the client is sent no more of the draining agent's tokens while the new
    continuation comes to its first token, for at most `hold_seconds`.
    """

    hold_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class Pace:
    """Send the client the draining agent's next delta no sooner than `until` (monotonic)."""

    until: float


@dataclass(frozen=True, slots=True)
class HoldForNext:
    """Send the client no more of the draining agent while the last round catches up.

    The client waits, at most `seconds`, for the next agent to repeat the tokens it holds:
    then the switch; else the move is dropped and the client sent the tokens held back.
    """

    seconds: float


@dataclass(frozen=True, slots=True)
class MergeDeltas:
    """Whether the serving agent's deltas may merge while the client reads (else one a token)."""

    merge: bool


@dataclass(frozen=True, slots=True)
class Switch:
    """The next agent's stream is the client's now; cancel the draining agent's stream."""

    draining: str


@dataclass(frozen=True, slots=True)
class TakeOver:
    """At the break, the next agent's stream goes on as the client's where it stands."""


@dataclass(frozen=True, slots=True)
class DropNext:
    """Cancel the next agent's stream: the move is over, the stream moves at the break."""

    behind_tokens: int | None = None  # at the break: too far behind the client to take over


@dataclass(frozen=True, slots=True)
class Repeated:
    """The next agent repeated held tokens: send on `beyond` (if any), merge its deltas or not."""

    merge: bool
    beyond: DeltaFrame | None = None


MoveEffect = (
    OpenNext | Reopen | Pace | HoldForNext | MergeDeltas | Switch | TakeOver | DropNext | Repeated
)
"""What a moving stream's Failover asks the relay to do."""


def past_held(delta: DeltaFrame, ids_left: Sequence[int], text_left: str) -> DeltaFrame | None:
    """What a next agent's delta adds to the client's stream past the tokens the client holds.

    The delta must begin with the held `ids_left` and their `text_left` and go on past them
    (more tokens, or text the draining agent held back). None: it does not, or its parts
    cannot be cut there (thinking and content both in the one delta).
    """
    if not ids_left and not text_left:  # it starts where the client stands: all of it is new
        return delta if delta.ids or delta.text else None
    ids = list(delta.ids or ())
    held = len(ids_left)
    repeats = ids[:held] == list(ids_left) and delta.text.startswith(text_left)
    if not repeats or (len(ids) == held and len(delta.text) == len(text_left)):
        return None
    text = delta.text[len(text_left) :]
    logprobs = delta.logprobs
    if logprobs is not None:
        if len(logprobs) != len(ids):
            return None
        logprobs = logprobs[held:]
    content, reasoning = delta.content, delta.reasoning
    if content is not None or reasoning is not None:
        if content == delta.text and not reasoning:
            content = text
        elif reasoning == delta.text and not content:
            reasoning = text
        else:
            return None
    return msgspec.structs.replace(
        delta,
        ids=ids[held:],
        n=len(ids) - held,
        text=text,
        logprobs=logprobs,
        content=content,
        reasoning=reasoning,
    )


class Against(Enum):
    """A next agent's delta against the held tokens it is to repeat."""

    SHORT = "short"  # it repeats held ids, and more of them are to come
    DIVERGED = "diverged"  # its ids go another way than the held ones
    REPEATED = "repeated"  # it ends where the held tokens end, or goes on past them
    UNCUT = "uncut"  # it has all the held ids, but their text held back, or not to be cut there


def against_held(
    delta: DeltaFrame, ids_left: Sequence[int], text_before: str, held_text: str
) -> tuple[Against, DeltaFrame | None]:
    """A next agent's delta against the held ids not yet repeated (`ids_left`).

    `text_before` is what its earlier deltas repeated of `held_text`. REPEATED comes with
    what the delta adds past the held tokens (None when it ends exactly where they do).
    """
    ids = list(delta.ids or ())
    compared = min(len(ids), len(ids_left))
    if ids[:compared] != list(ids_left[:compared]):
        return Against.DIVERGED, None
    if len(ids) < len(ids_left):
        return Against.SHORT, None
    if len(ids) == len(ids_left) and text_before + delta.text == held_text:
        return Against.REPEATED, None
    if held_text.startswith(text_before):
        beyond = past_held(delta, ids_left, held_text[len(text_before) :])
        if beyond is not None:
            return Against.REPEATED, beyond
    return Against.UNCUT, None


def worth_taking_over(
    behind_tokens: int, prefill_seconds: float | None, gap_seconds: float | None
) -> bool:
    """Whether a next agent `behind_tokens` short of the client takes over at the break.

    The client waits while it repeats them, `behind_tokens` of its gaps: worth it unless a
    resume elsewhere, a prefill (about as long as its own took, `prefill_seconds`), is
    shorter. One still in its prefill (None) or with one token yet takes over: a resume
    would start a prefill afresh.
    """
    if prefill_seconds is None or gap_seconds is None:
        return True
    return behind_tokens * gap_seconds <= prefill_seconds


def next_silent(
    first_token_at: float | None, sent_at: float, *, monotonic: float, stall_seconds: float
) -> bool:
    """Whether a next agent sent its continuation at `sent_at` has sent no token for too long."""
    return first_token_at is None and monotonic - sent_at > stall_seconds


@dataclass
class Move:
    """A stream's make-before-break state: its pace, its next agent's progress, its repeats."""

    moving: bool = False  # the serving agent said `moving`: its successor is being prepared
    # The next agent's continuation starts after this many of the client's tokens (and this
    # many of its text parts), once opened.
    next_from: int | None = None
    next_text_from: int = 0
    # Its first frames, judged already to repeat held tokens with more to come (a verdict
    # that more held tokens cannot change): their count, and the ids and text they repeat.
    next_judged: int = 0
    next_repeated: int = 0
    next_repeated_text: list[str] = field(default_factory=list)
    # After a switch: held ids the next agent repeats first (dropped), and their text.
    repeats: list[int] = field(default_factory=list)
    repeats_text: str = ""
    repeated_text: list[str] = field(default_factory=list)
    # Gaps between the serving agent's deltas as they came in (seconds): its own pace, which
    # a warming round is measured against.
    recent_gaps: deque[float] = field(default_factory=lambda: deque(maxlen=GAPS_REMEMBERED))
    last_arrived_at: float | None = None  # monotonic
    last_delta_at: float | None = None  # monotonic: when the client was sent the last one
    # Each warming round's time from sending its continuation to its first token (seconds).
    round_ttfts: list[float] = field(default_factory=list)
    pacing: bool = False  # the last round is open, and catches up with a paced client

    @property
    def median_gap(self) -> float | None:
        """The stream's own pace: the median of its recent gaps (None: none measured yet)."""
        return statistics.median(self.recent_gaps) if self.recent_gaps else None

    @property
    def repeating(self) -> bool:
        """Whether the agent's next deltas repeat tokens the client holds (after a switch)."""
        return bool(self.repeats)

    def open_next(self, held_tokens: int, held_parts: int) -> None:
        """The next agent's continuation starts from the client's tokens (and text parts) now."""
        self.next_from = held_tokens
        self.next_text_from = held_parts
        self.next_judged, self.next_repeated, self.next_repeated_text = 0, 0, []

    def next_round(self, ttft_seconds: float) -> Reopen:
        """The round whose continuation came to its first token behind the client is over.

        It took `ttft_seconds`; the next one warms the agent again, or is the switch.
        """
        rounds = self.round_ttfts
        rounds.append(ttft_seconds)
        gap = self.median_gap
        if gap is not None and ttft_seconds <= HOLD_GAP_MULTIPLE * gap:
            return Reopen(hold_seconds=max(HOLD_TTFT_MULTIPLE * ttft_seconds, rounds[0]))
        converged = len(rounds) > 1 and ttft_seconds > CONVERGED_TTFT_RATIO * rounds[-2]
        self.pacing = converged or len(rounds) >= MOVE_WARM_ROUNDS
        return Reopen()

    def give_up_pacing(
        self, behind_tokens: int, next_gap_seconds: float | None
    ) -> HoldForNext | None:
        """Whether the paced last round, `behind_tokens` short of the client, is waited for.

        Yes once its agent's own gap (`next_gap_seconds`, measured over its tokens so far)
        is `PACE_GIVE_UP_GAP_MULTIPLE` of the stream's median gaps: the client then waits
        about as long as those tokens take it, and at most `HOLD_TTFT_MULTIPLE` times that
        (or the first round's time, a resume's prefill).
        """
        gap = self.median_gap
        if not self.pacing or next_gap_seconds is None or gap is None:
            return None
        if next_gap_seconds < PACE_GIVE_UP_GAP_MULTIPLE * gap:
            return None
        self.pacing = False
        wait = HOLD_TTFT_MULTIPLE * behind_tokens * next_gap_seconds
        return HoldForNext(seconds=max([wait, *self.round_ttfts[:1]]))

    def pace_until(self) -> float | None:
        """When the draining agent's next delta may reach the client (monotonic; None: now)."""
        if not self.pacing or self.last_delta_at is None:  # as most deltas find it: no median
            return None
        gap = self.median_gap
        return None if gap is None else self.last_delta_at + MOVE_PACE_GAP_MULTIPLE * gap

    def relayed(self, *, arrived_at: float, monotonic: float) -> None:
        """A delta that came in `arrived_at` reached the client at `monotonic`."""
        if self.last_arrived_at is not None:
            self.recent_gaps.append(arrived_at - self.last_arrived_at)
        self.last_arrived_at = arrived_at
        self.last_delta_at = monotonic

    def judge(
        self, frames: Sequence[object], ids: Sequence[int], text: Sequence[str]
    ) -> tuple[CatchUp, int]:
        """The next agent's frames after the `next_judged` first, against the client's tokens.

        With the verdict, the held tokens it was compared on when it is dropped. Each frame
        that repeats held tokens with more to come is judged once.
        """
        if self.next_from is None:
            return CatchUp.FAILED, 0
        held = ids[self.next_from :]
        held_text = "".join(text[self.next_text_from :])
        for frame in frames:
            if isinstance(frame, StartFrame):
                self.next_judged += 1
                continue
            if isinstance(frame, DeltaFrame):
                repeated = self.next_repeated
                text_before = "".join(self.next_repeated_text)
                against, _ = against_held(frame, held[repeated:], text_before, held_text)
                if against is Against.DIVERGED:
                    return CatchUp.DIVERGED, repeated + min(
                        len(frame.ids or ()), len(held) - repeated
                    )
                if against is Against.SHORT:
                    self.next_judged += 1
                    self.next_repeated += len(frame.ids or ())
                    self.next_repeated_text.append(frame.text)
                    continue
                if against is Against.REPEATED:
                    return CatchUp.CAUGHT_UP, 0
                return CatchUp.BEHIND, 0  # its text held back, or not to be cut where the client is
            if isinstance(frame, DoneFrame):  # it ended short of the client's tokens
                return CatchUp.DIVERGED, self.next_repeated
            # An error, its link lost, or its own agent draining (`moving`).
            return CatchUp.FAILED, 0
        return CatchUp.BEHIND, 0

    def behind(self, held_tokens: int) -> int:
        """The client's tokens the next agent has yet to repeat (of those judged so far)."""
        if self.next_from is None:
            return 0
        return held_tokens - self.next_from - self.next_repeated

    def take_over(self, ids: Sequence[int], text: Sequence[str]) -> None:
        """The next agent's stream is the client's now: its repeats of held tokens are owed."""
        if self.next_from is None:
            raise RuntimeError("a stream switched with no next agent")
        self.repeats = list(ids[self.next_from :])
        self.repeats_text = "".join(text[self.next_text_from :])
        self.repeated_text = []
        self.abandon()

    def repeat(self, delta: DeltaFrame) -> tuple[Against, DeltaFrame | None]:
        """A delta of the next agent while it repeats held tokens, against those left."""
        text_before = "".join(self.repeated_text)
        against, beyond = against_held(delta, self.repeats, text_before, self.repeats_text)
        if against is Against.SHORT:
            self.repeats = self.repeats[len(delta.ids or ()) :]
            self.repeated_text.append(delta.text)
        elif against is not Against.DIVERGED:
            self.repeats = []
        return against, beyond

    def abandon(self) -> None:
        """No next agent any more: the stream stays, and may move again."""
        self.moving = False
        self.next_from = None
        self.round_ttfts = []
        self.pacing = False

    def leave_agent(self) -> None:
        """The serving agent's stream is over: its pace and the repeats it owed go with it."""
        self.last_arrived_at = None  # the next agent's pace is its own, from its first delta
        # Repeats it still owed are no other agent's: one resumed from the client's tokens
        # sends new ones only (a repeat checked against them could drop one of them).
        self.repeats = []
        self.repeated_text = []
