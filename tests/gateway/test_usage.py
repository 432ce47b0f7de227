"""Usage per API key and model: counted by each gateway, summed in the `usage` table."""

from __future__ import annotations

import asyncio
from typing import Any

from prometheus_client import generate_latest

from gateway.metrics import GatewayMetrics
from gateway.usage import UsageMeter
from spotgate.registry import CreatedApiKey, Registry, UsageCounts, minute_of
from spotgate.settings import emulator_settings
from spotgate.tokens import SigningKey
from stack.emulator import AwsEmulator
from tests.gateway.conftest import MODEL as GATEWAY_MODEL
from tests.gateway.conftest import Gateway, GatewayAgentFactory, replicas
from tests.support.agents import AgentFactory
from tests.support.metrics import metric_value
from tests.support.wsclient import connect, generate, receive, run_streams, send

NOW = 1_800_000_000.0
MODEL = "synth"


def test_streams_are_summed_per_key_model_and_minute_and_exported_per_model_only() -> None:
    meter = UsageMeter(GatewayMetrics())
    meter.record("key-a", "m", 5, 7, NOW)
    meter.record("key-a", "m", 1, 2, NOW + 1)  # the same minute
    meter.record("key-a", "m", 1, 1, NOW + 60)  # the next one
    meter.record("key-b", "m", 3, 3, NOW)

    minute = minute_of(NOW)
    assert dict(meter.pending) == {
        ("key-a", "m", minute): UsageCounts(6, 9, 2),
        ("key-a", "m", minute + 60): UsageCounts(1, 1, 1),
        ("key-b", "m", minute): UsageCounts(3, 3, 1),
    }
    exposition = generate_latest(meter.metrics.registry).decode()

    def value(sample: str, **labels: str) -> float:
        return metric_value(exposition, f"spotgate_gateway_usage_{sample}", **labels)

    assert value("tokens_total", model="m", kind="prompt") == 10
    assert value("tokens_total", model="m", kind="completion") == 13
    assert value("streams_total", model="m") == 4
    assert "key-a" not in exposition  # no label per key


async def test_flex_streams_tokens_are_counted_apart_as_well(registry: Registry) -> None:
    meter = UsageMeter(GatewayMetrics())
    meter.record("key-a", "m", 5, 7, NOW)
    meter.record("key-a", "m", 2, 3, NOW, flex=True)  # a batch's request, say

    await meter.flush(registry)
    assert [row.counts for row in await registry.read_usage("key-a", NOW - 60)] == [
        UsageCounts(7, 10, 2, flex_tokens=5)
    ]


async def test_counts_a_failed_write_leaves_wait_for_the_next_flush(
    registry: Registry, aws: AwsEmulator
) -> None:
    meter = UsageMeter(GatewayMetrics())
    meter.record("key-a", "m", 5, 7, NOW)
    nowhere = emulator_settings("http://127.0.0.1:9", "us-east-1")  # nothing listens there
    async with Registry.open(nowhere) as unreachable:
        await meter.flush(unreachable)
    assert list(meter.unsent.values()) == [(("key-a", "m", minute_of(NOW)), UsageCounts(5, 7, 1))]

    await meter.flush(registry)
    assert not meter.unsent
    assert [row.counts for row in await registry.read_usage("key-a", NOW - 60)] == [
        UsageCounts(5, 7, 1)
    ]


class AnswerLost:
    """A registry whose usage writes reach the table but whose answers never come back."""

    def __init__(self, registry: Registry) -> None:
        self._registry = registry

    async def add_usage(self, *args: Any) -> None:
        await self._registry.add_usage(*args)
        raise TimeoutError("read timeout")


async def test_a_write_whose_answer_was_lost_is_sent_again_and_counted_once(
    registry: Registry,
) -> None:
    meter = UsageMeter(GatewayMetrics())
    meter.record("key-a", "m", 5, 7, NOW)
    lossy: Any = AnswerLost(registry)
    await meter.flush(lossy)
    meter.record("key-a", "m", 1, 1, NOW)  # meanwhile, the same minute: a write of its own
    assert len(meter.unsent) == 1

    await meter.flush(registry)
    assert not meter.unsent
    assert [row.counts for row in await registry.read_usage("key-a", NOW - 60)] == [
        UsageCounts(6, 8, 2)
    ]


async def test_two_gateways_streams_are_summed_in_the_table(
    aws: AwsEmulator,
    gateway_key: SigningKey,
    start_agent: AgentFactory,
    api_key: CreatedApiKey,
) -> None:
    async with replicas(aws, gateway_key, 2, start_agent, models=(MODEL,)) as gateways:

        async def streams(index: int) -> None:
            async with connect(gateways[index].ws_url, api_key.api_key) as ws:
                requests = [generate(f"{index}-{n}", MODEL, max_tokens=3 + n) for n in range(3)]
                done = await run_streams(ws, *requests)
            assert all(frames[-1]["type"] == "done" for frames in done.values())

        await asyncio.gather(streams(0), streams(1))
        for gateway in gateways:
            await gateway.state.usage.flush(gateway.state.registry)
        rows = await gateways[0].state.registry.read_usage(api_key.record.key_id, 0.0)

    total = UsageCounts()
    for row in rows:
        assert row.model == MODEL
        total += row.counts
    assert total.streams == 6
    assert total.completion_tokens == 2 * (3 + 4 + 5)
    assert total.prompt_tokens > 0


async def test_a_stream_cancelled_midway_is_charged_its_prompt_and_what_it_got(
    gateway: Gateway, gateway_agent: GatewayAgentFactory, api_key: CreatedApiKey
) -> None:
    """Cancelling one token before the end must not make a stream free (the agent sends no done)."""
    await gateway_agent(tokens_per_second=20.0)
    prompt = "a long question " * 50
    async with connect(gateway.ws_url, api_key.api_key) as ws:
        await send(ws, generate("c", GATEWAY_MODEL, content=prompt, max_tokens=1000))
        got = 0
        while got < 3:
            frame = await receive(ws)
            got += frame.get("n", 0) if frame["type"] == "delta" else 0
        await send(ws, {"type": "cancel", "id": "c"})
        while (frame := await receive(ws))["type"] != "done":
            got += frame.get("n", 0) if frame["type"] == "delta" else 0
    assert frame["finish_reason"] == "cancelled"
    assert frame["usage"]["prompt_tokens"] >= len(prompt) // 4

    await gateway.state.usage.flush(gateway.state.registry)
    [row] = await gateway.state.registry.read_usage(api_key.record.key_id, 0.0)
    assert row.counts.prompt_tokens == frame["usage"]["prompt_tokens"]
    assert row.counts.completion_tokens == got


async def test_a_long_prompt_in_flight_holds_back_the_next_stream_of_its_key(
    gateway: Gateway, gateway_agent: GatewayAgentFactory, aws: AwsEmulator
) -> None:
    """Streams started together see each other's prompts: each is charged at admission."""
    await gateway_agent(tokens_per_second=20.0)
    async with Registry.open(aws.settings()) as registry:
        limited = await registry.create_key("limited", tpm=300)
    async with connect(gateway.ws_url, limited.api_key) as ws:
        await send(ws, generate("long", GATEWAY_MODEL, content="word " * 400, max_tokens=1000))
        while (await receive(ws))["type"] != "delta":  # an agent has it, it is running
            pass
        next_stream = generate("next", GATEWAY_MODEL, max_tokens=2)
        refused = (await run_streams(ws, next_stream))["next"][-1]
    assert (refused["type"], refused["code"]) == ("error", "rate_limited")
    assert refused["message"] == "over 300 tokens per minute"
