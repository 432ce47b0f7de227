"""One client stream through the gateway: wait for an agent, relay, resume on failure.

The gateway always asks agents for token ids, keeps the ids and text already sent to the
client, and when the agent's link drops, the agent answers `interrupted` (draining) or
refuses with `no_capacity`, sends the stream to another agent with `resume`: the client's
stream goes on with no token lost and none repeated, and `usage` counts each token once.
A stream that cannot be placed again before its deadline ends with a clear error, and one
still open when its gateway stops (the drain's grace is over) with `going_away`.

What to do at each turn is decided by the stream's `Failover` (gateway/failover.py, pure);
this module only does the I/O: it waits in the dispatcher, opens the agent's stream, reads
its frames, hands each to the Failover and forwards what that returns. A move made before
the break (`moving`) opens the stream's continuation on the next agent in a task of its
own while the draining agent's frames are relayed; the task's end wakes the relay up
through the draining agent's channel. From then the draining agent's deltas are paced, and
after each the relay shows the Failover what the next agent has sent, switching the
stream there once it caught up.
"""

from __future__ import annotations

import asyncio
import secrets
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Collection
from dataclasses import dataclass
from functools import partial

from gateway.agent_link import (
    AgentLink,
    GatewayGoingAway,
    LinkLost,
    LinkUnavailable,
    StreamChannel,
    StreamStalled,
    Wakeup,
)
from gateway.dispatch import (
    Dispatcher,
    GatewayClosing,
    NoCapacity,
    Queued,
    QueueFull,
    UnknownModel,
)
from gateway.failover import (
    HANDLE_KEY_BYTES,
    CatchUp,
    Failover,
    GiveUp,
    RelayOutcome,
    Unplaced,
    WaitForRoom,
    worth_taking_over,
)
from gateway.prefix import PromptPrefix, tenant_session
from gateway.receipts import ReceiptChain
from gateway.router import Candidate
from spotgate.logging import get_logger
from spotgate.protocol import (
    DeltaFrame,
    DoneFrame,
    ErrorFrame,
    GenerateFrame,
    MovingFrame,
    QueuedFrame,
    StartFrame,
)

__all__ = ["ClientFrame", "RelayOutcome", "relay_stream"]

log = get_logger(__name__)

ClientFrame = QueuedFrame | StartFrame | DeltaFrame | DoneFrame | ErrorFrame


@dataclass(frozen=True, slots=True)
class _Leg:
    """One agent's stream of the client's stream: where it runs and its channel."""

    agent_id: str
    link: AgentLink
    frame_id: str
    channel: StreamChannel


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
) -> AsyncGenerator[ClientFrame, None]:
    """Frames for the client, in its own stream id, from whichever agents serve it.

    With `receipts`, each delta carries the receipt of every id the client then holds; with
    `move_early`, a draining agent's streams move before it breaks them.
    """
    stream = Failover.begin(
        frame,
        deadline_seconds=deadline_seconds,
        now=time.time(),
        monotonic=time.monotonic(),
        handle_key=secrets.token_bytes(HANDLE_KEY_BYTES),
        outcome=outcome,
        receipts=receipts,
        move_early=move_early,
    )
    # Hashed once: a moved stream's prompt is the same, and goes where it is most likely cached.
    prefix = dispatcher.prompt_prefix(frame)
    switched: _Leg | None = None  # the next agent's stream, taking over at an early switch
    while True:
        if switched is not None:
            leg, switched = switched, None
        else:
            chosen: Candidate | None = None
            try:
                async for event in _acquire(
                    dispatcher,
                    frame,
                    prefix,
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
            except UnknownModel:
                yield stream.on_unplaced(Unplaced.UNKNOWN_MODEL)
                return
            except QueueFull:
                yield stream.on_unplaced(Unplaced.QUEUE_FULL)
                return
            except NoCapacity:
                yield stream.on_unplaced(Unplaced.NO_CAPACITY)
                return
            except GatewayClosing:
                yield stream.on_going_away()
                return
            if chosen is None:  # acquire always ends with an agent or an exception
                continue
            stream.on_agent_chosen(monotonic=time.monotonic())
            opened = await _open(stream.agent_frame, chosen.agent_id, dispatcher, link_for)
            if opened is None:
                stream.on_unavailable(chosen.agent_id)
                continue
            leg = opened
        agent_id, link = leg.agent_id, leg.link
        stream.on_opened(agent_id)
        full = False  # the agent refused the stream for capacity
        left_running = False  # the stream went on elsewhere while this agent's still ran
        mover: asyncio.Task[_Leg | None] | None = None
        following: _Leg | None = None  # the next agent's stream, catching up with the client
        try:
            async for item in leg.channel.items(stall_seconds):
                if isinstance(item, DeltaFrame) and stream.repeating:
                    # The next agent, switched to, repeating what the client holds.
                    repeat = stream.on_repeated_delta(item)
                    if not repeat.repeats:
                        resumed = stream.on_repeat_failed(now=time.time())
                        left_running = True
                        log.info(
                            "next agent did not repeat the stream; resuming elsewhere",
                            stream_id=frame.id,
                            tokens_so_far=resumed.tokens_so_far,
                        )
                        break
                    # One at a time still while a move of its own is prepared or catches up.
                    moving = mover is not None or following is not None
                    leg.channel.merge_deltas = not stream.repeating and not moving
                    if repeat.beyond is None:
                        continue
                    item = repeat.beyond  # the rest of its delta: the client's next tokens
                if isinstance(item, DeltaFrame):
                    paced = stream.pace_until()
                    if paced is not None:  # a move is catching up: the client's pace eases
                        await asyncio.sleep(max(0.0, paced - time.monotonic()))
                    yield stream.on_delta(
                        item,
                        monotonic=time.monotonic(),
                        arrived_at=leg.channel.delta_arrived_at,
                        agent_sent_at=leg.channel.sent_at,
                        agent_first_token_at=leg.channel.first_delta_at,
                    )
                    if following is None:
                        continue
                    caught_up = stream.on_next_agent_frames(
                        following.channel.unread(skipped=stream.next_judged)
                    )
                    if caught_up is CatchUp.CAUGHT_UP:
                        stream.on_switch()
                        switched, following, left_running = _switched(stream, following), None, True
                        log.info(
                            "stream moved before the break",
                            stream_id=frame.id,
                            tokens_so_far=len(stream.ids),
                        )
                        break
                    if caught_up is not CatchUp.BEHIND or _silent(following, stall_seconds):
                        stream.on_move_abandoned()
                        await _close_leg(following, dispatcher, cancel=True)
                        following = None
                        leg.channel.merge_deltas = True
                elif isinstance(item, StartFrame):
                    dispatcher.taken(agent_id, prefix, frame.adapter)
                    start = stream.on_start(item)
                    if start is not None:
                        yield start
                elif isinstance(item, DoneFrame):
                    yield stream.on_done(item, monotonic=time.monotonic())
                    return
                elif isinstance(item, MovingFrame):
                    if stream.on_moving():
                        mover = asyncio.create_task(
                            _prepare_move(
                                stream, dispatcher=dispatcher, link_for=link_for, prefix=prefix
                            ),
                            name=f"move {frame.id}",
                        )
                        mover.add_done_callback(partial(_wake, leg.channel))
                elif isinstance(item, Wakeup):
                    if mover is None or not mover.done():
                        continue
                    following, mover = _prepared(mover), None
                    if following is None:
                        stream.on_move_abandoned()
                    else:  # paced one token at a time, so it switches at any of them
                        leg.channel.merge_deltas = False
                elif isinstance(item, GatewayGoingAway):  # the agent's stream is cancelled
                    yield stream.on_going_away()
                    return
                elif isinstance(item, StreamStalled):  # nothing for too long: stop it there
                    stalled = stream.on_stalled(now=time.time())
                    await link.cancel(leg.frame_id)
                    log.warning(
                        "agent stream stalled; resuming elsewhere",
                        stream_id=frame.id,
                        failed_agent=stalled.failed_agent,
                        stalled_seconds=item.seconds,
                        tokens_so_far=stalled.tokens_so_far,
                    )
                    switched = _taking_over(stream, following)
                    following = None if switched is not None else following
                    break
                elif isinstance(item, ErrorFrame | LinkLost):  # the agent's stream ended early
                    decision = (
                        stream.on_agent_error(item, now=time.time())
                        if isinstance(item, ErrorFrame)
                        else stream.on_link_lost(now=time.time())
                    )
                    if isinstance(decision, GiveUp):
                        yield decision.error
                        return
                    if isinstance(decision, WaitForRoom):
                        full = True
                    else:
                        log.info(
                            "resuming stream",
                            stream_id=frame.id,
                            failed_agent=decision.failed_agent,
                            tokens_so_far=decision.tokens_so_far,
                        )
                        switched = _taking_over(stream, following)
                        following = None if switched is not None else following
                    break
        finally:
            if mover is not None:  # the stream ended or broke before its move was ready
                mover.cancel()
                await asyncio.wait([mover])
                following = _prepared(mover)
            if mover is not None or following is not None:
                stream.on_move_abandoned()
            if following is not None:
                await _close_leg(following, dispatcher, cancel=True)
            # The client went away mid-stream (still serving), or the stream went on elsewhere.
            await _close_leg(leg, dispatcher, cancel=stream.serving is not None or left_running)
        if full:  # after `finished`, which takes the mark off: this stream never ran there
            dispatcher.refused_for_capacity(agent_id)


def _acquire(
    dispatcher: Dispatcher,
    frame: GenerateFrame,
    prefix: PromptPrefix | None,
    *,
    exclude: Collection[str],
    deadline: float,
    under_way: bool,
) -> AsyncIterator[Queued | Candidate]:
    """The dispatcher's wait for an agent for the client's stream (its session, prefix, adapter)."""
    return dispatcher.acquire(
        frame.base_model,
        session=tenant_session(frame.tenant or "", frame.session),
        exclude=exclude,
        deadline=deadline,
        prefix=prefix,
        adapter=frame.adapter,
        under_way=under_way,
    )


async def _open(
    frame_for: Callable[[str], GenerateFrame],
    agent_id: str,
    dispatcher: Dispatcher,
    link_for: Callable[[str], AgentLink | None],
    *,
    merge_deltas: bool = True,
) -> _Leg | None:
    """Open a stream on the agent (None: it cannot be reached; it is marked busy meanwhile)."""
    link = link_for(agent_id)
    if link is None:
        return None
    agent_frame = frame_for(uuid.uuid4().hex)
    # Counted from the moment it is chosen: streams choosing while this link opens (a
    # fresh agent's first connection) must see the room the agent will have left.
    dispatcher.started(agent_id)
    try:
        channel = await link.open_stream(agent_frame)
    except LinkUnavailable as err:
        dispatcher.finished(agent_id)
        log.info("agent unavailable; trying another", agent_id=agent_id, error=str(err))
        return None
    except BaseException:
        dispatcher.finished(agent_id)
        raise
    # Set before any delta can come: the agent has the frame only now, and prefills first.
    channel.merge_deltas = merge_deltas
    return _Leg(agent_id, link, agent_frame.id, channel)


async def _close_leg(leg: _Leg, dispatcher: Dispatcher, *, cancel: bool) -> None:
    """The agent's stream is over for this client: cancel it there if it still runs."""
    dispatcher.finished(leg.agent_id)
    if cancel:
        await leg.link.cancel(leg.frame_id)
    else:
        leg.link.forget(leg.frame_id)


def _wake(channel: StreamChannel, _task: asyncio.Task[str | None]) -> None:
    """A move's preparation ended: its stream's reader sees it among the agent's frames."""
    channel.push(Wakeup())


def _prepared(task: asyncio.Task[_Leg | None]) -> _Leg | None:
    """The next agent's stream a finished move opened (None: it found none, or failed)."""
    if task.cancelled():
        return None
    error = task.exception()
    if error is not None:
        log.warning("preparing a move failed", error=repr(error))
        return None
    return task.result()


def _switched(stream: Failover, following: _Leg) -> _Leg:
    """The next agent's stream, the client's now (its deltas unmerged while it repeats)."""
    following.channel.merge_deltas = not stream.repeating
    return following


def _taking_over(stream: Failover, following: _Leg | None) -> _Leg | None:
    """At the break: the next agent's stream, if one is catching up, takes over where it is.

    Unless it has fallen so far behind that repeating what the client holds would take
    longer than a resume's prefill (`worth_taking_over`): it is left to be closed, and the
    stream resumes as from any break.
    """
    if following is None:
        return None
    channel = following.channel
    if stream.on_next_agent_frames(channel.unread(skipped=stream.next_judged)) in (
        CatchUp.DIVERGED,
        CatchUp.FAILED,
    ):
        return None  # dropped: the move is over
    prefill = None if channel.first_delta_at is None else channel.first_delta_at - channel.sent_at
    if not worth_taking_over(stream.next_behind, prefill, channel.gap_seconds()):
        log.info(
            "next agent too far behind to take over at the break; resuming elsewhere",
            stream_id=stream.request.id,
            behind_tokens=stream.next_behind,
        )
        stream.on_move_abandoned()
        return None
    stream.on_next_agent_takes_over()
    log.info("next agent takes over at the break", stream_id=stream.request.id)
    return _switched(stream, following)


def _silent(following: _Leg, stall_seconds: float) -> bool:
    """Whether the next agent has sent no token for longer than a stream may stall."""
    channel = following.channel
    return channel.first_delta_at is None and time.monotonic() - channel.sent_at > stall_seconds


async def _prepare_move(
    stream: Failover,
    *,
    dispatcher: Dispatcher,
    link_for: Callable[[str], AgentLink | None],
    prefix: PromptPrefix | None,
) -> _Leg | None:
    """The stream's continuation opened on its next agent (None: none could be)."""
    frame = stream.request
    serving = stream.serving
    chosen: Candidate | None = None
    try:
        async for event in _acquire(
            dispatcher,
            frame,
            prefix,
            exclude=stream.excluded | ({serving} if serving else set()),
            deadline=time.time() + stream.deadline_seconds,
            under_way=True,
        ):
            if not isinstance(event, Queued):
                chosen = event
    except (UnknownModel, QueueFull, NoCapacity, GatewayClosing):
        return None
    if chosen is None:
        return None
    return await _open(
        stream.next_agent_frame, chosen.agent_id, dispatcher, link_for, merge_deltas=False
    )
