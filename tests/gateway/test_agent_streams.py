"""Opening a client stream's agent streams."""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.agent_link import Preempted, StreamChannel
from gateway.agent_streams import open_leg
from gateway.dispatch import Dispatcher
from gateway.fair_queue import Queued
from spotgate.protocol import GenerateFrame
from spotgate.registry import AgentRecord, AgentState
from spotgate.settings import QueueSettings
from tests.support.clocks import FakeClock

MODEL = "m"


class OpeningLink:
    """An agent link whose stream opens only when let: the moment another stream can queue."""

    def __init__(self) -> None:
        self.opening = asyncio.Event()
        self.let_open = asyncio.Event()

    async def open_stream(self, frame: GenerateFrame, *, merge_deltas: bool = True) -> Any:
        self.opening.set()
        await self.let_open.wait()
        return StreamChannel()


async def test_a_flex_stream_opening_as_an_interactive_one_queues_gives_it_its_place() -> None:
    clock = FakeClock(1_000.0)
    dispatcher = Dispatcher(QueueSettings(), clock=clock)
    record = AgentRecord(
        agent_id="a",
        url="http://a",
        model=MODEL,
        state=AgentState.READY,
        capacity=1,
        expires_at=clock.now + 100.0,
        changed_at=clock.now,
    )
    dispatcher.view.replace([record], now=clock.now)
    link: Any = OpeningLink()
    flex = GenerateFrame.model_validate(
        {"type": "generate", "id": "f", "model": MODEL, "prompt": "p", "service_tier": "flex"}
    )
    opening = asyncio.create_task(open_leg(lambda _id: flex, "a", dispatcher, lambda _agent: link))
    await link.opening.wait()  # the agent's one place is the flex stream's from here
    interactive = dispatcher.acquire(MODEL, session=None, exclude=(), deadline=clock.now + 60.0)
    assert await anext(interactive) == Queued(0, None)
    link.let_open.set()
    leg = await opening

    assert leg is not None
    assert isinstance(await anext(leg.channel.items(stall_seconds=0.0)), Preempted)  # queued
    await interactive.aclose()
