"""A compromised agent: its own registry row says what it likes, its frames claim what it likes.

The battery's row (`rogue_agent_rows`) puts two such rows beside the stack's real agent.

Its IAM role confines it to its own row of the `agents` table, not to the values in it: it
registers with a capacity of a million (to draw every stream of its model) and answers each
stream with three tokens and a `done` whose usage says ten million of each (to bill the
key). The gateway routes to it only as far as the pool manager vouches for it (its launch
record), and charges only what it relayed and measured.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from aiohttp import WSMsgType, web
from prometheus_client.parser import text_string_to_metric_families

from gateway.charges import prompt_token_bound
from loadtest.hostile.client import MODEL, chat_body
from loadtest.hostile.report import Row
from loadtest.hostile.stack import ROGUE_BILLED_TPM, HostileStack
from pool_manager.launches import vouch_for_agent
from spotgate.process import serving_on_loopback
from spotgate.protocol import (
    DeltaFrame,
    DoneFrame,
    GenerateFrame,
    StartFrame,
    Timings,
    Usage,
    encode_frame,
)
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


ROGUE_MODEL = "rogue-model"
"""What the launched rogue was launched for: the stack's one real agent serves `MODEL`."""
LAUNCHED_CAPACITY = 4
BILLED_STREAMS = 6
VICTIM_STREAMS = 8
JUDGED_WITHIN_SECONDS = 15.0


async def rogue_agent_rows(stack: HostileStack) -> Row:
    """Rogue rows: one never launched draws no stream, a launched one bills only what it relayed.

    The unlaunched one says it has room for a million streams of the real agent's model; the
    launched one, vouched for at 4, says a million too, and bills 10,000,000 tokens a stream.
    """
    row = Row(
        "gateway",
        f"a rogue agent row: capacity {ROGUE_CAPACITY} never launched, beside the agent that "
        f"serves its model; a launched one (capacity {LAUNCHED_CAPACITY}) saying "
        f"{ROGUE_CAPACITY} and billing {INFLATED_TOKENS} tokens a stream to a key of tpm "
        f"{ROGUE_BILLED_TPM}",
    )
    async with (
        Registry.open(stack.emulator.settings()) as registry,
        rogue_agent("rogue-unlaunched") as unlaunched,
        rogue_agent("rogue-launched") as launched,
    ):
        await vouch_for_agent(
            registry,
            agent_id=launched.agent_id,
            model=ROGUE_MODEL,
            url=launched.url,
            capacity=LAUNCHED_CAPACITY,
        )
        await unlaunched.register(registry, MODEL)
        await launched.register(registry, ROGUE_MODEL)
        await _judged(stack, row)
        await _victims(stack, row, unlaunched)
        await _billed(stack, row, launched)
    return row


async def _judged(stack: HostileStack, row: Row) -> None:
    """Until the gateway has judged both rows (its metrics say so)."""
    wanted = {"unknown_agent", "capacity"}
    async with asyncio.timeout(JUDGED_WITHIN_SECONDS):
        while True:
            async with stack.http.get(f"{stack.gateway_ops_url}/metrics") as reply:
                exposition = await reply.text()
            counted = {
                sample.labels.get("reason")
                for family in text_string_to_metric_families(exposition)
                for sample in family.samples
                if sample.name == "spotgate_gateway_rogue_agents_total" and sample.value >= 1
            }
            if wanted <= counted:
                row.record("both rows judged")
                return
            await asyncio.sleep(0.2)


async def _victims(stack: HostileStack, row: Row, unlaunched: RogueAgent) -> None:
    headers = {"Authorization": f"Bearer {stack.keys['victim'].api_key}"}
    url = f"{stack.gateway_url}/v1/chat/completions"

    async def one() -> int:
        async with stack.http.post(url, data=chat_body(), headers=headers) as reply:
            await reply.read()
            return reply.status

    for status in await asyncio.gather(*(one() for _ in range(VICTIM_STREAMS))):
        row.record(f"victim {status}", None if status == 200 else f"a victim stream got {status}")
    if unlaunched.served:
        row.problems.append(f"the unlaunched rogue drew {len(unlaunched.served)} streams")


async def _billed(stack: HostileStack, row: Row, launched: RogueAgent) -> None:
    headers = {"Authorization": f"Bearer {stack.keys['billed'].api_key}"}
    messages = [{"role": "user", "content": "hi"}]
    body = {"model": ROGUE_MODEL, "messages": messages}
    bound = prompt_token_bound(GenerateFrame(id="bound", model=ROGUE_MODEL, messages=messages))
    for _ in range(BILLED_STREAMS):  # 10M billed once would refuse every later one (429)
        async with stack.http.post(
            f"{stack.gateway_url}/v1/chat/completions", json=body, headers=headers
        ) as reply:
            answer = await reply.json()
        if reply.status != 200:
            row.record(f"billed {reply.status}", f"a stream of the billed key got {reply.status}")
            continue
        usage = answer["usage"]
        overbilled = usage["completion_tokens"] != len(REPLY_IDS) or usage["prompt_tokens"] > bound
        row.record("billed what was relayed", f"charged {usage}" if overbilled else None)
    if len(launched.served) != BILLED_STREAMS:
        row.problems.append(f"the launched rogue served {len(launched.served)} streams")
