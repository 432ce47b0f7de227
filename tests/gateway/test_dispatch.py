"""Several gateways, one pool: each agent is the authority on its own capacity."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from typing import Any

from gpu_agent.runtime import StreamHandle
from spotgate.registry import AgentState, CreatedApiKey
from spotgate.settings import QueueSettings
from spotgate.tokens import SigningKey
from stack.emulator import AwsEmulator
from tests.gateway.conftest import MODEL, Gateway, running_gateway
from tests.support.agents import AgentFactory, synthetic, wait_for, wait_ready
from tests.support.wsclient import connect, generate, run_streams

CAPACITY = 3


class MostStreams(dict[Hashable, StreamHandle]):
    """An agent's table of its streams that remembers the most it ever held at once."""

    most = 0

    def __setitem__(self, key: Hashable, value: StreamHandle) -> None:
        super().__setitem__(key, value)
        self.most = max(self.most, len(self))


async def test_two_gateways_never_put_more_than_its_capacity_on_an_agent_and_queue_the_rest(
    aws: AwsEmulator,
    gateway_key: SigningKey,
    start_agent: AgentFactory,
    api_key: CreatedApiKey,
) -> None:
    queue = QueueSettings(max_pending_per_model=16, deadline_seconds=30.0)
    async with (
        running_gateway(aws, gateway_key, queue=queue) as first,
        running_gateway(aws, gateway_key, queue=queue, public_url=first.url) as second,
    ):
        engine = synthetic(40.0, model=MODEL, ttft_seconds=0.01, capacity=CAPACITY)
        agent = await wait_ready(
            await start_agent(
                engine,
                pinned_public_key=gateway_key.verify_key.to_pem(),
                token_issuer=first.url,
            )
        )
        streams = agent.runtime.streams = MostStreams()
        agent_id = agent.runtime.identity.agent_id  # type: ignore[union-attr]

        async def routable_through_both() -> bool:
            records = [g.state.dispatcher.view.record(agent_id) for g in (first, second)]
            return all(r is not None and r.state is AgentState.READY for r in records)

        await wait_for(routable_through_both, within=10)

        async def client(gateway: Gateway, prefix: str) -> dict[str, list[Any]]:
            requests = [generate(f"{prefix}{n}", MODEL, max_tokens=20) for n in range(5)]
            async with connect(gateway.ws_url, api_key.api_key) as ws:
                return await run_streams(ws, *requests)

        # Over 3 × its capacity at once, half through each gateway.
        results = await asyncio.gather(client(first, "a"), client(second, "b"))

    frames = {stream: seen for result in results for stream, seen in result.items()}
    assert len(frames) == 10
    assert all(seen[-1]["type"] == "done" for seen in frames.values()), frames
    assert streams.most == CAPACITY  # full, and never more
    waited = [stream for stream, seen in frames.items() if seen[0]["type"] == "queued"]
    assert len(waited) >= 10 - 2 * CAPACITY  # each gateway alone would send it `CAPACITY`
