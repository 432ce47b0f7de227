"""Requests the model's context cannot hold harm no other stream (ARCHITECTURE.md)."""

from __future__ import annotations

from collections.abc import Callable

import aiohttp
import openai

from spotgate.registry import CreatedApiKey, Registry
from stack.emulator import AwsEmulator
from tests.gateway.conftest import MODEL, Gateway, GatewayAgentFactory
from tests.support.agents import expected_text, synthetic
from tests.support.wsclient import connect, generate, receive, send, text_of

STREAMS = 8
STREAM_TOKENS = 60


async def post_chat(gateway: Gateway, api_key: CreatedApiKey, content: str) -> tuple[int, dict]:
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{gateway.url}/v1/chat/completions",
            headers={"Authorization": f"Bearer {api_key.api_key}"},
            json={"model": MODEL, "messages": [{"role": "user", "content": content}]},
        ) as response,
    ):
        return response.status, await response.json()


async def test_a_prompt_too_long_for_the_model_is_answered_400_and_harms_no_stream(
    gateway: Gateway, gateway_agent: GatewayAgentFactory, api_key: CreatedApiKey
) -> None:
    agents = [
        await gateway_agent(
            engine=synthetic(60.0, model=MODEL, ttft_seconds=0.01, max_model_len=32_768)
        )
        for _ in range(2)
    ]
    async with connect(gateway.ws_url, api_key.api_key) as ws:
        for n in range(STREAMS):
            await send(
                ws, generate(f"s{n}", MODEL, content=f"stream {n}", max_tokens=STREAM_TOKENS)
            )
        frames: dict[str, list[dict]] = {f"s{n}": [] for n in range(STREAMS)}
        while not all(any(f["type"] == "delta" for f in seen) for seen in frames.values()):
            frame = await receive(ws)
            frames[frame["id"]].append(frame)

        # One client's 100,000-character message while the eight stream.
        status, body = await post_chat(gateway, api_key, "x" * 100_000)
        # A message the gateway cannot prove too long from its length (3 bytes, 3 tokens, per
        # character): the agent measures it and refuses it the same way, and only it.
        measured_status, measured = await post_chat(gateway, api_key, "日" * 12_000)

        while not all(seen[-1]["type"] in ("done", "error") for seen in frames.values()):
            frame = await receive(ws)
            frames[frame["id"]].append(frame)

    assert status == 400, body
    assert body["error"]["code"] == "context_length_exceeded"
    assert "maximum context length is 32768 tokens" in body["error"]["message"]
    # "At least": the gateway's proof from the length alone; no agent was asked (below).
    assert "prompt has at least 100000 tokens" in body["error"]["message"]
    assert measured_status == 400, measured
    assert measured["error"]["code"] == "context_length_exceeded"
    # Exact, from the agent: the synthetic transcript `<user>…<assistant>` is a token a byte.
    assert "prompt has 36017 tokens" in measured["error"]["message"]
    for n in range(STREAMS):
        seen = frames[f"s{n}"]
        assert [f["type"] for f in seen if f["type"] != "delta"] == ["start", "done"], seen[-1]
        assert text_of(seen) == expected_text(f"stream {n}", STREAM_TOKENS)
    outcomes = {
        outcome: sum(
            agent.runtime.metrics.registry.get_sample_value(
                "spotgate_agent_streams_total", {"outcome": outcome}
            )
            or 0
            for agent in agents
        )
        for outcome in ("completed", "context_length_exceeded", "interrupted")
    }
    # The agents served every stream; one measured the long message; none was handed back.
    assert outcomes == {"completed": STREAMS, "context_length_exceeded": 1, "interrupted": 0}
    assert gateway.state.metrics.registry.get_sample_value("spotgate_gateway_resumes_total") == 0


async def test_without_max_tokens_a_reply_may_fill_the_rest_of_the_context(
    gateway: Gateway,
    gateway_agent: GatewayAgentFactory,
    api_key: CreatedApiKey,
    openai_client: Callable[..., openai.AsyncOpenAI],
) -> None:
    await gateway_agent(engine=synthetic(2000.0, model=MODEL, max_model_len=300))
    client = openai_client(base_url=f"{gateway.url}/v1", api_key=api_key.api_key)

    reply = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "fill the context"}]
    )

    assert reply.usage is not None
    assert reply.usage.prompt_tokens + reply.usage.completion_tokens == 300
    assert reply.choices[0].finish_reason == "length"


async def test_a_keys_max_tokens_caps_a_reply_that_names_no_max_tokens(
    gateway: Gateway,
    gateway_agent: GatewayAgentFactory,
    aws: AwsEmulator,
    openai_client: Callable[..., openai.AsyncOpenAI],
) -> None:
    await gateway_agent(engine=synthetic(2000.0, model=MODEL, max_model_len=300))
    async with Registry.open(aws.settings()) as registry:
        capped = await registry.create_key("capped", max_tokens=7)
    client = openai_client(base_url=f"{gateway.url}/v1", api_key=capped.api_key)

    reply = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "as much as allowed"}]
    )

    assert reply.usage is not None
    assert reply.usage.completion_tokens == 7
    assert reply.choices[0].finish_reason == "length"
