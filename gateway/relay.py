"""One client stream through the gateway: wait for an agent, relay, resume on failure.

The gateway always asks agents for token ids, keeps the ids and text already sent to the
client, and when the agent's link drops, the agent answers `interrupted` (draining) or
refuses with `no_capacity`, sends the stream to another agent with `resume`: the client's
stream goes on with no token lost and none repeated, and `usage` counts each token once.
A stream that cannot be placed again before its deadline ends with a clear error, and one
still open when its gateway stops (the drain's grace is over) with `going_away`.

What to do at each turn is decided by the stream's `Failover` (gateway/failover.py, pure);
this module only does the I/O: it waits in the dispatcher, opens the agent's stream, reads
its frames, hands each to the Failover and forwards what that returns.
"""

from __future__ import annotations

import secrets
import time
import uuid
from collections.abc import AsyncGenerator, Callable

from gateway.agent_link import (
    AgentLink,
    GatewayGoingAway,
    LinkLost,
    LinkUnavailable,
    StreamStalled,
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
from gateway.prefix import tenant_session
from gateway.receipts import ReceiptChain
from gateway.router import Candidate
from spotgate.logging import get_logger
from spotgate.protocol import (
    DeltaFrame,
    DoneFrame,
    ErrorFrame,
    GenerateFrame,
    QueuedFrame,
    StartFrame,
)

__all__ = ["ClientFrame", "RelayOutcome", "relay_stream"]

log = get_logger(__name__)

ClientFrame = QueuedFrame | StartFrame | DeltaFrame | DoneFrame | ErrorFrame


async def relay_stream(
    frame: GenerateFrame,
    *,
    dispatcher: Dispatcher,
    link_for: Callable[[str], AgentLink | None],
    deadline_seconds: float,
    stall_seconds: float,
    outcome: RelayOutcome,
    receipts: ReceiptChain | None = None,
) -> AsyncGenerator[ClientFrame, None]:
    """Frames for the client, in its own stream id, from whichever agents serve it.

    With `receipts`, each delta carries the receipt of every id the client then holds.
    """
    stream = Failover.begin(
        frame,
        deadline_seconds=deadline_seconds,
        now=time.time(),
        monotonic=time.monotonic(),
        handle_key=secrets.token_bytes(HANDLE_KEY_BYTES),
        outcome=outcome,
        receipts=receipts,
    )
    # Hashed once: a moved stream's prompt is the same, and goes where it is most likely cached.
    prefix = dispatcher.prompt_prefix(frame)
    while True:
        chosen: Candidate | None = None
        try:
            async for event in dispatcher.acquire(
                frame.base_model,
                session=tenant_session(frame.tenant or "", frame.session),
                exclude=stream.excluded,
                deadline=stream.deadline,
                prefix=prefix,
                adapter=frame.adapter,
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
        agent_id = chosen.agent_id
        stream.on_agent_chosen(monotonic=time.monotonic())
        link = link_for(agent_id)
        if link is None:
            stream.on_unavailable(agent_id)
            continue
        agent_frame = stream.agent_frame(uuid.uuid4().hex)
        # Counted from the moment it is chosen: streams choosing while this link opens (a
        # fresh agent's first connection) must see the room the agent will have left.
        dispatcher.started(agent_id)
        try:
            channel = await link.open_stream(agent_frame)
        except LinkUnavailable as err:
            dispatcher.finished(agent_id)
            log.info("agent unavailable; trying another", agent_id=agent_id, error=str(err))
            stream.on_unavailable(agent_id)
            continue
        except BaseException:
            dispatcher.finished(agent_id)
            raise
        stream.on_opened(agent_id)
        full = False  # the agent refused the stream for capacity
        try:
            async for item in channel.items(stall_seconds):
                if isinstance(item, DeltaFrame):
                    yield stream.on_delta(
                        item,
                        monotonic=time.monotonic(),
                        agent_sent_at=channel.sent_at,
                        agent_first_token_at=channel.first_delta_at,
                    )
                elif isinstance(item, StartFrame):
                    dispatcher.taken(agent_id, prefix, frame.adapter)
                    start = stream.on_start(item)
                    if start is not None:
                        yield start
                elif isinstance(item, DoneFrame):
                    yield stream.on_done(item, monotonic=time.monotonic())
                    return
                elif isinstance(item, GatewayGoingAway):  # the agent's stream is cancelled below
                    yield stream.on_going_away()
                    return
                elif isinstance(item, StreamStalled):  # nothing for too long: stop it there
                    stalled = stream.on_stalled(now=time.time())
                    await link.cancel(agent_frame.id)
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
            dispatcher.finished(agent_id)
            if stream.serving is not None:  # the client went away mid-stream
                await link.cancel(agent_frame.id)
            else:
                link.forget(agent_frame.id)
        if full:  # after `finished`, which takes the mark off: this stream never ran there
            dispatcher.refused_for_capacity(agent_id)
