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
- Make-before-break (gateway/moves.py): the Failover holds a move's state (`Move`) and
  answers the relay with the effects to carry out (`OpenNext`, `Reopen`, `Pace`, `Switch`…).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from gateway.charges import charged_prompt_tokens, charged_usage, prompt_token_bound
from gateway.moves import (
    Against,
    CatchUp,
    DropNext,
    HoldForNext,
    MergeDeltas,
    Move,
    OpenNext,
    Pace,
    Reopen,
    Repeat,
    Repeated,
    Switch,
    TakeOver,
    worth_taking_over,
)
from gateway.outcome import Decision, GiveUp, RelayOutcome, ResumeElsewhere, Unplaced, WaitForRoom
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
)

RETRYABLE_AGENT_ERRORS = frozenset({ErrorCode.INTERRUPTED, ErrorCode.NO_CAPACITY})
"""Agent errors after which the stream is placed again rather than ended."""
AGENT_HANDLE_BYTES = 8
HANDLE_KEY_BYTES = 32
"""The length of the random key each stream names its agents with."""
QUEUE_FULL_RETRY_AFTER_SECONDS = 1.0
NO_CAPACITY_RETRY_AFTER_SECONDS = 5.0


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
    move: Move = field(default_factory=Move)  # make-before-break: its state
    # The request's `prompt_token_bound`, once its `start` or `done` first needs it.
    prompt_bound: int | None = None

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
        return self.move.repeating

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
        resume = None
        if self.has_tokens:  # validation copies the ids: later tokens do not change this frame
            resume = Resume(
                token_ids=self.ids, text="".join(self.text), completion_tokens=len(self.ids)
            )
        return self.request.model_copy(
            update={
                "id": agent_stream_id,
                "want_ids": True,
                "resume": resume,
                "move_early": self.move_early,
            }
        )

    # Make-before-break (gateway/moves.py): the move's state is `self.move`.

    def on_moving(self) -> OpenNext | None:
        """The serving agent drains and said `moving`: open its next agent, unless under way."""
        if self.move.moving or self.serving is None:
            return None
        self.move.moving = True
        return OpenNext()

    def next_agent_frame(self, agent_stream_id: str) -> GenerateFrame:
        """The next agent's continuation of a moving stream, from the tokens the client has now."""
        self.move.open_next(len(self.ids), len(self.text))
        return self.agent_frame(agent_stream_id)

    def on_next_opened(self, opened: bool) -> MergeDeltas | None:
        """The next agent's continuation opened (deltas one at a time now), or none could be."""
        if not opened:
            self.on_move_abandoned()
            return None
        return MergeDeltas(merge=False)

    def pace(self) -> Pace | None:
        """When the draining agent's next delta may reach the client (None: now)."""
        until = self.move.pace_until()
        return None if until is None else Pace(until)

    def on_next_agent_frames(self, frames: Sequence[object]) -> CatchUp:
        """The next agent's frames after the `next_judged` first, against the client's tokens.

        The verdict is `Move.judge`'s; a next agent that went another way or failed is
        dropped, and its check counted.
        """
        if self.move.next_from is None:
            return CatchUp.FAILED
        verdict, compared = self.move.judge(frames, self.ids, self.text)
        if verdict in (CatchUp.DIVERGED, CatchUp.FAILED):
            self.outcome.early_move_checked_tokens += compared
            if verdict is CatchUp.DIVERGED:
                self.outcome.early_move_diverged += 1
            self.on_move_abandoned()
        return verdict

    def on_next_agent_news(
        self,
        frames: Sequence[object],
        *,
        silent: bool,
        ttft_seconds: float | None,
        next_gap_seconds: float | None = None,
    ) -> Switch | DropNext | Reopen | HoldForNext | None:
        """After a delta of the draining agent, its next agent's new `frames`: what comes next.

        Caught up with the client: switch. Behind it, with its first token in after
        `ttft_seconds`: the round is over (`Move.next_round`), unless it is the last, which
        catches up with a paced client or, too slow for that (`next_gap_seconds`), is
        waited for. Dropped when it went another way, failed, or is `silent` past the stall
        limit (or a wait for it).
        """
        verdict = self.on_next_agent_frames(frames)
        if verdict is CatchUp.CAUGHT_UP:
            return Switch(draining=self.on_switch())
        if verdict is not CatchUp.BEHIND or silent:
            self.on_move_abandoned()
            return DropNext()
        if ttft_seconds is None or self.move.pacing:  # no round is over
            return self.move.give_up_pacing(self.move.behind(len(self.ids)), next_gap_seconds)
        return self.move.next_round(ttft_seconds)

    def at_break(
        self, frames: Sequence[object], *, prefill_seconds: float | None, gap_seconds: float | None
    ) -> TakeOver | DropNext:
        """The serving agent broke while its next agent caught up: it takes over where it is.

        Unless its new `frames` drop it, or a resume's prefill is sooner than its repeats
        (`worth_taking_over`): the stream then resumes as from any break.
        """
        if self.on_next_agent_frames(frames) in (CatchUp.DIVERGED, CatchUp.FAILED):
            return DropNext()
        behind = self.move.behind(len(self.ids))
        if prefill_seconds is not None and self.move.round_ttfts:  # a warm round's is short
            prefill_seconds = max(prefill_seconds, self.move.round_ttfts[0])
        if not worth_taking_over(behind, prefill_seconds, gap_seconds):
            self.on_move_abandoned()
            return DropNext(behind_tokens=behind)
        self.on_next_agent_takes_over()
        return TakeOver()

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
        self.move.take_over(self.ids, self.text)
        self.outcome.early_moves += 1

    def on_next_agent_delta(self, delta: DeltaFrame, *, now: float) -> Repeated | ResumeElsewhere:
        """A delta of the next agent, switched to, while it repeats what the client holds.

        `Repeated`: its deltas stay one at a time while a move of its own is prepared or
        catches up. `ResumeElsewhere`: it did not repeat them (`on_repeat_failed`).
        """
        repeat = self.on_repeated_delta(delta)
        if not repeat.repeats:
            return self.on_repeat_failed(now=now)
        merge = not self.repeating and not self.move.moving
        return Repeated(merge=merge, beyond=repeat.beyond)

    def on_repeated_delta(self, delta: DeltaFrame) -> Repeat:
        """A delta of the next agent while it repeats held tokens: whether it repeats them.

        One that does is dropped, but for what it adds past them (`beyond`).
        """
        ids = delta.ids or ()
        self.outcome.early_move_checked_tokens += min(len(ids), len(self.move.repeats))
        against, beyond = self.move.repeat(delta)
        if against is Against.DIVERGED:
            self.outcome.early_move_diverged += 1
            return Repeat(repeats=False)
        if against is Against.SHORT:
            return Repeat(repeats=True)
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
        self.move.abandon()

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
            charged, capped = charged_prompt_tokens(start.prompt_tokens, self._prompt_bound())
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
    ) -> str | None:
        """More tokens, kept for a resume and counted: the receipt their client frame carries.

        The frame is `client_delta`'s (None: no receipt).

        `arrived_at` is when the agent's delta came in, `monotonic` when the client is sent
        it. The first token fixes the stream's time to first token; the gateway's own share
        of it is known only for a stream served by its first agent without waiting, from when
        the agent's stream was sent (`agent_sent_at`) and its first token came in.
        """
        outcome = self.outcome
        self.move.relayed(arrived_at=arrived_at, monotonic=monotonic)
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
        if self.receipts is None or not self.request.want_ids:
            return None
        self.receipts.extend(delta.ids or ())
        return self.receipts.receipt()

    def on_done(self, done: DoneFrame, *, monotonic: float) -> DoneFrame:
        """The stream finished: its usage (as charged: `gateway.charges`), and its timings.

        The usage covers the whole stream: the ids a client's resume brought count too.
        """
        agent, self.serving = self.serving or "", None
        outcome = self.outcome
        usage, capped = charged_usage(
            done.usage, prompt_bound=self._prompt_bound(), held_tokens=len(self.ids)
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

    def _prompt_bound(self) -> int:
        """The request's `prompt_token_bound`, serialised once a stream (it reads the prompt)."""
        if self.prompt_bound is None:
            self.prompt_bound = prompt_token_bound(self.request)
        return self.prompt_bound

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

    def on_preempted(self, *, now: float) -> ResumeElsewhere:
        """A flex stream gives its place to an interactive one: it resumes when there is room."""
        self.outcome.preemptions += 1
        return self._resume_elsewhere(now, exclude=False)

    def _leave_agent(self) -> str:
        """The serving agent's stream is over: which agent it was."""
        agent = self.serving
        if agent is None:
            raise RuntimeError("an agent stream ended that was never opened")
        self.serving = None
        self.move.leave_agent()
        return agent

    def _resume_elsewhere(self, now: float, *, exclude: bool = True) -> ResumeElsewhere:
        failed = self._leave_agent()
        if exclude:
            self.excluded.add(failed)
        self.deadline = now + self.deadline_seconds  # each placement gets its own wait
        return ResumeElsewhere(failed_agent=failed, tokens_so_far=len(self.ids))
