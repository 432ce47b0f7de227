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
the break (`moving`) prepares the next agent in a task of its own while the draining
agent's frames are relayed; the task's end wakes the relay up through the draining agent's
channel, and the relay switches the stream there.
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
from gateway.failover import HANDLE_KEY_BYTES, Failover, GiveUp, RelayOutcome, Unplaced, WaitForRoom
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
    switched: _Leg | None = None  # the next agent's stream, opened at an early switch
    draining: _Leg | None = None  # the draining agent's, until the next agent's first token
    try:
        while True:
            if switched is not None:
                leg, switched = switched, None
            else:
                chosen: Candidate | None = None
                try:
                    async for event in _acquire(
                        dispatcher, frame, prefix, exclude=stream.excluded, deadline=stream.deadline
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
            mover: asyncio.Task[str | None] | None = None
            warmed: str | None = None  # the next agent, warmed: the switch comes at a token
            try:
                async for item in leg.channel.items(stall_seconds):
                    if draining is not None and not isinstance(item, StartFrame):
                        # The next agent's first word after an early switch.
                        if isinstance(item, ErrorFrame | LinkLost | StreamStalled):
                            # It failed before its first token: the draining agent streams on.
                            await _close_leg(leg, dispatcher, cancel=True)
                            stream.on_switch_failed()
                            switched, draining = draining, None
                            break
                        next_ids = list(item.ids or ()) if isinstance(item, DeltaFrame) else []
                        stream.on_switch_checked(draining.channel.unread_ids(), next_ids)
                        await _close_leg(draining, dispatcher, cancel=True)
                        draining = None
                    if isinstance(item, DeltaFrame):
                        yield stream.on_delta(
                            item,
                            monotonic=time.monotonic(),
                            agent_sent_at=leg.channel.sent_at,
                            agent_first_token_at=leg.channel.first_delta_at,
                        )
                        if warmed is not None:
                            # Right after a token, so the client's wait starts at the switch.
                            opened = await _open(stream.agent_frame, warmed, dispatcher, link_for)
                            warmed = None
                            if opened is None:
                                stream.on_move_abandoned()
                                continue
                            # From here the client's tokens come from the next agent.
                            stream.on_switch()
                            switched, draining = opened, leg
                            log.info(
                                "stream moved before the break",
                                stream_id=frame.id,
                                tokens_so_far=len(stream.ids),
                            )
                            break
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
                                    stream,
                                    dispatcher=dispatcher,
                                    link_for=link_for,
                                    prefix=prefix,
                                    stall_seconds=stall_seconds,
                                ),
                                name=f"move {frame.id}",
                            )
                            mover.add_done_callback(partial(_wake, leg.channel))
                    elif isinstance(item, Wakeup):
                        if mover is None or not mover.done():
                            continue
                        # The switch waits for the draining agent's next token (above).
                        warmed, mover = _warmed(mover), None
                        if warmed is None:
                            stream.on_move_abandoned()
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
                        break
            finally:
                if mover is not None:  # the stream ended or broke before its move was ready
                    mover.cancel()
                    await asyncio.wait([mover])  # its own `finally` ends the warm-up
                if mover is not None or warmed is not None:
                    stream.on_move_abandoned()
                if leg not in (draining, switched):
                    # The client went away mid-stream (still serving): tell the agent to stop.
                    await _close_leg(leg, dispatcher, cancel=stream.serving is not None)
            if full:  # after `finished`, which takes the mark off: this stream never ran there
                dispatcher.refused_for_capacity(agent_id)
    finally:
        for left in (switched, draining):
            if left is not None:
                await _close_leg(left, dispatcher, cancel=True)


def _acquire(
    dispatcher: Dispatcher,
    frame: GenerateFrame,
    prefix: PromptPrefix | None,
    *,
    exclude: Collection[str],
    deadline: float,
) -> AsyncIterator[Queued | Candidate]:
    """The dispatcher's wait for an agent for the client's stream (its session, prefix, adapter)."""
    return dispatcher.acquire(
        frame.base_model,
        session=tenant_session(frame.tenant or "", frame.session),
        exclude=exclude,
        deadline=deadline,
        prefix=prefix,
        adapter=frame.adapter,
    )


async def _open(
    frame_for: Callable[[str], GenerateFrame],
    agent_id: str,
    dispatcher: Dispatcher,
    link_for: Callable[[str], AgentLink | None],
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


def _warmed(task: asyncio.Task[str | None]) -> str | None:
    """The agent a finished move warmed (None: it found none, or failed)."""
    if task.cancelled():
        return None
    error = task.exception()
    if error is not None:
        log.warning("preparing a move failed", error=repr(error))
        return None
    return task.result()


async def _prepare_move(
    stream: Failover,
    *,
    dispatcher: Dispatcher,
    link_for: Callable[[str], AgentLink | None],
    prefix: PromptPrefix | None,
    stall_seconds: float,
) -> str | None:
    """The stream's next agent, its prefix cache warmed with the stream (None: none could be)."""
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
        ):
            if not isinstance(event, Queued):
                chosen = event
    except (UnknownModel, QueueFull, NoCapacity, GatewayClosing):
        return None
    if chosen is None:
        return None
    if not await _warm_up(stream, chosen.agent_id, dispatcher, link_for, prefix, stall_seconds):
        return None
    return chosen.agent_id


async def _warm_up(
    stream: Failover,
    agent_id: str,
    dispatcher: Dispatcher,
    link_for: Callable[[str], AgentLink | None],
    prefix: PromptPrefix | None,
    stall_seconds: float,
) -> bool:
    """One warm-up of the agent with the tokens the client has now: whether it ended well."""
    frame = stream.request
    warm_from = len(stream.ids)
    warm = await _open(stream.warm_frame, agent_id, dispatcher, link_for)
    if warm is None:
        return False
    warmed = False
    warm_ids: list[int] = []
    try:
        async for item in warm.channel.items(stall_seconds):
            if isinstance(item, DeltaFrame):
                warm_ids.extend(item.ids or ())
            elif isinstance(item, StartFrame):
                dispatcher.taken(warm.agent_id, prefix, frame.adapter)
            else:
                warmed = isinstance(item, DoneFrame)
                break
    finally:
        await _close_leg(warm, dispatcher, cancel=not warmed)
    if warmed:
        stream.on_warmed(warm_from, warm_ids)
    return warmed
