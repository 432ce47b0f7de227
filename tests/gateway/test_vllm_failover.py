"""Failover exactness with real vLLM greedy decoding behind the gateway."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import jsonschema
import openai
import pytest

from gpu_agent.drain import HANDBACK_MARGIN_SECONDS
from gpu_agent.engine import Engine
from spotgate.registry import CreatedApiKey
from tests.gateway.conftest import Gateway, GatewayAgentFactory, serving
from tests.support.agents import (
    LLAMA2_MODEL,
    LORA_MODEL,
    REASONING_ANSWER,
    REASONING_MODEL,
    REASONING_REPLY,
    REASONING_THINKING,
    REASONING_THINKING_TOKENS,
    TINY_MODEL,
    TOOL_CALL_ARGUMENTS,
    TOOL_CALL_CONTENT,
    TOOL_MODEL,
    Imds,
    RunningAgent,
    spot_notice,
)
from tests.support.wsclient import (
    connect,
    generate,
    ids_of,
    receive,
    receive_to_end,
    run_streams,
    send,
    text_of,
)

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("engines_for_the_next_test")]


KILL_ATTEMPTS = 5
"""Replies sent until one is still running when its agent is killed."""
MOVE_ATTEMPTS = 3
"""Replies sent until one is moved before the break (the gateway may drop a move)."""
MARGIN_AHEAD_SECONDS = 0.5
"""How far before its drain's margin a draining agent's stopped clock stands."""


def stopped_clock(at: float) -> Callable[[], float]:
    """A clock that stays at `at`."""
    return lambda: at


def cut_links(agent: RunningAgent) -> None:
    """What a kill -9 does to the gateway's links to an agent: a reset, no close frame."""
    for socket in list(agent.runtime.websockets):
        socket._transport.abort()  # type: ignore[union-attr]


@pytest.mark.parametrize("fault", ["spot notice", "kill -9"])
@pytest.mark.parametrize("model", [TINY_MODEL, LLAMA2_MODEL])
async def test_a_vllm_stream_moved_mid_reply_resumes_byte_for_byte(
    gateway: Gateway,
    gateway_agent: GatewayAgentFactory,
    vllm_engine: Engine,
    vllm_llama2_engine: Engine,
    api_key: CreatedApiKey,
    imds: Imds,
    model: str,
    fault: str,
) -> None:
    engine = vllm_engine if model == TINY_MODEL else vllm_llama2_engine
    request = generate(
        "ref", model, content="Tell me about spot", max_tokens=1200, temperature=0, want_ids=True
    )
    if model == LLAMA2_MODEL:  # Llama-2's tokenizer has no chat template: a raw prompt
        del request["messages"]
        request["prompt"] = "Tell me about spot"
    doomed = await gateway_agent(model=model, engine=engine)
    async with connect(gateway.ws_url, api_key.api_key) as ws:
        reference = (await run_streams(ws, request))["ref"]

        await send(ws, {**request, "id": "moved"})
        frames = [await receive(ws)]
        assert serving(gateway) == {doomed.runtime.identity.agent_id}  # type: ignore[union-attr]
        # The second agent shares the engine (identical weights); it gets no notice.
        await gateway_agent(model=model, engine=engine, imds_url="http://127.0.0.1:9")
        if fault == "spot notice":
            # 16 s to the deadline, 15 s margin: the long stream is handed back at once.
            await spot_notice(imds, in_seconds=16)
        else:
            while sum(f.get("n", 0) for f in frames) < 10:  # mid-reply
                frames.append(await receive(ws))
            cut_links(doomed)
        await receive_to_end(ws, frames)

    assert frames[-1]["type"] == "done", frames[-1]
    assert len({f["agent"] for f in frames if f["type"] == "start"}) == 2
    assert ids_of(frames) == ids_of(reference)
    assert text_of(frames) == text_of(reference) == engine.decode(ids_of(reference))
    assert frames[-1]["usage"] == reference[-1]["usage"]


@pytest.mark.parametrize(
    "sampling",
    [
        {"temperature": 0},
        # The next agent's continuation draws each token with its place's seed: its repeats
        # equal the draining agent's tokens, and so does the rest of the reply.
        {"temperature": 1.2, "top_p": 0.95, "seed": 13},
    ],
    ids=["greedy", "sampled with a seed"],
)
async def test_a_vllm_stream_moved_before_the_break_equals_its_unmoved_run(
    gateway: Gateway,
    gateway_agent: GatewayAgentFactory,
    vllm_engine: Engine,
    api_key: CreatedApiKey,
    sampling: dict[str, Any],
) -> None:
    request = generate(
        "ref",
        TINY_MODEL,
        # Long enough for whole prefix blocks: the stream goes where its reference went.
        content="Tell me about spot capacity and what it costs. " * 6,
        max_tokens=1800,
        ignore_eos=True,
        want_ids=True,
        **sampling,
    )
    doomed = await gateway_agent(model=TINY_MODEL, engine=vllm_engine)
    metrics = gateway.state.metrics
    async with connect(gateway.ws_url, api_key.api_key) as ws:
        reference = (await run_streams(ws, request))["ref"]
        for attempt in range(MOVE_ATTEMPTS):
            # The next agent shares the engine (identical weights); it gets no notice.
            spare = await gateway_agent(
                model=TINY_MODEL, engine=vllm_engine, imds_url="http://127.0.0.1:9"
            )
            await send(ws, {**request, "id": f"moved-{attempt}"})
            frames = [await receive(ws)]
            # The first goes where its reference went. After a dropped move either agent left
            # may take it (they share one engine): the one serving it is drained.
            if attempt and serving(gateway) != {doomed.runtime.identity.agent_id}:  # type: ignore[union-attr]
                doomed, spare = spare, doomed
            assert serving(gateway) == {doomed.runtime.identity.agent_id}, frames  # type: ignore[union-attr]
            while sum(f.get("n", 0) for f in frames) < 50:  # the agent knows the stream's rate
                frames.append(await receive(ws))
            # The drain's clock stands half a second before the drain's margin: the stream
            # cannot finish by then at any rate, so the agent says `moving` at its first look
            # and streams on, and the break never comes; the gateway's continuation on the
            # next agent catches up with the client and takes the stream over. A move the
            # gateway drops (its continuation diverged, or fell behind on a loaded machine)
            # leaves the stream to finish where it is: exact too, and the next attempt drains
            # the next agent.
            runtime = doomed.runtime
            deadline = time.time() + HANDBACK_MARGIN_SECONDS + 600
            runtime.wall_clock = stopped_clock(
                deadline - HANDBACK_MARGIN_SECONDS - MARGIN_AHEAD_SECONDS
            )
            await runtime.begin_drain(deadline)  # as a spot notice does
            await receive_to_end(ws, frames)

            assert frames[-1]["type"] == "done", frames[-1]
            assert ids_of(frames) == ids_of(reference)
            assert text_of(frames) == text_of(reference) == vllm_engine.decode(ids_of(reference))
            assert frames[-1]["usage"] == reference[-1]["usage"]
            assert runtime.metrics.streams.labels(outcome="interrupted")._value.get() == 0
            if metrics.early_moves._value.get():
                assert len({f["agent"] for f in frames if f["type"] == "start"}) == 2
                break
            doomed = spare
    assert metrics.early_moves._value.get() == 1, (
        f"no move in {MOVE_ATTEMPTS} attempts "
        f"({metrics.early_move_divergences._value.get():g} diverged)"
    )


WORDS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "words": {
            "type": "array",
            "items": {"enum": ["alpha", "bravo", "charlie"]},
            "minItems": 30,
            "maxItems": 30,
        }
    },
    "required": ["words"],
    "additionalProperties": False,
}
"""Some 250 tokens of reply (the tiny model spells words byte by byte): a stream is cut well
inside it."""
STRUCTURED = {"type": "json_schema", "json_schema": {"name": "words", "schema": WORDS_SCHEMA}}
LIST_WORDS = {"type": "function", "function": {"name": "list_words", "parameters": WORDS_SCHEMA}}
FEATURES: dict[str, dict[str, Any]] = {
    "json_schema": {"response_format": STRUCTURED, "temperature": 0},
    "tool call": {
        "tools": [LIST_WORDS],
        "tool_choice": {"type": "function", "function": {"name": "list_words"}},
        "temperature": 1.0,
        "seed": 11,
    },
    "json_schema sampled": {"response_format": STRUCTURED, "temperature": 1.0, "seed": 7},
    "sampled with a seed": {
        "temperature": 1.2,
        "top_p": 0.95,
        "top_k": 200,
        "min_p": 0.01,
        "repetition_penalty": 1.1,
        "presence_penalty": 0.3,
        "seed": 13,
    },
    "penalties": {"frequency_penalty": 1.5, "presence_penalty": 0.5, "temperature": 0},
    "repetition_penalty": {"repetition_penalty": 1.5, "temperature": 0},
    "logprobs": {"logprobs": 3, "temperature": 0},
}


def logprobs_of(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [entry for frame in frames for entry in frame.get("logprobs") or ()]


async def moved_by_a_kill(
    gateway: Gateway,
    gateway_agent: GatewayAgentFactory,
    engine: Engine,
    api_key: CreatedApiKey,
    request: dict[str, Any],
    after_tokens: int,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """An unmoved stream's frames, and those of the same request whose agent is killed (links
    reset) once `after_tokens` tokens have come; two agents share `engine`."""
    model = request["model"]
    agents = {
        agent.runtime.identity.agent_id: agent  # type: ignore[union-attr]
        for agent in [
            await gateway_agent(model=model, engine=engine),
            await gateway_agent(model=model, engine=engine, imds_url="http://127.0.0.1:9"),
        ]
    }
    async with connect(gateway.ws_url, api_key.api_key) as ws:
        reference = (await run_streams(ws, request))["ref"]
        for attempt in range(KILL_ATTEMPTS):
            await send(ws, {**request, "id": f"moved-{attempt}"})
            frames = [await receive(ws)]
            while sum(f.get("n", 0) for f in frames) < after_tokens:
                frames.append(await receive(ws))
            # A short reply may have ended while the client read its first tokens (the engine
            # runs on while a loaded test process catches up): then there is nothing to kill,
            # or its `done` was already on the way when the links were cut.
            running = serving(gateway)
            if running:
                [first] = running
                cut_links(agents[first])
            await receive_to_end(ws, frames)
            starts = {f["agent"] for f in frames if f["type"] == "start"}
            ended_first = frames[-1]["type"] == "done" and len(starts) == 1
            if running and not ended_first:
                break
        assert not ended_first, f"each of {KILL_ATTEMPTS} replies ended before its agent's kill"
    assert frames[-1]["type"] == "done", frames[-1]
    assert len({f["agent"] for f in frames if f["type"] == "start"}) == 2
    return reference, frames


@pytest.mark.parametrize("feature", FEATURES)
async def test_a_stream_moved_by_a_kill_keeps_each_feature(
    gateway: Gateway,
    gateway_agent: GatewayAgentFactory,
    vllm_engine: Engine,
    api_key: CreatedApiKey,
    feature: str,
) -> None:
    request = generate(
        "ref", TINY_MODEL, content="List words", max_tokens=600, want_ids=True, **FEATURES[feature]
    )
    reference, frames = await moved_by_a_kill(
        gateway,
        gateway_agent,
        vllm_engine,
        api_key,
        request,
        after_tokens=20,  # mid-reply
    )

    if "response_format" in request or "tools" in request:  # the reply, or the call's arguments
        jsonschema.validate(json.loads(text_of(frames)), WORDS_SCHEMA)
        assert frames[-1]["finish_reason"] == "stop"
    # Greedy, or sampled with a seed (each token's draw seeded by its place): exactly the reply
    # of an unmoved stream.
    if request.get("temperature") == 0 or "seed" in request:
        assert ids_of(frames) == ids_of(reference)
        assert text_of(frames) == text_of(reference)
    if "logprobs" in request:
        moved, unmoved = logprobs_of(frames), logprobs_of(reference)
        assert len(moved) == len(ids_of(frames))  # no gap, no repeat
        assert [e["token"] for e in moved] == [e["token"] for e in unmoved]
        assert [e["logprob"] for e in moved] == pytest.approx(
            [e["logprob"] for e in unmoved], abs=1e-3
        )


@pytest.mark.parametrize("temperature", [0.0, 1.0])
async def test_a_call_the_model_makes_of_its_own_accord_survives_a_kill_mid_call(
    gateway: Gateway,
    gateway_agent: GatewayAgentFactory,
    vllm_tool_engine: Engine,
    api_key: CreatedApiKey,
    temperature: float,
) -> None:
    weather: Any = {"type": "function", "function": {"name": "get_weather"}}
    request = generate(
        "ref",
        TOOL_MODEL,
        content="Umbrella in Oslo?",
        max_tokens=200,
        want_ids=True,
        tools=[weather],
        temperature=temperature,
        seed=3,
    )
    reference, frames = await moved_by_a_kill(
        gateway, gateway_agent, vllm_tool_engine, api_key, request, after_tokens=30
    )  # inside the call's markup

    for stream in (frames, reference):
        assert "".join(f["content"] for f in stream if f["type"] == "delta") == TOOL_CALL_CONTENT
        (call,) = stream[-1]["tool_calls"]
        assert call["function"]["name"] == "get_weather"
        assert json.loads(call["function"]["arguments"]) == TOOL_CALL_ARGUMENTS
    assert text_of(frames) == text_of(reference) == vllm_tool_engine.decode(ids_of(reference))


async def kill_the_serving_one(agents: list[RunningAgent]) -> None:
    """Cut the links of the agent generating a stream now (kill -9, as the gateway sees it)."""
    (serving,) = [agent for agent in agents if agent.runtime.streams]
    cut_links(serving)


@pytest.mark.parametrize("surface", ["chat completions", "responses"])
async def test_an_sdk_stream_moved_by_a_kill_reads_as_one_unbroken_reply(
    gateway: Gateway,
    gateway_agent: GatewayAgentFactory,
    vllm_engine: Engine,
    api_key: CreatedApiKey,
    surface: str,
    openai_client: Callable[..., openai.AsyncOpenAI],
) -> None:
    """The official SDK's streams (SSE) through a kill mid-reply: the same JSON as an unmoved
    reply, every event once and in order, and the SDK's own stream reader satisfied."""
    agents = [
        await gateway_agent(model=TINY_MODEL, engine=vllm_engine),
        await gateway_agent(model=TINY_MODEL, engine=vllm_engine, imds_url="http://127.0.0.1:9"),
    ]
    client = openai_client(base_url=f"{gateway.url}/v1", api_key=api_key.api_key, max_retries=0)
    deltas: list[str] = []
    if surface == "chat completions":
        asked: Any = {
            "model": TINY_MODEL,
            "messages": [{"role": "user", "content": "List words"}],
            "max_tokens": 600,
            "temperature": 0,
            "response_format": STRUCTURED,
        }
        unmoved = (await client.chat.completions.create(**asked)).choices[0].message.content
        finishes = []
        async for chunk in await client.chat.completions.create(**asked, stream=True):
            deltas.append(chunk.choices[0].delta.content or "")
            finishes.append(chunk.choices[0].finish_reason)
            if len(deltas) == 20:
                await kill_the_serving_one(agents)
        assert [reason for reason in finishes if reason] == ["stop"]
        moved = "".join(deltas)
    else:
        asked = {
            "model": TINY_MODEL,
            "input": "List words",
            "max_output_tokens": 600,
            "temperature": 0,
            "text": {"format": {"type": "json_schema", "name": "words", "schema": WORDS_SCHEMA}},
        }
        unmoved = (await client.responses.create(**asked)).output_text
        async with client.responses.stream(**asked) as events:
            sequence = []
            async for event in events:
                sequence.append(event.sequence_number)
                if event.type == "response.output_text.delta":
                    deltas.append(event.delta)
                    if len(deltas) == 20:
                        await kill_the_serving_one(agents)
            final = await events.get_final_response()
        assert sequence == list(range(len(sequence)))  # none lost, none repeated
        assert final.status == "completed"
        assert final.output_text == "".join(deltas)
        moved = final.output_text

    assert moved == unmoved
    jsonschema.validate(json.loads(moved), WORDS_SCHEMA)
    assert all(agent.runtime.streams == {} for agent in agents)


@pytest.mark.parametrize(
    "after_tokens", [8, 26], ids=["killed inside the thinking", "killed inside the answer"]
)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
async def test_a_reasoning_models_thinking_and_answer_stay_apart_exactly_across_a_kill(
    gateway: Gateway,
    gateway_agent: GatewayAgentFactory,
    vllm_reasoning_engine: Engine,
    api_key: CreatedApiKey,
    after_tokens: int,
    temperature: float,
) -> None:
    request = generate(
        "ref",
        REASONING_MODEL,
        content="Umbrella in Oslo?",
        max_tokens=100,
        want_ids=True,
        temperature=temperature,
        seed=5,
    )
    reference, frames = await moved_by_a_kill(
        gateway, gateway_agent, vllm_reasoning_engine, api_key, request, after_tokens
    )

    for stream in (frames, reference):
        deltas = [frame for frame in stream if frame["type"] == "delta"]
        assert "".join(frame["reasoning"] for frame in deltas) == REASONING_THINKING
        assert "".join(frame["content"] for frame in deltas) == REASONING_ANSWER
        assert stream[-1]["usage"]["reasoning_tokens"] == REASONING_THINKING_TOKENS
    moved_at = next(i for i, f in enumerate(frames) if f["type"] == "start" and i > 0)
    before = [f for f in frames[:moved_at] if f["type"] == "delta"]
    thought_before = "".join(f["reasoning"] for f in before)
    answered_before = "".join(f["content"] for f in before)
    # The move fell where the test meant it: inside the thinking, or inside the answer.
    assert (answered_before == "") == (after_tokens == 8), (thought_before, answered_before)
    assert text_of(frames) == text_of(reference) == REASONING_REPLY


async def test_a_stream_with_an_adapter_moved_by_a_kill_goes_on_under_the_same_adapter(
    gateway: Gateway,
    gateway_agent: GatewayAgentFactory,
    vllm_lora_engine: Engine,
    api_key: CreatedApiKey,
) -> None:
    adapted = f"{LORA_MODEL}:a2"
    request = generate(
        "ref", adapted, content="List words", max_tokens=60, want_ids=True, temperature=0
    )
    reference, frames = await moved_by_a_kill(
        gateway, gateway_agent, vllm_lora_engine, api_key, request, after_tokens=20
    )
    async with connect(gateway.ws_url, api_key.api_key) as ws:
        base = (await run_streams(ws, {**request, "model": LORA_MODEL}))["ref"]

    assert ids_of(frames) == ids_of(reference)  # the new agent went on with a2's weights
    assert text_of(frames) == text_of(reference)
    assert ids_of(reference)[:20] != ids_of(base)[:20]  # which are not the model's own
