"""A stream's channel that tells when its reader waits for the next push."""

from __future__ import annotations

import asyncio

from gateway.agent_link import StreamChannel


class WaitedChannel(StreamChannel):
    """Its `waited` is set while its reader waits for the next push."""

    def __init__(self) -> None:
        super().__init__()
        self.waited = asyncio.Event()

    async def _pushed_within(self, seconds: float | None) -> bool:
        self.waited.set()  # its wait begins before the loop turns again
        try:
            return await super()._pushed_within(seconds)
        finally:
            self.waited.clear()


async def reader_waits(channel: WaitedChannel) -> None:
    """Until the channel's reader has read all and waits."""
    await channel.waited.wait()
    assert channel.reader_waiting
