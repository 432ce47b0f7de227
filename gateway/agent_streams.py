"""A client stream's agent streams: choosing an agent, opening its stream, closing it.

The relay (gateway/relay.py) holds one `Leg` per agent stream of a client stream: the one
serving it, and while a move is made (gateway/moves.py) its next agent's. These are its I/O
with the dispatcher and the agents' links, kept apart from its loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import dataclass
from functools import partial

from gateway.agent_link import AgentLink, LinkUnavailable, Preempted, StreamChannel, Wakeup
from gateway.dispatch import (
    Dispatcher,
    GatewayClosing,
    NoCapacity,
    QueueFull,
    UnknownModel,
)
from gateway.failover import Failover
from gateway.fair_queue import Queued, stream_cost_tokens
from gateway.prefix import PromptPrefix, tenant_session
from gateway.router import Candidate
from gateway.unique import unique_id
from spotgate.logging import get_logger
from spotgate.protocol import GenerateFrame

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Leg:
    """One agent's stream of the client's stream: where it runs and its channel."""

    agent_id: str
    link: AgentLink
    frame_id: str
    channel: StreamChannel
    flex: tuple[str, int] | None = None  # a flex stream's model and key in `RunningFlex`


def acquire(
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
        tenant=frame.tenant or "",
        cost_tokens=stream_cost_tokens(frame),
        flex=frame.service_tier == "flex",
    )


async def open_leg(
    frame_for: Callable[[str], GenerateFrame],
    agent_id: str,
    dispatcher: Dispatcher,
    link_for: Callable[[str], AgentLink | None],
    *,
    merge_deltas: bool = True,
    slot_held: bool = False,
) -> Leg | None:
    """Open a stream on the agent (None: it cannot be reached; it is marked busy meanwhile).

    `slot_held`: in the slot of a stream of this client's just cancelled there (a move's
    next round), which is given back only if this one cannot be opened.
    """
    link = link_for(agent_id)
    if link is None:
        if slot_held:
            dispatcher.finished(agent_id)
        return None
    agent_frame = frame_for(unique_id())
    # Counted from the moment it is chosen: streams choosing while this link opens (a
    # fresh agent's first connection) must see the room the agent will have left.
    if not slot_held:
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
    # A placed flex stream may give its place to an interactive one; a move's continuation
    # (not merged: the move reads it) is not offered.
    if agent_frame.service_tier != "flex" or not merge_deltas:
        return Leg(agent_id, link, agent_frame.id, channel)
    model = agent_frame.base_model
    key = dispatcher.running_flex.add(model, partial(channel.push, Preempted()))
    if dispatcher.pending().get(model):  # one queued while this link opened: its place
        dispatcher.running_flex.preempt_one(model)
    return Leg(agent_id, link, agent_frame.id, channel, (model, key))


async def close_leg(leg: Leg, dispatcher: Dispatcher, *, cancel: bool) -> None:
    """The agent's stream is over for this client: cancel it there if it still runs."""
    if leg.flex is not None:
        dispatcher.running_flex.remove(*leg.flex)
    dispatcher.finished(leg.agent_id)
    if cancel:
        await leg.link.cancel(leg.frame_id)
    else:
        leg.link.forget(leg.frame_id)


def wake(channel: StreamChannel, _task: asyncio.Task[str | None]) -> None:
    """A move's preparation ended: its stream's reader sees it among the agent's frames."""
    channel.push(Wakeup())


def prepared(task: asyncio.Task[Leg | None]) -> Leg | None:
    """The next agent's stream a finished move opened (None: it found none, or failed)."""
    if task.cancelled():
        return None
    error = task.exception()
    if error is not None:
        log.warning("preparing a move failed", error=repr(error))
        return None
    return task.result()


async def prepare_move(
    stream: Failover,
    *,
    dispatcher: Dispatcher,
    link_for: Callable[[str], AgentLink | None],
    prefix: PromptPrefix | None,
) -> Leg | None:
    """The stream's continuation opened on its next agent (None: none could be)."""
    frame = stream.request
    serving = stream.serving
    chosen: Candidate | None = None
    try:
        async for event in acquire(
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
    return await open_leg(
        stream.next_agent_frame, chosen.agent_id, dispatcher, link_for, merge_deltas=False
    )
