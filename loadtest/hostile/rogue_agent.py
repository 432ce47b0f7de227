"""A compromised agent: its own registry row says what it likes, its frames claim what it likes.

Its IAM role confines it to its own row of the `agents` table, not to the values in it: it
registers with a capacity of a million (to draw every stream of its model) and answers each
stream with three tokens and a `done` whose usage says ten million of each (to bill the
key). The gateway routes to it only as far as the pool manager vouches for it (its launch
record), and charges only what it relayed and measured.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from aiohttp import WSMsgType, web

from spotgate.process import serving_on_loopback
from spotgate.protocol import DeltaFrame, DoneFrame, StartFrame, Timings, Usage, encode_frame
from spotgate.registry import AgentRecord, AgentState, Registry

ROGUE_CAPACITY = 1_000_000
INFLATED_TOKENS = 10_000_000
REPLY_IDS = (11, 12, 13)
REPLY_TEXT = "one two three"
MAX_FRAME_BYTES = 16 * 1024 * 1024


@dataclass
class RogueAgent:
    """The rogue's websocket, and the streams gateways sent it."""

    agent_id: str
    url: str = ""
    served: list[str] = field(default_factory=list)

    async def register(self, registry: Registry, model: str) -> None:
        """Write its own row, as its role may: ready, at a capacity of a million."""
        await registry.register(
            AgentRecord(
                agent_id=self.agent_id,
                url=self.url,
                model=model,
                state=AgentState.READY,
                capacity=ROGUE_CAPACITY,
                engine="synthetic",
                started_at=time.time(),
            )
        )

    async def socket(self, request: web.Request) -> web.WebSocketResponse:
        """Answer every stream with three tokens and a usage of ten million."""
        ws = web.WebSocketResponse(heartbeat=10.0, max_msg_size=MAX_FRAME_BYTES)
        await ws.prepare(request)
        async for message in ws:
            if message.type is not WSMsgType.TEXT:
                continue
            frame = json.loads(message.data)
            if frame.get("type") != "generate":
                continue
            stream = str(frame["id"])
            self.served.append(stream)
            inflated = Usage(prompt_tokens=INFLATED_TOKENS, completion_tokens=INFLATED_TOKENS)
            for out in (
                StartFrame(
                    id=stream,
                    agent=self.agent_id,
                    engine="synthetic",
                    prompt_tokens=INFLATED_TOKENS,
                ),
                DeltaFrame(id=stream, text=REPLY_TEXT, n=len(REPLY_IDS), ids=list(REPLY_IDS)),
                DoneFrame(
                    id=stream,
                    finish_reason="stop",
                    usage=inflated,
                    timings=Timings(queue_ms=0, ttft_ms=0, total_ms=0),
                ),
            ):
                await ws.send_str(encode_frame(out))
        return ws


@asynccontextmanager
async def rogue_agent(agent_id: str) -> AsyncIterator[RogueAgent]:
    """A rogue agent serving on loopback (it accepts any caller: it has nothing to protect)."""
    rogue = RogueAgent(agent_id)
    app = web.Application()
    app.router.add_get("/v1/ws", rogue.socket)
    async with serving_on_loopback(app) as url:
        rogue.url = url
        yield rogue
