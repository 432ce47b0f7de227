"""The agent on real vLLM (CPU build here, CUDA on a GPU machine) and the tiny model."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import openai
import psutil
import pytest

from gpu_agent.engine import Engine
from gpu_agent.vllm_engine import VllmEngine
from spotgate.emulator import AwsEmulator
from spotgate.registry import AgentState, Registry
from tests.agents import (
    TINY_MODEL,
    AgentFactory,
    RunningAgent,
    vllm_settings,
    wait_for,
    wait_ready,
)
from tests.gpu_agent.wsclient import connect, generate, ids_of, receive, run_streams, send, text_of

pytestmark = pytest.mark.vllm

GREEDY = {"temperature": 0.0}


@pytest.fixture
async def agent(start_agent: AgentFactory, vllm_engine: Engine) -> RunningAgent:
    return await wait_ready(await start_agent(vllm_engine))


async def test_streams_over_ws_with_token_ids(agent: RunningAgent, token: str) -> None:
    async with connect(agent.ws_url, token) as ws:
        frames = (
            await run_streams(ws, generate("s", TINY_MODEL, max_tokens=24, want_ids=True, **GREEDY))
        )["s"]

    assert frames[0]["engine"] == "vllm"
    done = frames[-1]
    assert done["type"] == "done"
    assert done["usage"]["completion_tokens"] == len(ids_of(frames)) > 0
    assert done["usage"]["prompt_tokens"] > 0
    assert done["timings"]["ttft_ms"] <= done["timings"]["total_ms"]


async def test_sixteen_concurrent_streams_on_one_socket(agent: RunningAgent, token: str) -> None:
    async with connect(agent.ws_url, token) as ws:
        frames = await run_streams(
            ws,
            *(
                generate(f"s{n}", TINY_MODEL, content=f"prompt {n}", max_tokens=32, **GREEDY)
                for n in range(16)
            ),
        )

    assert len(frames) == 16
    for stream in frames.values():
        assert stream[0]["type"] == "start"
        assert stream[-1]["type"] == "done"
        assert stream[-1]["usage"]["completion_tokens"] == 32


async def test_cancel_aborts_the_request_in_the_engine(
    agent: RunningAgent, vllm_engine: Engine, token: str
) -> None:
    async with connect(agent.ws_url, token) as ws:
        await send(ws, generate("long", TINY_MODEL, max_tokens=1800, **GREEDY))
        assert (await receive(ws))["type"] == "start"
        assert (await receive(ws))["type"] == "delta"
        assert vllm_engine.running() == 1

        await send(ws, {"type": "cancel", "id": "long"})
        frame = await receive(ws)
        while frame["type"] == "delta":
            frame = await receive(ws)

    assert frame["type"] == "done"
    assert frame["finish_reason"] == "cancelled"
    assert frame["usage"]["completion_tokens"] < 1800
    assert vllm_engine.running() == 0


async def test_disconnect_aborts_the_request_in_the_engine(
    agent: RunningAgent, vllm_engine: Engine, token: str
) -> None:
    async with connect(agent.ws_url, token) as ws:
        await send(ws, generate("long", TINY_MODEL, max_tokens=1800, **GREEDY))
        await receive(ws)
        await receive(ws)
    stream_tasks = [handle.task for handle in agent.runtime.streams.values()]
    await asyncio.wait_for(asyncio.gather(*stream_tasks, return_exceptions=True), 10)
    assert agent.runtime.streams == {}
    assert vllm_engine.running() == 0


@pytest.mark.parametrize("k", [1, 5, 17, 40, 63])
async def test_resumed_greedy_generation_continues_exactly(
    agent: RunningAgent, token: str, k: int
) -> None:
    request = generate(
        "full", TINY_MODEL, content="Tell me about spot", max_tokens=64, want_ids=True, **GREEDY
    )
    async with connect(agent.ws_url, token) as ws:
        whole = (await run_streams(ws, request))["full"]
        ids, text = ids_of(whole), text_of(whole)
        # What a client had after k tokens: the text of the frames that brought them.
        sent, count = "", 0
        for frame in whole[1:-1]:
            if count >= k:
                break
            sent += frame["text"]
            count += frame["n"]
        resumed_request = {
            **request,
            "id": "rest",
            "resume": {"token_ids": ids[:count], "text": sent, "completion_tokens": count},
        }
        rest = (await run_streams(ws, resumed_request))["rest"]

    assert len(ids) == 64
    assert ids[:count] + ids_of(rest) == ids
    assert sent + text_of(rest) == text
    assert rest[-1]["usage"]["completion_tokens"] == 64


async def test_openai_sdk_against_the_agent(agent: RunningAgent, token: str) -> None:
    client = openai.AsyncOpenAI(base_url=f"{agent.url}/v1", api_key=token, max_retries=0)
    messages = [{"role": "user", "content": "Hello there"}]

    whole = await client.chat.completions.create(
        model=TINY_MODEL,
        messages=messages,
        max_tokens=16,
        temperature=0,  # type: ignore[arg-type]
    )
    chunks = [
        chunk
        async for chunk in await client.chat.completions.create(
            model=TINY_MODEL,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=16,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    ]

    assert whole.choices[0].finish_reason == "length"
    assert whole.usage is not None
    assert whole.usage.completion_tokens == 16
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole.choices[0].message.content
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 16

    with pytest.raises(openai.UnprocessableEntityError):
        await client.chat.completions.create(model=TINY_MODEL, messages=[], max_tokens=4)
    with pytest.raises(openai.AuthenticationError):
        await openai.AsyncOpenAI(
            base_url=f"{agent.url}/v1", api_key="not-a-token", max_retries=0
        ).chat.completions.create(model=TINY_MODEL, messages=messages, max_tokens=4)  # type: ignore[arg-type]


async def test_stop_strings_end_the_reply_before_them(agent: RunningAgent, token: str) -> None:
    async with connect(agent.ws_url, token) as ws:
        whole = text_of(
            (await run_streams(ws, generate("a", TINY_MODEL, max_tokens=48, **GREEDY)))["a"]
        )
        stop = whole[10:13]
        cut = (
            await run_streams(ws, generate("b", TINY_MODEL, max_tokens=48, stop=[stop], **GREEDY))
        )["b"]

    assert text_of(cut) == whole[: whole.index(stop)]
    assert cut[-1]["finish_reason"] == "stop"


async def test_a_dead_engine_core_hands_streams_back_and_the_agent_leaves(
    start_agent: AgentFactory, tiny_model_dir: Path, aws: AwsEmulator, token: str
) -> None:
    before = set(psutil.Process().children(recursive=True))
    engine = await VllmEngine.start(vllm_settings(tiny_model_dir))  # its own: it gets killed
    (engine_core,) = [  # new children may also include a multiprocessing helper
        child
        for child in set(psutil.Process().children(recursive=True)) - before
        if "EngineCore" in " ".join(child.cmdline())
    ]
    try:
        agent = await wait_ready(await start_agent(engine))
        async with connect(agent.ws_url, token) as ws:
            await send(ws, generate("long", TINY_MODEL, max_tokens=1800, **GREEDY))
            assert (await receive(ws))["type"] == "start"
            assert (await receive(ws))["type"] == "delta"
            engine_core.kill()
            frame = await receive(ws)
            while frame["type"] == "delta":
                frame = await receive(ws)
            assert frame["type"] == "error"
            assert frame["code"] == "interrupted"  # the gateway resumes it on another agent
            await send(ws, generate("next", TINY_MODEL, max_tokens=4))
            refused = await receive(ws)

        assert refused["type"] == "error"
        assert refused["code"] == "no_capacity"
        assert agent.runtime.phase == "failed"
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{agent.url}/healthz") as health:
                assert health.status == 503
                assert (await health.json())["failure"] == "the vLLM engine core died"
            async with http.get(f"{agent.url}/readyz") as ready:
                assert ready.status == 503
        async with Registry.open(aws.settings()) as registry:

            async def gone() -> bool:  # the pool manager reaps an agent marked gone
                record = await registry.get_agent(agent.runtime.settings.agent_id or "")
                return record is not None and record.state is AgentState.GONE

            await wait_for(gone, within=10)
    finally:
        await engine.close()
