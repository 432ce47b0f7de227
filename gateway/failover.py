"""Failover of one client stream: a pure state machine over what the client already has.

The relay (gateway/relay.py) does the I/O — waiting for an agent, opening the stream on its
link, reading the agent's frames, cancelling — and tells a `Failover` what happened; the
Failover says what the client sees and what happens next. No asyncio, no clock of its own:
each event that needs the time is given it (`now`: wall clock, as the dispatcher's deadlines
are; `monotonic`: for the stream's timings).

The rules (ARCHITECTURE.md):

- An agent that answers `interrupted` (it is draining), whose link is lost, or that sends
  nothing for the stream past the stall limit (a wedged engine behind a live agent), is
  excluded and the stream is placed again, with a fresh deadline, on another agent.
  That agent's `generate` carries `resume`: the token ids and text the client already has,
  so no token is lost and none repeated. Any other agent error goes to the client and ends
  its stream.
- An agent that answers `no_capacity` is full (of other gateways' streams: each agent is
  the authority on its own capacity): the stream waits for room again, hearing its queue
  position, within the same deadline, on that agent or any other.
- An agent that cannot be reached is excluded too; the stream goes on waiting for another
  within the same deadline.
- When no agent can take the stream in time, or its model is unknown, or too many streams
  wait for it, the client gets a clear error, telling a request never served from a stream
  that could not be resumed.
- `queued` frames reach the client only before its first token (a resume waits silently),
  `start` only when the serving agent changes: each change after the first is a resume.
  `start` names the agent by a handle of this stream's own (`agent_handle`), never by its id:
  the same while the stream stays on one agent, another when it moves, and unrelated to the
  handles of any other stream, so a client learns only whether its own stream moved.
- A client may send `resume` itself, to continue through this gateway a stream it holds part
  of (its gateway went away): the stream starts as one that has those tokens, and its first
  agent continues after them, as after a move.
- A client that asked for token ids gets with each delta a receipt for every id it holds
  (gateway/receipts.py), which its own `resume` brings back.
- Make-before-break: an agent that drains says `moving` for a stream that cannot finish
  in time, and streams on. The stream's next agent is chosen meanwhile and its continuation
  opened there at once, from the tokens the client holds then: it prefills while the
  draining agent's tokens still reach the client, paced a little slower than they come in
  (`MOVE_PACE_GAP_MULTIPLE`, by the gaps they come in at, measured on through the move), so
  the client's stream falls back to where the next agent stands. The stream switches at the
  first of the next agent's deltas by which its tokens equal what the client holds
  (`early_move_checked_tokens`): the client sees no wait, the draining agent's later tokens
  are dropped and the next agent's repeats of held ones too (`past_held`: of a delta that
  goes on past them, the client is sent the rest).
  If the draining agent breaks first, the next agent takes over where it stands. A next
  agent that goes another way (`early_move_diverged`), fails or stays silent is dropped: the
  stream moves at the break as any stream does.
"""

from __future__ import annotations

import hashlib
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum

from gateway.charges import Capped, charged_prompt_tokens, charged_usage, prompt_token_bound
from gateway.receipts import ReceiptChain
from spotgate.admission import unknown_model
from spotgate.protocol import (
    DeltaFrame,
    DoneFrame,
    ErrorCode,
    ErrorFrame,
    GenerateFrame,
    QueuedFrame,
    Resume,
    StartFrame,
    Timings,
)

RETRYABLE_AGENT_ERRORS = frozenset({ErrorCode.INTERRUPTED, ErrorCode.NO_CAPACITY})
"""Agent errors after which the stream is placed again rather than ended."""
AGENT_HANDLE_BYTES = 8
HANDLE_KEY_BYTES = 32
"""The length of the random key each stream names its agents with."""
QUEUE_FULL_RETRY_AFTER_SECONDS = 1.0
NO_CAPACITY_RETRY_AFTER_SECONDS = 5.0
MOVE_PACE_GAP_MULTIPLE = 1.25
"""While a moving stream's next agent catches up, the draining agent's tokens reach the
client at most this many of the stream's median gaps apart (never faster than they come):
the client's stream falls back a quarter of a gap per token, so a next agent that took P
seconds to its first token stands where the client does about 4·P seconds later, and no
gap the client sees on the way is much longer than the stream's usual ones."""
GAPS_REMEMBERED = 128
"""Gaps between a stream's deltas its pace is measured over: a next agent's prefill that slows
the draining agent for a few dozen tokens (one machine) barely moves their median, a lasting
slowdown (one batch) does."""


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


class CatchUp(Enum):
    """Where a moving stream's next agent stands against what the client holds."""

    BEHIND = "behind"  # not yet at a token boundary where the client is: keep pacing
    CAUGHT_UP = "caught_up"  # it repeated exactly what the client holds: switch to it now
    DIVERGED = "diverged"  # it went another way than the client's tokens: drop it
    FAILED = "failed"  # it ended or broke: drop it


@dataclass(frozen=True, slots=True)
class Repeat:
    """A next agent's delta after a switch, checked against the held tokens it repeats."""

    repeats: bool  # it repeats them (else the switch ends: `on_repeat_failed`)
    beyond: DeltaFrame | None = None  # what it adds past them: the client's next tokens


def past_held(delta: DeltaFrame, ids_left: Sequence[int], text_left: str) -> DeltaFrame | None:
    """What a next agent's delta adds to the client's stream past the tokens the client holds.

    The delta must begin with the held `ids_left` and their `text_left` and go on past them
    (more tokens, or text the draining agent held back). None: it does not, or its parts
    cannot be cut there (thinking and content both in the one delta).
    """
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
    return delta.model_copy(
        update={
            "ids": ids[held:],
            "n": len(ids) - held,
            "text": text,
            "logprobs": logprobs,
            "content": content,
            "reasoning": reasoning,
        }
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


def agent_handle(handle_key: bytes, agent_id: str) -> str:
    """What a stream's `start` calls its agent: a keyed hash of its id, the key the stream's own."""
    digest = hashlib.blake2b(agent_id.encode(), key=handle_key, digest_size=AGENT_HANDLE_BYTES)
    return digest.hexdigest()


@dataclass
class Failover:
    """One client stream across the agents that serve it, from request to `done` or `error`."""

    request: GenerateFrame  # as the client sent it (its id is the client's stream id)
    handle_key: bytes  # random, this stream's own: what its `start` frames name agents with
    deadline_seconds: float  # how long each placement may wait for an agent
    deadline: float  # wall clock: when the current placement stops waiting
    started_at: float  # monotonic
    outcome: RelayOutcome = field(default_factory=RelayOutcome)
    ids: list[int] = field(default_factory=list)  # token ids the client has
    text: list[str] = field(default_factory=list)  # and their text
    excluded: set[str] = field(default_factory=set)  # agents this stream must not go to
    queued: bool = False  # the stream ever waited in the dispatcher's queue
    placements: int = 0  # agent streams opened
    serving: str | None = None  # the agent whose stream is open, until it ends
    announced_agent: str | None = None  # the agent the client's last `start` named
    receipts: ReceiptChain | None = None  # receipts for the ids the client holds
    move_early: bool = True  # agents are asked to say `moving` rather than break the stream
    moving: bool = False  # the serving agent said `moving`: its successor is being prepared
    # The next agent's continuation starts after this many of the client's tokens (and this
    # many of its text parts), once opened: the draining agent's tokens are paced meanwhile.
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
    # a move's pacing of the client does not change, and which a move may slow.
    recent_gaps: deque[float] = field(default_factory=lambda: deque(maxlen=GAPS_REMEMBERED))
    last_arrived_at: float | None = None  # monotonic
    last_delta_at: float | None = None  # monotonic: when the client was sent the last one

    @classmethod
    def begin(
        cls,
        request: GenerateFrame,
        *,
        deadline_seconds: float,
        now: float,
        monotonic: float,
        handle_key: bytes,
        outcome: RelayOutcome | None = None,
        receipts: ReceiptChain | None = None,
        move_early: bool = True,
    ) -> Failover:
        """A stream that has just arrived (with `resume`: one the client holds part of)."""
        held = request.resume
        if receipts is not None and held is not None:
            receipts.extend(held.token_ids)
        return cls(
            request=request,
            handle_key=handle_key,
            deadline_seconds=deadline_seconds,
            deadline=now + deadline_seconds,
            started_at=monotonic,
            outcome=outcome if outcome is not None else RelayOutcome(),
            ids=list(held.token_ids) if held is not None else [],
            text=[held.text] if held is not None else [],
            receipts=receipts,
            move_early=move_early,
        )

    @property
    def repeating(self) -> bool:
        """Whether the agent's next deltas repeat tokens the client holds (after a switch)."""
        return bool(self.repeats)

    @property
    def has_tokens(self) -> bool:
        """Whether the client already has tokens of this stream (a move is then a resume)."""
        return bool(self.ids)

    # Waiting for an agent.

    def on_queued(self, position: int, eta_seconds: float | None = None) -> QueuedFrame | None:
        """The stream waits in the queue: the client hears it only before its first token."""
        self.queued = True
        if self.has_tokens:  # a resume waits silently: the client already has a stream
            return None
        return QueuedFrame(id=self.request.id, position=position, eta_seconds=eta_seconds)

    def on_unplaced(self, why: Unplaced) -> ErrorFrame:
        """No agent could take the stream: the error that ends the client's stream."""
        model = self.request.model
        if why is Unplaced.UNKNOWN_MODEL:  # it was known when admitted: its agents all left
            refusal = unknown_model(self.request)
            self.outcome.error = refusal.code
            return ErrorFrame(
                id=self.request.id, code=refusal.code, message=refusal.message, param=refusal.param
            )
        if why is Unplaced.QUEUE_FULL:
            code = ErrorCode.RATE_LIMITED
            message = f"too many requests wait for '{model}'; retry shortly"
            retry_after = QUEUE_FULL_RETRY_AFTER_SECONDS
        else:
            code = ErrorCode.NO_CAPACITY
            what = "resume the stream" if self.has_tokens else "serve the request"
            message = f"no agent for '{model}' could {what} in time"
            retry_after = NO_CAPACITY_RETRY_AFTER_SECONDS
        self.outcome.error = code
        return ErrorFrame(id=self.request.id, code=code, message=message, retry_after=retry_after)

    def on_agent_chosen(self, *, monotonic: float) -> None:
        """The dispatcher chose an agent: the first time, the stream's wait in the queue ends."""
        if self.outcome.queue_ms == 0.0:
            self.outcome.queue_ms = (monotonic - self.started_at) * 1000

    def on_unavailable(self, agent_id: str) -> None:
        """The chosen agent cannot be reached: wait for another (same deadline)."""
        self.excluded.add(agent_id)

    def agent_frame(self, agent_stream_id: str) -> GenerateFrame:
        """The `generate` frame for the chosen agent, with `resume` once the client has tokens."""
        resume = (
            Resume(  # validation copies the ids: later tokens do not change this frame
                token_ids=self.ids,
                text="".join(self.text),
                completion_tokens=len(self.ids),
            )
            if self.has_tokens
            else None
        )
        return self.request.model_copy(
            update={
                "id": agent_stream_id,
                "want_ids": True,
                "resume": resume,
                "move_early": self.move_early,
            }
        )

    def on_moving(self) -> bool:
        """The serving agent drains and said `moving`: whether to prepare a move now."""
        if self.moving or self.serving is None:
            return False
        self.moving = True
        return True

    def next_agent_frame(self, agent_stream_id: str) -> GenerateFrame:
        """The next agent's continuation of a moving stream, from the tokens the client has now.

        The draining agent's tokens are paced from here until the stream switches.
        """
        self.next_from = len(self.ids)
        self.next_text_from = len(self.text)
        self.next_judged, self.next_repeated, self.next_repeated_text = 0, 0, []
        return self.agent_frame(agent_stream_id)

    def pace_until(self) -> float | None:
        """When the draining agent's next delta may reach the client (monotonic; None: now)."""
        if self.next_from is None or self.last_delta_at is None or not self.recent_gaps:
            return None
        return self.last_delta_at + MOVE_PACE_GAP_MULTIPLE * statistics.median(self.recent_gaps)

    def on_next_agent_frames(self, frames: Sequence[object]) -> CatchUp:
        """The next agent's frames after the `next_judged` first, against the client's tokens.

        It is caught up at a delta that ends where the client stands, or goes on past it,
        having repeated the client's ids and text: the stream switches to it there
        (`on_switch`), and the client is sent what it adds (`on_repeated_delta`). Each frame
        that repeats held tokens with more to come is judged once, so a long catch-up costs
        each of the draining agent's deltas the next agent's new frames only.
        """
        if self.next_from is None:
            return CatchUp.FAILED
        held = self.ids[self.next_from :]
        held_text = "".join(self.text[self.next_text_from :])
        for frame in frames:
            if isinstance(frame, StartFrame):
                self.next_judged += 1
                continue
            if isinstance(frame, DeltaFrame):
                repeated = self.next_repeated
                text_before = "".join(self.next_repeated_text)
                against, _ = against_held(frame, held[repeated:], text_before, held_text)
                if against is Against.DIVERGED:
                    compared = repeated + min(len(frame.ids or ()), len(held) - repeated)
                    return self._drop_next_agent(CatchUp.DIVERGED, compared=compared)
                if against is Against.SHORT:
                    self.next_judged += 1
                    self.next_repeated += len(frame.ids or ())
                    self.next_repeated_text.append(frame.text)
                    continue
                if against is Against.REPEATED:
                    return CatchUp.CAUGHT_UP
                return CatchUp.BEHIND  # its text held back, or not to be cut where the client is
            if isinstance(frame, DoneFrame):  # it ended short of the client's tokens
                return self._drop_next_agent(CatchUp.DIVERGED, compared=self.next_repeated)
            # An error, its link lost, or its own agent draining (`moving`).
            return self._drop_next_agent(CatchUp.FAILED, compared=0)
        return CatchUp.BEHIND

    @property
    def next_behind(self) -> int:
        """The client's tokens the next agent has yet to repeat (of those judged so far)."""
        if self.next_from is None:
            return 0
        return len(self.ids) - self.next_from - self.next_repeated

    def on_switch(self) -> str:
        """The next agent takes the stream over (caught up, or its draining agent broke first).

        Returns the draining agent, whose stream is over for this client: its later tokens
        are dropped, and so are the next agent's repeats of the tokens the client holds.
        """
        draining = self._leave_agent()
        self.excluded.add(draining)
        self.on_next_agent_takes_over()
        return draining

    def on_next_agent_takes_over(self) -> None:
        """The next agent's stream is the client's now: its repeats of held tokens are dropped."""
        if self.next_from is None:
            raise RuntimeError("a stream switched with no next agent")
        self.repeats = self.ids[self.next_from :]
        self.repeats_text = "".join(self.text[self.next_text_from :])
        self.repeated_text = []
        self.moving = False
        self.next_from = None
        self.outcome.early_moves += 1

    def on_repeated_delta(self, delta: DeltaFrame) -> Repeat:
        """A delta of the next agent while it repeats held tokens: whether it repeats them.

        A delta that does (its ids and, at the end, their text) is dropped, but for what it
        adds past them, which the client is sent; one that does not ends the switch
        (`on_repeat_failed`).
        """
        ids = delta.ids or ()
        self.outcome.early_move_checked_tokens += min(len(ids), len(self.repeats))
        text_before = "".join(self.repeated_text)
        against, beyond = against_held(delta, self.repeats, text_before, self.repeats_text)
        if against is Against.DIVERGED:
            self.outcome.early_move_diverged += 1
            return Repeat(repeats=False)
        if against is Against.SHORT:
            self.repeats = self.repeats[len(ids) :]
            self.repeated_text.append(delta.text)
            return Repeat(repeats=True)
        self.repeats = []
        return Repeat(repeats=against is Against.REPEATED, beyond=beyond)

    def on_repeat_failed(self, *, now: float) -> ResumeElsewhere:
        """The next agent did not repeat the client's tokens: move on from them elsewhere.

        It is not excluded: a continuation there from the client's tokens is as good as any.
        """
        agent = self._leave_agent()
        self.deadline = now + self.deadline_seconds
        return ResumeElsewhere(failed_agent=agent, tokens_so_far=len(self.ids))

    def on_move_abandoned(self) -> None:
        """Preparing the move failed: the stream stays, and moves at the break if it comes."""
        self.moving = False
        self.next_from = None

    def _drop_next_agent(self, verdict: CatchUp, *, compared: int) -> CatchUp:
        self.outcome.early_move_checked_tokens += compared
        if verdict is CatchUp.DIVERGED:
            self.outcome.early_move_diverged += 1
        self.on_move_abandoned()
        return verdict

    def on_opened(self, agent_id: str) -> None:
        """The agent's stream is open: its frames follow."""
        self.placements += 1
        self.serving = agent_id

    # The agent's frames.

    def on_start(self, start: StartFrame) -> StartFrame | None:
        """The agent took the stream: the client hears of it when the agent is a new one.

        The prompt is charged from here on, whatever ends the stream (once: an agent taking
        the stream over reads the same prompt again, at no cost to the key), at most what
        the request can make (`gateway.charges`).
        """
        if not self.outcome.prompt_tokens and start.prompt_tokens is not None:
            charged, capped = charged_prompt_tokens(
                start.prompt_tokens, prompt_token_bound(self.request)
            )
            self.outcome.prompt_tokens = charged
            if capped is not None:
                self.outcome.capped.append((self.serving or "", capped))
        if start.agent == self.announced_agent:
            return None
        if self.announced_agent is not None:
            self.outcome.resumes += 1
        self.announced_agent = start.agent
        self.outcome.agent_id = start.agent
        handle = agent_handle(self.handle_key, start.agent)
        return StartFrame(id=self.request.id, agent=handle, engine=start.engine)

    def on_delta(
        self,
        delta: DeltaFrame,
        *,
        monotonic: float,
        arrived_at: float,
        agent_sent_at: float,
        agent_first_token_at: float | None,
    ) -> DeltaFrame:
        """More tokens: kept for a resume, and passed on in the client's stream id.

        `arrived_at` is when the agent's delta came in, `monotonic` when the client is sent
        it. The first token fixes the stream's time to first token; the gateway's own share
        of it is known only for a stream served by its first agent without waiting, from when
        the agent's stream was sent (`agent_sent_at`) and its first token came in.
        """
        outcome = self.outcome
        if self.last_arrived_at is not None:
            self.recent_gaps.append(arrived_at - self.last_arrived_at)
        self.last_arrived_at = arrived_at
        self.last_delta_at = monotonic
        if outcome.ttft_ms is None:
            outcome.ttft_ms = (monotonic - self.started_at) * 1000
            first_try = self.placements == 1 and not self.queued
            if first_try and agent_first_token_at is not None:
                agent_ms = (agent_first_token_at - agent_sent_at) * 1000
                outcome.added_ttft_ms = outcome.ttft_ms - agent_ms
        self.ids.extend(delta.ids or ())
        self.text.append(delta.text)
        # Measured by the ids relayed (every agent is asked for them), not the agent's `n`.
        outcome.relayed_tokens += len(delta.ids or ())
        receipt = None
        if self.receipts is not None and self.request.want_ids:
            self.receipts.extend(delta.ids or ())
            receipt = self.receipts.receipt()
        return DeltaFrame(
            id=self.request.id,
            text=delta.text,
            n=delta.n,
            ids=delta.ids if self.request.want_ids else None,
            logprobs=delta.logprobs,
            content=delta.content,
            reasoning=delta.reasoning,
            receipt=receipt,
        )

    def on_done(self, done: DoneFrame, *, monotonic: float) -> DoneFrame:
        """The stream finished: its usage (as charged: `gateway.charges`), and its timings.

        The usage covers the whole stream: the ids a client's resume brought count too.
        """
        agent, self.serving = self.serving or "", None
        outcome = self.outcome
        usage, capped = charged_usage(
            done.usage, prompt_bound=prompt_token_bound(self.request), held_tokens=len(self.ids)
        )
        heard = {(serving, found.reason) for serving, found in outcome.capped}  # its `start`
        outcome.capped.extend((agent, f) for f in capped if (agent, f.reason) not in heard)
        outcome.completion_tokens = usage.completion_tokens
        outcome.prompt_tokens = usage.prompt_tokens
        total_ms = (monotonic - self.started_at) * 1000
        return DoneFrame(
            id=self.request.id,
            finish_reason=done.finish_reason,
            usage=usage,
            timings=outcome.timings(total_ms),
            tool_calls=done.tool_calls,
        )

    def on_agent_error(self, error: ErrorFrame, *, now: float) -> Decision:
        """The agent ended the stream with an error: resume elsewhere, or tell the client."""
        if error.code is ErrorCode.NO_CAPACITY:
            return WaitForRoom(full_agent=self._leave_agent())
        if error.code in RETRYABLE_AGENT_ERRORS:
            return self._resume_elsewhere(now)
        self.serving = None
        self.outcome.error = error.code
        return GiveUp(error.model_copy(update={"id": self.request.id}))

    def on_going_away(self) -> ErrorFrame:
        """The gateway stops before the stream ends: the error that tells its client so.

        A client holding the ids it received resumes through another gateway; any other
        retries the request there.
        """
        self.outcome.error = ErrorCode.GOING_AWAY
        how = "resume it" if self.has_tokens and self.request.want_ids else "retry it"
        return ErrorFrame(
            id=self.request.id,
            code=ErrorCode.GOING_AWAY,
            message=f"this gateway is shutting down before the stream ended; {how} through "
            "another gateway",
            retry_after=0,
        )

    def on_link_lost(self, *, now: float) -> ResumeElsewhere:
        """The agent's socket closed under the stream: resume it elsewhere."""
        return self._resume_elsewhere(now)

    def on_stalled(self, *, now: float) -> ResumeElsewhere:
        """The agent sent nothing past the stall limit: resume elsewhere (it is told to stop)."""
        return self._resume_elsewhere(now)

    def _leave_agent(self) -> str:
        """The serving agent's stream is over: which agent it was."""
        agent = self.serving
        if agent is None:
            raise RuntimeError("an agent stream ended that was never opened")
        self.serving = None
        self.last_arrived_at = None  # the next agent's pace is its own, from its first delta
        # Repeats it still owed are no other agent's: one resumed from the client's tokens
        # sends new ones only (a repeat checked against them could drop one of them).
        self.repeats = []
        self.repeated_text = []
        return agent

    def _resume_elsewhere(self, now: float) -> ResumeElsewhere:
        failed = self._leave_agent()
        self.excluded.add(failed)
        self.deadline = now + self.deadline_seconds  # each placement gets its own wait
        return ResumeElsewhere(failed_agent=failed, tokens_so_far=len(self.ids))
