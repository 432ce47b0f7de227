"""The relay's bookkeeping of agent capacity, with a link that is slow to open."""

from __future__ import annotations

import asyncio
import time

from gateway.agent_link import StreamChannel
from gateway.dispatch import Dispatcher
from gateway.relay import RelayOutcome, relay_stream
from spotgate.protocol import GenerateFrame, QueuedFrame
from spotgate.registry import AgentRecord, AgentState
from spotgate.settings import QueueSettings

MODEL = "synth"


class OpeningLink:
    """A link to an agent whose first connection never completes."""

    def __init__(self) -> None:
        self.opening = asyncio.Event()
        self.opened = 0

    async def open_stream(self, _frame: GenerateFrame) -> StreamChannel:
        self.opened += 1
        self.opening.set()
        await asyncio.Event().wait()
        raise AssertionError("never opens")


async def test_a_chosen_agent_counts_the_stream_while_its_link_opens() -> None:
    dispatcher = Dispatcher(QueueSettings(deadline_seconds=5.0))
    now = time.time()
    dispatcher.view.replace(
        [AgentRecord("a", "http://a", MODEL, AgentState.READY, capacity=1, expires_at=now + 60)],
        now,
    )
    link = OpeningLink()

    def relay(stream_id: str):  # type: ignore[no-untyped-def]
        frame = GenerateFrame(id=stream_id, model=MODEL, prompt="hi")
        return relay_stream(
            frame,
            dispatcher=dispatcher,
            link_for=lambda _agent_id: link,  # type: ignore[arg-type,return-value]
            deadline_seconds=5.0,
            stall_seconds=30.0,
            outcome=RelayOutcome(),
        )

    first, second = relay("first"), relay("second")
    placing = asyncio.create_task(anext(first))
    await link.opening.wait()
    async with asyncio.timeout(2):
        # The agent's one slot is taken: the second stream waits instead of overbooking it.
        assert await anext(second) == QueuedFrame(id="second", position=0)
    placing.cancel()
    await asyncio.gather(placing, return_exceptions=True)
    await second.aclose()

    assert link.opened == 1
    assert dict(dispatcher.outstanding) == {}  # the cancelled placement gave its slot back
