"""One client stream through the gateway: wait for an agent, relay, resume on failure.

The gateway always asks agents for token ids, keeps the ids and text already sent to the
client, and when the agent's link drops, the agent answers `interrupted` (draining) or
refuses with `no_capacity`, sends the stream to another agent with `resume`: the client's
stream goes on with no token lost and none repeated, and `usage` counts each token once.
A stream that cannot be placed again before its deadline ends with a clear error, and one
still open when its gateway stops (the drain's grace is over) with `going_away`.

What to do at each turn is decided by the stream's `Failover` (gateway/failover.py, pure);
this module only does the I/O: it waits in the dispatcher, opens the agent's stream, reads
its frames, hands each to the Failover, forwards what that returns and carries out the
effects it asks for (gateway/moves.py). A move made before the break (`moving`,
`OpenNext`) opens the stream's continuation on the next agent in a task of its own while
the draining agent's frames are relayed; the task's end wakes the relay up through the
draining agent's channel. From then, after each of the draining agent's deltas, the relay
shows the Failover what the next agent has sent: it switches the stream there once it caught
up (`Switch`), opens it afresh from where the client is (`Reopen`: a warming round, or the
last, waited for or caught up with by pacing the draining agent's deltas, `Pace`), waits for
a last round too slow to catch up (`HoldForNext`), or drops it (`DropNext`). Choosing and
opening agents' streams is gateway/agent_streams.py's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from dataclasses import dataclass
from functools import partial
from typing import Protocol

from gateway.agent_link import (
    AgentLink,
    GatewayGoingAway,
    LinkLost,
    Preempted,
    StreamChannel,
    StreamStalled,
    Wakeup,
)
from gateway.agent_streams import Leg, acquire, close_leg, open_leg, prepare_move, prepared, wake
from gateway.dispatch import (
    Dispatcher,
    GatewayClosing,
    NoCapacity,
    QueueFull,
    UnknownModel,
)
from gateway.failover import HANDLE_KEY_BYTES, Failover
from gateway.fair_queue import Queued
from gateway.moves import (
    DropNext,
    HoldForNext,
    MergeDeltas,
    MoveEffect,
    OpenNext,
    Pace,
    Reopen,
    Repeated,
    Switch,
    TakeOver,
    next_silent,
)
from gateway.outcome import GiveUp, RelayOutcome, ResumeElsewhere, Unplaced, WaitForRoom
from gateway.prefix import PromptPrefix
from gateway.receipts import ReceiptChain
from gateway.router import Candidate
from gateway.unique import secret_key
from spotgate.logging import get_logger
from spotgate.protocol import (
    DeltaFrame,
    DoneFrame,
    ErrorFrame,
    GenerateFrame,
    MovingFrame,
    QueuedFrame,
    StartFrame,
    client_delta,
)

__all__ = ["ClientFrame", "DirectSend", "RelayOutcome", "relay_stream"]

log = get_logger(__name__)

ClientFrame = QueuedFrame | StartFrame | DeltaFrame | DoneFrame | ErrorFrame


class DirectSend(Protocol):
    """The client's connection, written to without waiting while it keeps up.

    A websocket's (`gateway.streams.SocketDeltas`) or an SSE response's
    (`spotgate.openai_http.SseDeltas`).
    """

    def keeps_up(self) -> bool:
        """Whether a delta may be sent now without waiting."""
        ...

    def send_delta(
        self, delta: DeltaFrame, stream_id: str, *, with_ids: bool, receipt: str | None
    ) -> None:
        """Send the client the agent's `delta` as `client_delta` makes it, now."""
        ...


async def relay_stream(
    frame: GenerateFrame,
    *,
    dispatcher: Dispatcher,
    link_for: Callable[[str], AgentLink | None],
    deadline_seconds: float,
    stall_seconds: float,
    outcome: RelayOutcome,
    receipts: ReceiptChain | None = None,
    move_early: bool = True,
    direct: DirectSend | None = None,
) -> AsyncGenerator[ClientFrame, None]:
    """Frames for the client, in its own stream id, from whichever agents serve it.

    With `receipts`, each delta carries the receipt of every id the client then holds; with
    `move_early`, a draining agent's streams move before it breaks them; with `direct`, the
    deltas that come while nothing else is to be done go to it at once, not through here.
    """
    stream = Failover.begin(
        frame,
        deadline_seconds=deadline_seconds,
        now=time.time(),
        monotonic=time.monotonic(),
        handle_key=secret_key(HANDLE_KEY_BYTES),
        outcome=outcome,
        receipts=receipts,
        move_early=move_early,
    )
    # Hashed once: a moved stream's prompt is the same, and goes where it is most likely cached.
    relay = _Relay(
        stream, dispatcher, link_for, stall_seconds, dispatcher.prompt_prefix(frame), direct
    )
    while not relay.over:
        leg, relay.switched = relay.switched, None
        if leg is None:
            async with aclosing(relay.place()) as placing:
                async for client_frame in placing:
                    yield client_frame
            leg, relay.placed = relay.placed, None
            if leg is None:
                continue
        async with aclosing(relay.serve(leg)) as serving:
            async for client_frame in serving:
                yield client_frame


@dataclass
class _Relay:
    """The I/O of one client stream: its agents' streams, and a move's task while one is made."""

    stream: Failover
    dispatcher: Dispatcher
    link_for: Callable[[str], AgentLink | None]
    stall_seconds: float
    prefix: PromptPrefix | None
    direct: DirectSend | None
    over: bool = False  # the client's stream ended
    placed: Leg | None = None  # the agent's stream a placement opened
    switched: Leg | None = None  # the next agent's stream, taking over from the serving one
    mover: asyncio.Task[Leg | None] | None = None  # opening the next agent's stream
    following: Leg | None = None  # the next agent's stream, catching up with the client
    leg_over: bool = False  # the serving agent's stream is over for the client
    full: bool = False  # the agent refused the stream for capacity
    left_running: bool = False  # the stream went on elsewhere while this agent's still ran

    async def place(self) -> AsyncGenerator[ClientFrame, None]:
        """Wait for an agent and open the stream there (`placed`), or end the client's stream."""
        stream = self.stream
        chosen: Candidate | None = None
        try:
            async for event in acquire(
                self.dispatcher,
                stream.request,
                self.prefix,
                exclude=stream.excluded,
                deadline=stream.deadline,
                under_way=stream.placements > 0,  # resumed here after a break
            ):
                if isinstance(event, Queued):
                    queued = stream.on_queued(event.position, event.eta_seconds)
                    if queued is not None:
                        yield queued
                else:
                    chosen = event
        except (UnknownModel, QueueFull, NoCapacity, GatewayClosing) as unplaced:
            self.over = True
            yield _unplaced(stream, unplaced)
            return
        if chosen is None:  # acquire always ends with an agent or an exception
            return
        stream.on_agent_chosen(monotonic=time.monotonic())
        self.placed = await open_leg(
            stream.agent_frame, chosen.agent_id, self.dispatcher, self.link_for
        )
        if self.placed is None:
            stream.on_unavailable(chosen.agent_id)

    async def serve(self, leg: Leg) -> AsyncGenerator[ClientFrame, None]:
        """The agent's stream relayed to the client, until it ends, breaks or moves on."""
        self.stream.on_opened(leg.agent_id)
        self.leg_over = self.full = self.left_running = False
        if self.direct is not None:
            leg.channel.take_now = self._take_now
        try:
            async for item in leg.channel.items(self.stall_seconds):
                if isinstance(item, DeltaFrame):
                    delta = await self._delta(leg, item)
                    if delta is not None:
                        yield delta
                        if self.following is not None:
                            await self._judge_next(leg, self.following)
                else:
                    client_frame = await self._event(leg, item)
                    if client_frame is not None:
                        yield client_frame
                if self.over or self.leg_over:
                    break
        finally:
            leg.channel.take_now = None
            await self._close(leg)
        if self.full:  # after `finished`, which takes the mark off: this stream never ran there
            self.dispatcher.refused_for_capacity(leg.agent_id)

    def _take_now(self, channel: StreamChannel, item: DeltaFrame) -> bool:
        """The agent's delta sent to the client from the link's reader (False: not taken).

        Taken only while the stream has nothing else to do for it (no move under way) and
        the client keeps up: `_delta` would send it the same frame.
        """
        stream, direct = self.stream, self.direct
        move = stream.move
        if (
            direct is None
            or self.mover is not None
            or self.following is not None
            or move.repeats  # `stream.repeating`, read once per token without its properties
            or move.pacing
            or not direct.keeps_up()
        ):
            return False
        receipt = self._hold(channel, item)
        direct.send_delta(
            item, stream.request.id, with_ids=stream.request.want_ids, receipt=receipt
        )
        return True

    async def _delta(self, leg: Leg, item: DeltaFrame) -> DeltaFrame | None:
        """What the client is sent of the agent's delta (None: nothing)."""
        stream = self.stream
        if stream.repeating:  # the next agent, switched to, repeating what the client holds
            repeated = stream.on_next_agent_delta(item, now=time.time())
            if isinstance(repeated, ResumeElsewhere):
                self.left_running = self.leg_over = True
                log.info(
                    "next agent did not repeat the stream; resuming elsewhere",
                    stream_id=stream.request.id,
                    tokens_so_far=repeated.tokens_so_far,
                )
                return None
            await self._carry_out(leg, repeated)
            if repeated.beyond is None:
                return None
            item = repeated.beyond  # the rest of its delta: the client's next tokens
        if (pace := stream.pace()) is not None:  # a move's last round is catching up
            await self._carry_out(leg, pace)
        receipt = self._hold(leg.channel, item)
        return client_delta(
            item, stream.request.id, with_ids=stream.request.want_ids, receipt=receipt
        )

    def _hold(self, channel: StreamChannel, item: DeltaFrame) -> str | None:
        """The agent's delta held by the stream; the receipt the client's frame of it carries."""
        return self.stream.on_delta(
            item,
            monotonic=time.monotonic(),
            arrived_at=channel.delta_arrived_at,
            agent_sent_at=channel.sent_at,
            agent_first_token_at=channel.first_delta_at,
        )

    async def _event(self, leg: Leg, item: object) -> ClientFrame | None:
        """Any other item of the agent's stream: what the client is sent of it (None: nothing)."""
        stream = self.stream
        if isinstance(item, StartFrame):
            self.dispatcher.taken(leg.agent_id, self.prefix, stream.request.adapter)
            return stream.on_start(item)
        if isinstance(item, DoneFrame):
            self.over = True
            return stream.on_done(item, monotonic=time.monotonic())
        if isinstance(item, GatewayGoingAway):  # the agent's stream is cancelled
            self.over = True
            return stream.on_going_away()
        if isinstance(item, MovingFrame):
            await self._carry_out(leg, stream.on_moving())
        elif isinstance(item, Wakeup):
            if self.mover is not None and self.mover.done():
                self.following, self.mover = prepared(self.mover), None
                await self._carry_out(leg, stream.on_next_opened(self.following is not None))
        elif isinstance(item, StreamStalled | Preempted):  # stop it there, resume once placed
            stalled = isinstance(item, StreamStalled)
            left = (
                stream.on_stalled(now=time.time())
                if stalled
                else stream.on_preempted(now=time.time())
            )
            await leg.link.cancel(leg.frame_id)
            (log.warning if stalled else log.info)(
                "agent stream stalled; resuming elsewhere" if stalled else "flex stream preempted",
                stream_id=stream.request.id,
                failed_agent=left.failed_agent,
                tokens_so_far=left.tokens_so_far,
            )
            await self._at_break(leg)
            self.leg_over = True
        elif isinstance(item, ErrorFrame | LinkLost):  # the agent's stream ended early
            decision = (
                stream.on_agent_error(item, now=time.time())
                if isinstance(item, ErrorFrame)
                else stream.on_link_lost(now=time.time())
            )
            if isinstance(decision, GiveUp):
                self.over = True
                return decision.error
            if isinstance(decision, WaitForRoom):
                self.full = True
            else:
                log.info(
                    "resuming stream",
                    stream_id=stream.request.id,
                    failed_agent=decision.failed_agent,
                    tokens_so_far=decision.tokens_so_far,
                )
                await self._at_break(leg)
            self.leg_over = True
        return None

    async def _judge_next(self, leg: Leg, following: Leg) -> None:
        """After a delta of the draining agent: switch to its next agent, drop it, or wait on."""
        channel = following.channel
        silent = next_silent(
            channel.first_delta_at,
            channel.sent_at,
            monotonic=time.monotonic(),
            stall_seconds=self.stall_seconds,
        )
        news = channel.unread(skipped=self.stream.move.next_judged)
        effect = self.stream.on_next_agent_news(
            news,
            silent=silent,
            ttft_seconds=channel.first_delta_seconds(),
            next_gap_seconds=channel.gap_seconds(),
        )
        await self._carry_out(leg, effect)

    async def _at_break(self, leg: Leg) -> None:
        """The serving agent broke: a next agent catching up takes over where it is, or not."""
        if self.following is None:
            return
        channel = self.following.channel
        news = channel.unread(skipped=self.stream.move.next_judged)
        effect = self.stream.at_break(
            news, prefill_seconds=channel.first_delta_seconds(), gap_seconds=channel.gap_seconds()
        )
        await self._carry_out(leg, effect)

    async def _carry_out(self, leg: Leg, effect: MoveEffect | None) -> None:
        """Do what the stream's Failover asked for its move (gateway/moves.py)."""
        stream = self.stream
        match effect:
            case None:
                pass
            case OpenNext():
                self.mover = asyncio.create_task(
                    prepare_move(
                        stream,
                        dispatcher=self.dispatcher,
                        link_for=self.link_for,
                        prefix=self.prefix,
                    ),
                    name=f"move {stream.request.id}",
                )
                self.mover.add_done_callback(partial(wake, leg.channel))
            case Reopen(hold_seconds=hold_seconds):
                await self._reopen(leg, hold_seconds)
            case Pace(until=until):  # the client's pace eases while the last round catches up
                await asyncio.sleep(max(0.0, until - time.monotonic()))
            case HoldForNext(seconds=seconds):
                await self._hold_for_next(leg, seconds)
            case MergeDeltas(merge=merge) | Repeated(merge=merge):
                leg.channel.merge_deltas = merge
            case Switch() | TakeOver():
                following, self.following = self.following, None
                if following is None:
                    raise RuntimeError("a stream switched with no next agent's stream")
                following.channel.merge_deltas = not stream.repeating  # unmerged while repeating
                self.switched = following
                if isinstance(effect, Switch):
                    self.left_running = self.leg_over = True
                    log.info(
                        "stream moved before the break",
                        stream_id=stream.request.id,
                        tokens_so_far=len(stream.ids),
                    )
                else:
                    log.info("next agent takes over at the break", stream_id=stream.request.id)
            case DropNext(behind_tokens=behind_tokens):
                if behind_tokens is not None:
                    log.info(
                        "next agent too far behind to take over at the break; resuming elsewhere",
                        stream_id=stream.request.id,
                        behind_tokens=behind_tokens,
                    )
                if self.following is not None:
                    await close_leg(self.following, self.dispatcher, cancel=True)
                    self.following = None
                leg.channel.merge_deltas = True

    async def _reopen(self, leg: Leg, hold_seconds: float | None) -> None:
        """The next agent's continuation afresh from the client's tokens; a switch is waited for.

        While it is waited for, the client is sent nothing: the draining agent's deltas stay
        in its channel, dropped at the switch or sent on if the move is dropped.
        """
        following = self.following
        if following is None:
            raise RuntimeError("a stream reopened with no next agent's stream")
        # Its slot on the agent is the next round's: no other stream may take it meanwhile.
        await following.link.cancel(following.frame_id)
        self.following = None
        self.following = await open_leg(
            self.stream.next_agent_frame,
            following.agent_id,
            self.dispatcher,
            self.link_for,
            merge_deltas=False,
            slot_held=True,
        )
        if self.following is None:
            self.stream.on_move_abandoned()
            leg.channel.merge_deltas = True
        elif hold_seconds is not None:
            await self._hold_for_next(leg, hold_seconds)

    async def _hold_for_next(self, leg: Leg, seconds: float) -> None:
        """The client waits, at most `seconds`, for the last round to stand where it does.

        Sent nothing meanwhile: the draining agent's deltas stay in its channel, dropped at
        the switch or sent on if the move is dropped (the next agent failed, drains too, or
        did not come in time).
        """
        deadline = time.monotonic() + seconds
        effect: MoveEffect | None = None
        while effect is None and (following := self.following) is not None:
            judged = self.stream.move.next_judged
            came = await following.channel.pushed_within(deadline - time.monotonic())
            news = following.channel.unread(skipped=judged)
            effect = self.stream.on_next_agent_news(news, silent=not came, ttft_seconds=None)
            if effect is None and news and self.stream.move.next_judged == judged:
                # Its next delta is not to be cut where the client waits (its text held
                # back): only more of the client's tokens would settle it, and none come.
                effect = self.stream.on_next_agent_news([], silent=True, ttft_seconds=None)
        await self._carry_out(leg, effect)

    async def _close(self, leg: Leg) -> None:
        """The agent's stream is over for the client: close it, and any move under way."""
        stream = self.stream
        moved = self.mover is not None or self.following is not None
        if self.mover is not None:  # the stream ended or broke before its move was ready
            self.mover.cancel()
            await asyncio.wait([self.mover])
            self.following, self.mover = prepared(self.mover), None
        if moved:
            stream.on_move_abandoned()
        if self.following is not None:
            await close_leg(self.following, self.dispatcher, cancel=True)
            self.following = None
        # The client went away mid-stream (still serving), or the stream went on elsewhere.
        await close_leg(
            leg, self.dispatcher, cancel=stream.serving is not None or self.left_running
        )


def _unplaced(
    stream: Failover, error: UnknownModel | QueueFull | NoCapacity | GatewayClosing
) -> ErrorFrame:
    """The error that ends the client's stream when no agent could be found for it."""
    if isinstance(error, GatewayClosing):
        return stream.on_going_away()
    if isinstance(error, UnknownModel):
        return stream.on_unplaced(Unplaced.UNKNOWN_MODEL)
    if isinstance(error, QueueFull):
        return stream.on_unplaced(Unplaced.QUEUE_FULL)
    return stream.on_unplaced(Unplaced.NO_CAPACITY)
