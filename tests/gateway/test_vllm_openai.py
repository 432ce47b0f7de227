"""OpenAI's output-shaping fields on real vLLM through the gateway, asked by the official SDK."""

from __future__ import annotations

import asyncio
import json
import os
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Literal

import jsonschema
import openai
import pytest
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, ConfigDict, Field
from transformers import AutoTokenizer

from gpu_agent.engine import Engine
from spotgate.registry import CreatedApiKey
from tests.gateway.conftest import Gateway, GatewayAgentFactory
from tests.support.agents import (
    LORA_ADAPTERS,
    LORA_MODEL,
    REASONING_ANSWER,
    REASONING_MODEL,
    REASONING_REPLY,
    REASONING_THINKING,
    REASONING_THINKING_TOKENS,
    TINY_MODEL,
    TOOL_CALL_ARGUMENTS,
    TOOL_CALL_CONTENT,
    TOOL_CALL_REPLY,
    TOOL_MODEL,
)
from tests.support.wsclient import connect, generate, ids_of, run_streams

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("engines_for_the_next_test")]

MESSAGES: Any = [{"role": "user", "content": "Describe the weather as JSON"}]


class Weather(BaseModel):
    """What the SDK's `parse` asks for: its JSON schema goes out as a strict `json_schema`."""

    model_config = ConfigDict(extra="forbid")
    sky: Literal["clear", "cloudy", "rain"]
    windy: bool
    celsius: int = Field(ge=-40, le=50)


SdkClient = Callable[[str, Engine], Awaitable[openai.AsyncOpenAI]]


@pytest.fixture
def sdk_client(
    gateway: Gateway,
    gateway_agent: GatewayAgentFactory,
    api_key: CreatedApiKey,
    openai_client: Callable[..., openai.AsyncOpenAI],
) -> SdkClient:
    """The official SDK's client of the gateway, once an agent serves `model` on `engine`."""

    async def start(model: str, engine: Engine) -> openai.AsyncOpenAI:
        await gateway_agent(model=model, engine=engine)
        return openai_client(base_url=f"{gateway.url}/v1", api_key=api_key.api_key, max_retries=0)

    return start


@pytest.fixture
async def client(sdk_client: SdkClient, vllm_engine: Engine) -> openai.AsyncOpenAI:
    return await sdk_client(TINY_MODEL, vllm_engine)


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_the_sdks_parse_gets_a_reply_of_its_schema(
    client: openai.AsyncOpenAI, seed: int
) -> None:
    # Sampled, not greedy: whatever a random-weight model picks, the grammar keeps it valid.
    reply = await client.chat.completions.parse(
        model=TINY_MODEL,
        messages=MESSAGES,
        response_format=Weather,
        max_completion_tokens=64,
        temperature=1.0,
        seed=seed,
    )

    message = reply.choices[0].message
    assert reply.choices[0].finish_reason == "stop"
    assert isinstance(message.parsed, Weather)
    assert message.content == message.parsed.model_dump_json()  # compact, nothing else


async def test_json_object_replies_are_json_objects(client: openai.AsyncOpenAI) -> None:
    chunks = [
        chunk.choices[0].delta.content or ""
        async for chunk in await client.chat.completions.create(
            model=TINY_MODEL,
            messages=MESSAGES,
            response_format={"type": "json_object"},
            max_tokens=400,
            temperature=0,
            stream=True,
        )
        if chunk.choices
    ]

    assert isinstance(json.loads("".join(chunks)), dict)


async def test_chat_logprobs_cover_every_token_streamed_or_not(client: openai.AsyncOpenAI) -> None:
    asked: Any = {
        "model": TINY_MODEL,
        "messages": MESSAGES,
        "max_tokens": 12,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 3,
    }
    whole = await client.chat.completions.create(**asked)
    streamed = [
        entry
        async for chunk in await client.chat.completions.create(**asked, stream=True)
        if chunk.choices and chunk.choices[0].logprobs
        for entry in chunk.choices[0].logprobs.content or ()
    ]

    entries = whole.choices[0].logprobs.content  # type: ignore[union-attr]
    assert entries is not None
    assert len(entries) == len(streamed) == 12
    for entry in entries:
        assert len(entry.top_logprobs) == 3
        # Greedy: the chosen token is the most likely one.
        assert entry.top_logprobs[0].token == entry.token
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob)
    joined = b"".join(bytes(entry.bytes or ()) for entry in entries)
    assert joined.decode(errors="replace") == whole.choices[0].message.content
    assert [e.token for e in streamed] == [e.token for e in entries]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in entries], abs=1e-4)


async def test_text_completion_logprobs_in_openais_legacy_shape(
    client: openai.AsyncOpenAI,
) -> None:
    reply = await client.completions.create(
        model=TINY_MODEL, prompt="The weather", max_tokens=8, temperature=0, logprobs=2
    )

    logprobs = reply.choices[0].logprobs
    assert logprobs is not None
    assert logprobs.tokens is not None
    assert len(logprobs.tokens) == 8
    assert logprobs.top_logprobs is not None
    assert all(len(top) <= 2 for top in logprobs.top_logprobs)
    offsets = [0]
    for token in logprobs.tokens[:-1]:
        offsets.append(offsets[-1] + len(token))
    assert logprobs.text_offset == offsets


async def test_penalties_and_logit_bias_reach_the_engine(
    gateway: Gateway, client: openai.AsyncOpenAI, api_key: CreatedApiKey
) -> None:
    greedy = generate("plain", TINY_MODEL, max_tokens=64, temperature=0, want_ids=True)
    async with connect(gateway.ws_url, api_key.api_key) as ws:
        plain = ids_of((await run_streams(ws, greedy))["plain"])
        penalised = ids_of(
            (await run_streams(ws, {**greedy, "id": "p", "frequency_penalty": 2.0}))["p"]
        )
        banned = plain[0]
        biased = ids_of(
            (await run_streams(ws, {**greedy, "id": "b", "logit_bias": {str(banned): -100}}))["b"]
        )

    assert max(Counter(penalised).values()) < max(Counter(plain).values())
    assert banned not in biased
    # The SDK sends the same fields; the gateway accepts them.
    reply = await client.chat.completions.create(
        model=TINY_MODEL,
        messages=MESSAGES,
        max_tokens=4,
        presence_penalty=0.5,
        frequency_penalty=0.5,
        logit_bias={str(banned): -100},
    )
    assert reply.usage is not None
    assert reply.usage.completion_tokens == 4


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "nonsense"}},
                }
            },
            "schema",
        ),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"logit_bias": {"ten": 1}}, "logit_bias"),
        ({"logit_bias": {"999999": 1}}, "logit_bias"),
        ({"presence_penalty": 3}, "presence_penalty"),
        ({"response_format": {"type": "xml"}}, "response_format"),
    ],
)
@pytest.mark.parametrize("stream", [False, True])  # streamed: what vLLM refuses comes first
async def test_bad_fields_are_400s_that_name_them(
    client: openai.AsyncOpenAI, fields: dict[str, Any], named: str, stream: bool
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        await client.chat.completions.create(
            model=TINY_MODEL, messages=MESSAGES, max_tokens=4, stream=stream, extra_body=fields
        )

    assert named in refused.value.message


def langchain_llm(
    gateway: Gateway, api_key: CreatedApiKey, model: str = TINY_MODEL, **settings: Any
) -> ChatOpenAI:
    """LangChain's `ChatOpenAI` pointed at the gateway, greedy."""
    return ChatOpenAI(
        model=model,
        base_url=f"{gateway.url}/v1",
        api_key=api_key.api_key,  # type: ignore[arg-type]
        max_retries=0,
        temperature=0,
        **settings,
    )


async def test_langchain_chat_openai_invokes_streams_and_structures(
    gateway: Gateway, client: openai.AsyncOpenAI, api_key: CreatedApiKey
) -> None:
    llm = langchain_llm(gateway, api_key, max_completion_tokens=64)
    whole = await llm.ainvoke("Describe the weather")
    streamed = "".join([str(chunk.content) async for chunk in llm.astream("Describe the weather")])
    weather = await llm.with_structured_output(Weather, method="json_schema").ainvoke(
        "Describe the weather"
    )
    with_logprobs = await llm.bind(logprobs=True).ainvoke("Describe the weather")

    assert whole.content
    assert streamed == whole.content
    assert isinstance(weather, Weather)
    assert len(with_logprobs.response_metadata["logprobs"]["content"]) == 64


LITELLM_PYTHON = Path(__file__).parents[2] / ".bench/litellm/bin/python"
LITELLM_CLIENT = Path(__file__).parents[1] / "support/litellm_client.py"


async def litellm_replies(*requests: dict[str, Any]) -> list[Any]:
    """What LiteLLM's SDK (its own virtualenv, run by `make`) got for each request, sent at once."""
    assert LITELLM_PYTHON.exists(), "LiteLLM's virtualenv is missing: run `make test`"
    process = await asyncio.create_subprocess_exec(
        str(LITELLM_PYTHON),
        str(LITELLM_CLIENT),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
    )
    out, err = await process.communicate(json.dumps(requests).encode())
    assert process.returncode == 0, err.decode()[-3000:]
    return json.loads(out)


async def test_litellms_sdk_as_a_client(
    gateway: Gateway, client: openai.AsyncOpenAI, api_key: CreatedApiKey
) -> None:
    through = {
        "model": f"openai/{TINY_MODEL}",
        "api_base": f"{gateway.url}/v1",
        "api_key": api_key.api_key,
        "messages": MESSAGES,
        "temperature": 0,
        "max_tokens": 48,
    }
    schema = {"name": "weather", "schema": Weather.model_json_schema(), "strict": True}
    whole, streamed, structured = await litellm_replies(
        {**through, "logprobs": True, "top_logprobs": 2},
        {**through, "stream": True},
        {**through, "response_format": {"type": "json_schema", "json_schema": schema}},
    )

    content = whole["choices"][0]["message"]["content"]
    assert content
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in streamed) == content
    assert len(whole["choices"][0]["logprobs"]["content"]) == 48
    Weather.model_validate_json(structured["choices"][0]["message"]["content"])


WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME_PARAMETERS = {
    "type": "object",
    "properties": {"utc": {"type": "boolean"}},
    "required": ["utc"],
    "additionalProperties": False,
}
TOOLS: Any = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_PARAMETERS}},
    {"type": "function", "function": {"name": "get_time", "parameters": TIME_PARAMETERS}},
]
ASKED_TOOLS: Any = {
    "model": TINY_MODEL,
    "messages": [{"role": "user", "content": "Weather in Oslo?"}],
    "tools": TOOLS,
    "max_tokens": 200,
    "temperature": 0,
}


async def test_a_named_tool_choice_is_a_call_of_that_tool_streamed_or_not(
    client: openai.AsyncOpenAI,
) -> None:
    named: Any = {"type": "function", "function": {"name": "get_weather"}}
    whole = await client.chat.completions.create(**ASKED_TOOLS, tool_choice=named)
    chunks = [
        chunk
        async for chunk in await client.chat.completions.create(
            **ASKED_TOOLS, tool_choice=named, stream=True
        )
    ]

    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls or ()
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    jsonschema.validate(json.loads(call.function.arguments), WEATHER_PARAMETERS)  # type: ignore[union-attr]
    deltas = [c.choices[0].delta for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    opening = deltas[0].tool_calls[0]  # type: ignore[index]
    assert opening.id
    assert opening.function.name == "get_weather"  # type: ignore[union-attr]
    streamed = "".join(
        d.tool_calls[0].function.arguments or ""
        for d in deltas  # type: ignore[index,union-attr]
    )
    assert streamed == call.function.arguments  # type: ignore[union-attr]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize("stream", [False, True])
async def test_required_tool_choice_calls_one_of_the_tools(
    client: openai.AsyncOpenAI, stream: bool
) -> None:
    asked = {**ASKED_TOOLS, "tool_choice": "required", "parallel_tool_calls": False}
    if stream:
        calls = [
            call
            async for chunk in await client.chat.completions.create(**asked, stream=True)
            if chunk.choices and chunk.choices[0].delta.tool_calls
            for call in chunk.choices[0].delta.tool_calls
        ]
    else:
        reply = await client.chat.completions.create(**asked)
        assert reply.choices[0].finish_reason == "tool_calls"
        calls = list(reply.choices[0].message.tool_calls or ())  # type: ignore[arg-type]

    (call,) = calls
    parameters = {"get_weather": WEATHER_PARAMETERS, "get_time": TIME_PARAMETERS}
    jsonschema.validate(json.loads(call.function.arguments), parameters[call.function.name])  # type: ignore[union-attr]


async def test_a_tool_result_goes_back_to_the_model(client: openai.AsyncOpenAI) -> None:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city":"Oslo","unit":"celsius"}'},
    }
    history: Any = [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"celsius": 4}'},
    ]
    answer = await client.chat.completions.create(
        model=TINY_MODEL, messages=history, tools=TOOLS, tool_choice="none", max_tokens=8
    )

    assert answer.choices[0].message.content
    assert answer.choices[0].message.tool_calls is None


async def test_auto_on_a_model_served_without_a_tool_call_parser_is_refused_by_name(
    client: openai.AsyncOpenAI,
) -> None:
    with pytest.raises(openai.BadRequestError, match="TOOL_CALL_PARSER") as refused:
        await client.chat.completions.create(**ASKED_TOOLS)

    assert refused.value.param == "tool_choice"


TAUGHT_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather forecast for a city",
        "parameters": {
            **WEATHER_PARAMETERS,
            "properties": {**WEATHER_PARAMETERS["properties"], "note": {"type": "string"}},
        },
    },
}
"""The tool the tool model calls of its own accord (see `TOOL_CALL_REPLY`)."""
ASKED_AUTO: Any = {
    "model": TOOL_MODEL,
    "messages": [{"role": "user", "content": "Should I take an umbrella in Oslo?"}],
    "tools": [TAUGHT_TOOL, TOOLS[1]],
    "max_tokens": 200,
}


@pytest.fixture
async def tool_client(sdk_client: SdkClient, vllm_tool_engine: Engine) -> openai.AsyncOpenAI:
    return await sdk_client(TOOL_MODEL, vllm_tool_engine)


def assert_the_taught_call(call: Any) -> None:
    assert call.type == "function"
    assert call.id
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == TOOL_CALL_ARGUMENTS
    jsonschema.validate(json.loads(call.function.arguments), TAUGHT_TOOL["function"]["parameters"])


async def test_a_tool_the_model_calls_of_its_own_accord_whole(
    tool_client: openai.AsyncOpenAI,
) -> None:
    # Sampled at the SDK's default temperature, as a client that sets none gets it.
    reply = await tool_client.chat.completions.create(**ASKED_AUTO)

    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == TOOL_CALL_CONTENT  # the markup is not content
    (call,) = choice.message.tool_calls or ()
    assert_the_taught_call(call)


async def test_a_tool_the_model_calls_of_its_own_accord_streamed(
    tool_client: openai.AsyncOpenAI,
) -> None:
    chunks = [
        chunk
        async for chunk in await tool_client.chat.completions.create(
            **ASKED_AUTO, tool_choice="auto", temperature=0, stream=True
        )
        if chunk.choices
    ]

    content = [chunk.choices[0].delta.content or "" for chunk in chunks]
    assert "".join(content) == TOOL_CALL_CONTENT
    assert len([text for text in content if text]) > 1  # content streams as it comes
    (call,) = [c for chunk in chunks for c in chunk.choices[0].delta.tool_calls or ()]
    assert call.index == 0
    assert_the_taught_call(call)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


async def test_langchain_binds_tools_and_the_model_picks_one(
    gateway: Gateway, tool_client: openai.AsyncOpenAI, api_key: CreatedApiKey
) -> None:
    llm = langchain_llm(gateway, api_key, model=TOOL_MODEL, max_completion_tokens=200)
    reply = await llm.bind_tools([TAUGHT_TOOL, TOOLS[1]]).ainvoke("Umbrella in Oslo?")

    (call,) = reply.tool_calls  # type: ignore[attr-defined]
    assert call["name"] == "get_weather"
    assert call["args"] == TOOL_CALL_ARGUMENTS
    assert reply.content == TOOL_CALL_CONTENT


async def test_the_responses_api_reports_a_call_the_model_chose(
    tool_client: openai.AsyncOpenAI,
) -> None:
    tool: Any = {"type": "function", **TAUGHT_TOOL["function"]}
    asked: Any = {"model": TOOL_MODEL, "input": "Umbrella?", "tools": [tool], "temperature": 0}
    whole = await tool_client.responses.create(**asked)
    async with tool_client.responses.stream(**asked) as streaming:
        final = await streaming.get_final_response()

    for response in (whole, final):
        message, call = response.output
        assert message.type == "message"
        assert response.output_text == TOOL_CALL_CONTENT
        assert call.type == "function_call"
        assert call.name == "get_weather"
        assert json.loads(call.arguments) == TOOL_CALL_ARGUMENTS


async def test_langchain_binds_a_tool_and_gets_its_call(
    gateway: Gateway, client: openai.AsyncOpenAI, api_key: CreatedApiKey
) -> None:
    llm = langchain_llm(gateway, api_key, max_completion_tokens=200)
    reply = await llm.bind_tools(TOOLS, tool_choice="get_weather").ainvoke("Weather in Oslo?")

    (call,) = reply.tool_calls  # type: ignore[attr-defined]
    assert call["name"] == "get_weather"
    jsonschema.validate(call["args"], WEATHER_PARAMETERS)


async def test_the_responses_api_text_streamed_and_whole(client: openai.AsyncOpenAI) -> None:
    asked: Any = {
        "model": TINY_MODEL,
        "instructions": "Answer briefly.",
        "input": "Describe the weather",
        "max_output_tokens": 24,
        "temperature": 0,
    }
    whole = await client.responses.create(**asked)
    events = [event async for event in await client.responses.create(**asked, stream=True)]
    async with client.responses.stream(**asked) as streaming:
        shown = [event async for event in streaming]

    assert whole.status == "incomplete"  # cut by max_output_tokens, as OpenAI reports it
    assert whole.incomplete_details is not None
    assert whole.incomplete_details.reason == "max_output_tokens"
    assert whole.usage is not None
    assert whole.usage.output_tokens == 24
    assert whole.output_text
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == whole.output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created"
    assert events[-1].type == "response.incomplete"  # as OpenAI's API ends a cut reply
    assert events[-1].response.status == "incomplete"
    assert shown[-1].type == "response.incomplete"  # the SDK's helper parses it


async def test_the_responses_api_calls_a_function_and_takes_its_output(
    client: openai.AsyncOpenAI,
) -> None:
    tool: Any = {"type": "function", "name": "get_weather", "parameters": WEATHER_PARAMETERS}
    called = await client.responses.create(
        model=TINY_MODEL,
        input="Weather in Oslo?",
        tools=[tool],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=200,
    )
    (call,) = called.output
    assert call.type == "function_call"
    jsonschema.validate(json.loads(call.arguments), WEATHER_PARAMETERS)
    answered = await client.responses.create(
        model=TINY_MODEL,
        input=[
            {"role": "user", "content": "Weather in Oslo?"},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": "4 C"},
        ],
        tools=[tool],
        tool_choice="none",
        max_output_tokens=8,
    )
    assert answered.output_text


async def test_the_responses_api_parses_into_a_schema(client: openai.AsyncOpenAI) -> None:
    parsed = await client.responses.parse(
        model=TINY_MODEL,
        input="Describe the weather",
        text_format=Weather,
        max_output_tokens=64,
        temperature=1.0,
    )

    assert isinstance(parsed.output_parsed, Weather)


async def test_the_responses_api_is_stateless_and_says_so(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="not stored"):
        await client.responses.create(
            model=TINY_MODEL, input="Hi", previous_response_id="resp_123", max_output_tokens=4
        )


async def test_vllms_own_sampling_fields_reach_the_engine(tool_client: openai.AsyncOpenAI) -> None:
    """The tool model ends its one taught reply with end-of-sequence, greedy or not."""
    asked: Any = {
        "model": TOOL_MODEL,
        "messages": [{"role": "user", "content": "Umbrella?"}],
        "max_tokens": 200,
    }
    taught = await tool_client.chat.completions.create(**asked, temperature=0)
    assert (taught.choices[0].message.content, taught.choices[0].finish_reason) == (
        TOOL_CALL_REPLY,
        "stop",
    )
    assert taught.usage is not None
    length = taught.usage.completion_tokens

    async def reply(**extra: Any) -> Any:
        return await tool_client.chat.completions.create(**asked, extra_body=extra)

    past_eos = await reply(ignore_eos=True, temperature=0)
    assert (past_eos.usage.completion_tokens, past_eos.choices[0].finish_reason) == (200, "length")
    assert past_eos.choices[0].message.content.startswith(TOOL_CALL_REPLY)
    at_least = await reply(min_tokens=length + 5, temperature=0)
    assert at_least.usage.completion_tokens >= length + 5
    only_likeliest = await reply(top_k=1, temperature=1.5)  # top_k 1: greedy at any temperature
    assert only_likeliest.choices[0].message.content == TOOL_CALL_REPLY
    penalised = await reply(repetition_penalty=2.0, temperature=0)
    assert penalised.choices[0].message.content != TOOL_CALL_REPLY
    with pytest.raises(openai.BadRequestError) as refused:
        await reply(best_of=3)
    assert refused.value.body["param"] == "best_of"  # type: ignore[index]


@pytest.mark.parametrize(
    ("backend", "endpoint"),
    [("openai-chat", "/v1/chat/completions"), ("openai", "/v1/completions")],
)
async def test_vllms_own_benchmark_client_gets_every_request_served(
    gateway: Gateway,
    tool_client: openai.AsyncOpenAI,
    api_key: CreatedApiKey,
    tool_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    backend: str,
    endpoint: str,
) -> None:
    """`vllm bench serve` as its users run it: its random prompts on a real tokenizer (Qwen3's),
    its request shapes (chat content as an array of parts, `ignore_eos`), its SSE parser."""
    from vllm.benchmarks.serve import add_cli_args, main_async
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    monkeypatch.setenv("OPENAI_API_KEY", api_key.api_key)  # how it sends a bearer key
    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args(
        ["--backend", backend, "--base-url", gateway.url, "--endpoint", endpoint,
         "--model", TOOL_MODEL, "--tokenizer", str(tool_model_dir),
         "--dataset-name", "random", "--random-input-len", "48", "--random-output-len", "16",
         "--num-prompts", "40", "--max-concurrency", "8", "--seed", "0", "--disable-tqdm"]
    )  # fmt: skip

    result = await main_async(args)

    assert (result["completed"], result["failed"]) == (40, 0), set(result["errors"])
    assert result["total_output_tokens"] == 40 * 16  # every stream whole, to its last token


ASKED_TO_THINK: Any = {
    "model": REASONING_MODEL,
    "messages": [{"role": "user", "content": "Should I take an umbrella in Oslo?"}],
    "max_tokens": 100,
}


@pytest.fixture
async def reasoning_client(
    sdk_client: SdkClient, vllm_reasoning_engine: Engine
) -> openai.AsyncOpenAI:
    return await sdk_client(REASONING_MODEL, vllm_reasoning_engine)


async def test_a_reasoning_models_thinking_is_reasoning_content_whole_and_streamed(
    reasoning_client: openai.AsyncOpenAI,
) -> None:
    whole = await reasoning_client.chat.completions.create(**ASKED_TO_THINK)
    chunks = [
        chunk
        async for chunk in await reasoning_client.chat.completions.create(
            **ASKED_TO_THINK, stream=True, stream_options={"include_usage": True}
        )
    ]

    message = whole.choices[0].message
    assert (message.model_extra or {}).get("reasoning_content") == REASONING_THINKING, message
    assert message.content == REASONING_ANSWER
    assert whole.usage is not None
    assert whole.usage.completion_tokens_details is not None
    assert whole.usage.completion_tokens_details.reasoning_tokens == REASONING_THINKING_TOKENS
    deltas = [chunk.choices[0].delta for chunk in chunks if chunk.choices]
    thinking = [(delta.model_extra or {}).get("reasoning_content") or "" for delta in deltas]
    assert "".join(thinking) == REASONING_THINKING
    assert len([part for part in thinking if part]) > 1  # the thinking streams as it comes
    assert "".join(delta.content or "" for delta in deltas) == REASONING_ANSWER
    usage = chunks[-1].usage
    assert usage is not None
    assert usage.completion_tokens_details is not None
    assert usage.completion_tokens_details.reasoning_tokens == REASONING_THINKING_TOKENS


async def assert_a_completion_is_the_whole_output(
    client: openai.AsyncOpenAI, model: str, model_dir: Path, asked: dict[str, Any], whole: str
) -> None:
    """`/v1/completions` on a prompt the model answers with `whole`: `whole`, markup and all.

    The legacy endpoint has no reasoning or tool-call fields: whatever parsers the model is
    served with, every chunk carries `text` (a string) and the text is the model's whole
    output, as `vllm serve` gives it.
    """
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompt = tokenizer.apply_chat_template(
        asked["messages"], tools=asked.get("tools"), add_generation_prompt=True, tokenize=False
    )
    request: Any = {"model": model, "prompt": prompt, "max_tokens": 200, "temperature": 0}
    reply = await client.completions.create(**request)
    chunks = [chunk async for chunk in await client.completions.create(**request, stream=True)]

    assert reply.choices[0].text == whole
    assert reply.choices[0].finish_reason == "stop"
    assert not reply.choices[0].model_extra
    texts = [chunk.choices[0].text for chunk in chunks if chunk.choices]
    assert all(isinstance(text, str) for text in texts), texts
    assert "".join(texts) == whole
    assert not any(chunk.choices[0].model_extra for chunk in chunks if chunk.choices)


async def test_a_completion_of_a_reasoning_model_is_its_thinking_and_answer_as_text(
    reasoning_client: openai.AsyncOpenAI, reasoning_model_dir: Path
) -> None:
    await assert_a_completion_is_the_whole_output(
        reasoning_client, REASONING_MODEL, reasoning_model_dir, ASKED_TO_THINK, REASONING_REPLY
    )


async def test_a_completion_of_a_tool_calling_model_is_its_call_markup_as_text(
    tool_client: openai.AsyncOpenAI, tool_model_dir: Path
) -> None:
    await assert_a_completion_is_the_whole_output(
        tool_client, TOOL_MODEL, tool_model_dir, ASKED_AUTO, TOOL_CALL_REPLY
    )


@pytest.mark.parametrize(
    "switch",
    [
        {"reasoning_effort": "none"},
        {"extra_body": {"chat_template_kwargs": {"enable_thinking": False}}},
    ],
    ids=["reasoning_effort none", "enable_thinking false"],
)
async def test_thinking_turned_off_in_the_template_leaves_all_of_the_reply_content(
    reasoning_client: openai.AsyncOpenAI, switch: dict[str, Any]
) -> None:
    reply = await reasoning_client.chat.completions.create(**ASKED_TO_THINK, **switch)

    message = reply.choices[0].message
    assert "reasoning_content" not in (message.model_extra or {})
    assert message.content  # whatever the model wrote after the closed tags: its answer
    assert reply.usage is not None
    assert reply.usage.completion_tokens_details is not None
    assert reply.usage.completion_tokens_details.reasoning_tokens == 0


async def test_a_turns_thinking_sent_back_reaches_the_template(
    reasoning_client: openai.AsyncOpenAI,
) -> None:
    earlier: Any = [
        {"role": "user", "content": "Umbrella?"},
        {"role": "assistant", "content": "Yes.", "reasoning_content": "Rain is forecast."},
        {"role": "user", "content": "And tomorrow?"},
    ]
    reply = await reasoning_client.chat.completions.create(
        model=REASONING_MODEL, messages=earlier, max_tokens=40
    )
    assert reply.choices[0].message.content == REASONING_ANSWER


async def test_the_responses_api_gives_the_thinking_as_a_reasoning_item(
    reasoning_client: openai.AsyncOpenAI,
) -> None:
    asked: Any = {
        "model": REASONING_MODEL,
        "input": "Umbrella in Oslo?",
        "max_output_tokens": 100,
        "reasoning": {"effort": "high"},
    }
    whole = await reasoning_client.responses.create(**asked)
    async with reasoning_client.responses.stream(**asked) as events:
        kinds = []
        thinking = []
        async for event in events:
            kinds.append(event.type)
            if event.type == "response.reasoning_text.delta":
                thinking.append(event.delta)
        final = await events.get_final_response()

    for response in (whole, final):
        reasoning, message = response.output
        assert reasoning.type == "reasoning"
        assert [part.text for part in reasoning.content or ()] == [REASONING_THINKING]
        assert message.type == "message"
        assert response.output_text == REASONING_ANSWER
        assert response.usage is not None
        assert response.usage.output_tokens_details.reasoning_tokens == REASONING_THINKING_TOKENS
    assert "".join(thinking) == REASONING_THINKING
    # The reasoning item closes before the message opens, as OpenAI's and vLLM's streams do.
    assert kinds.index("response.output_item.done") < kinds.index("response.output_text.delta")
    # Sent back as input (a conversation the client keeps), the reasoning item is taken.
    follow_up: Any = [*whole.output, {"role": "user", "content": "Thanks!"}]
    again = await reasoning_client.responses.create(
        model=REASONING_MODEL, input=follow_up, max_output_tokens=100
    )
    assert again.output_text == REASONING_ANSWER


@pytest.fixture
async def lora_client(sdk_client: SdkClient, vllm_lora_engine: Engine) -> openai.AsyncOpenAI:
    return await sdk_client(LORA_MODEL, vllm_lora_engine)


async def greedy_reply(client: openai.AsyncOpenAI, model: str) -> str:
    reply = await client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=24, temperature=0
    )
    return reply.choices[0].message.content or ""


async def test_an_adapter_named_in_the_model_changes_the_reply_alone_or_batched(
    lora_client: openai.AsyncOpenAI,
) -> None:
    names = [LORA_MODEL, f"{LORA_MODEL}:a1", f"{LORA_MODEL}:a2"]
    alone = {name: await greedy_reply(lora_client, name) for name in names}
    # Base and adapters in one batch, twice over: each gets its own weights' reply.
    batched = await asyncio.gather(*(greedy_reply(lora_client, name) for name in names * 2))

    assert len(set(alone.values())) == 3  # each adapter's weights change the reply
    assert batched == [alone[name] for name in names * 2]


async def test_more_adapters_than_slots_take_turns_and_each_stays_its_own(
    lora_client: openai.AsyncOpenAI,
) -> None:
    names = [f"{LORA_MODEL}:{adapter}" for adapter in LORA_ADAPTERS]  # one more than MAX_LORAS
    alone = {name: await greedy_reply(lora_client, name) for name in names}
    together = await asyncio.gather(*(greedy_reply(lora_client, name) for name in names))
    assert together == [alone[name] for name in names]


@pytest.mark.parametrize(
    ("model", "status", "says"),
    [
        (f"{LORA_MODEL}:nope", 404, "no adapter 'nope' of 'tiny-lora' is served here"),
        (f"{LORA_MODEL}:broken", 400, "adapter 'broken' could not be loaded"),
    ],
    ids=["unknown adapter", "adapter that cannot load"],
)
async def test_an_adapter_that_cannot_serve_is_a_clear_error_and_harms_no_other_stream(
    lora_client: openai.AsyncOpenAI, model: str, status: int, says: str
) -> None:
    with pytest.raises(openai.APIStatusError) as refused:
        await greedy_reply(lora_client, model)
    assert refused.value.status_code == status
    assert says in refused.value.message
    assert refused.value.body["param"] == "model"  # type: ignore[index]
    assert await greedy_reply(lora_client, f"{LORA_MODEL}:a1")  # the engine serves on
