"""The agent on real vLLM (CPU build here, CUDA on a GPU machine) and the tiny models.

The tests that say something about text run on two vocabularies: the built-in byte-level
one, and Llama-2's published SentencePiece tokenizer (byte fallback, no chat template).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import aiohttp
import openai
import psutil
import pytest

from gpu_agent.engine import Engine
from gpu_agent.vllm_engine import VllmEngine
from spotgate.model_store import cache_directory, stage_model
from spotgate.protocol import MAX_TOOLS, GenerateFrame
from spotgate.registry import AgentState, Registry, aws_session
from spotgate.settings import AgentSettings, SocketLimits
from spotgate.tokens import GATEWAY_SUBJECT_PREFIX, KeyRing, issue
from stack.emulator import AwsEmulator
from tests.support.agents import (
    ENGINE_BATCHED_TOKENS,
    ENGINE_KV_CACHE_BYTES,
    ISSUER,
    LLAMA2_MODEL,
    TINY_MODEL,
    TOOL_MODEL,
    AgentFactory,
    RunningAgent,
    vllm_settings,
    wait_for,
    wait_ready,
)
from tests.support.metrics import metric_value, scrape
from tests.support.wsclient import (
    Frame,
    connect,
    generate,
    ids_of,
    receive,
    run_streams,
    send,
    text_of,
)

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("engines_for_the_next_test")]

GREEDY = {"temperature": 0.0}


@pytest.fixture
async def agent(start_agent: AgentFactory, vllm_engine: Engine) -> RunningAgent:
    return await wait_ready(await start_agent(vllm_engine))


@dataclass
class Served:
    """An agent on one of the tiny models, and how to ask it for text."""

    agent: RunningAgent
    engine: Engine

    @property
    def model(self) -> str:
        return self.engine.model

    def request(self, stream_id: str, content: str) -> Frame:
        if self.model == LLAMA2_MODEL:  # a base model's tokenizer: no chat template
            return {"type": "generate", "id": stream_id, "model": self.model, "prompt": content}
        return generate(stream_id, self.model, content=content)

    def ask(self, stream_id: str, content: str = "Tell me about spot", **extra: Any) -> Frame:
        return self.request(stream_id, content) | extra


@pytest.fixture(params=[TINY_MODEL, LLAMA2_MODEL])
async def served(
    request: pytest.FixtureRequest,
    start_agent: AgentFactory,
    vllm_engine: Engine,
    vllm_llama2_engine: Engine,
) -> Served:
    engine = vllm_engine if request.param == TINY_MODEL else vllm_llama2_engine
    return Served(await wait_ready(await start_agent(engine)), engine)


def test_a_vllm_serve_flag_in_the_settings_reaches_the_engine(vllm_engine: Engine) -> None:
    config = vllm_engine._llm.vllm_config  # type: ignore[attr-defined]
    assert config.scheduler_config.max_num_batched_tokens == ENGINE_BATCHED_TOKENS
    # On a CPU too, where the backend's own variable would otherwise set the KV cache's size.
    assert config.cache_config.kv_cache_memory_bytes == ENGINE_KV_CACHE_BYTES


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


# Text no other test sends, so what they left in the shared engine's cache cannot match it.
SHARED_SYSTEM_PROMPT = "Prefix-cache probe. " + " ".join(
    f"Standing order {n}: answer the harbour master briefly." for n in range(12)
)
PREFIX_CACHE_SHARED_SHARE = 0.8
"""The least share of the first prompt the second one must find cached (in whole blocks)."""


async def prefix_cache_tokens(agent: RunningAgent) -> tuple[float, float]:
    """The agent's prefix-cache counters now: (queried tokens, hit tokens)."""
    exposition = await scrape(f"{agent.url}/metrics")
    return (
        metric_value(exposition, "spotgate_agent_prefix_cache_queried_tokens_total"),
        metric_value(exposition, "spotgate_agent_prefix_cache_hit_tokens_total"),
    )


async def prefix_cache_tokens_after(
    agent: RunningAgent, before: tuple[float, float], prompt_tokens: int
) -> tuple[float, float]:
    """The counters once a prompt's lookup is in them (vLLM reports stats after each step)."""

    async def counted() -> bool:
        return (await prefix_cache_tokens(agent))[0] >= before[0] + prompt_tokens

    await wait_for(counted)
    return await prefix_cache_tokens(agent)


async def test_a_repeated_prefix_counts_as_prefix_cache_hits(
    agent: RunningAgent, vllm_engine: VllmEngine, token: str
) -> None:
    # vLLM's KV block: 128 tokens on the CPU backend, 16 under CUDA; hits come in whole blocks.
    block_tokens = vllm_engine._llm.vllm_config.cache_config.block_size

    def chat(stream_id: str, question: str) -> Frame:
        messages = [
            {"role": "system", "content": SHARED_SYSTEM_PROMPT},
            {"role": "user", "content": question},
        ]
        return generate(stream_id, TINY_MODEL, messages=messages, max_tokens=4, **GREEDY)

    start = await prefix_cache_tokens(agent)
    async with connect(agent.ws_url, token) as ws:
        first = (await run_streams(ws, chat("first", "Where is berth four?")))["first"]
        first_tokens = first[-1]["usage"]["prompt_tokens"]
        after_first = await prefix_cache_tokens_after(agent, start, first_tokens)
        second = (await run_streams(ws, chat("second", "When does the ferry leave?")))["second"]
        second_tokens = second[-1]["usage"]["prompt_tokens"]
        end = await prefix_cache_tokens_after(agent, after_first, second_tokens)

    shared_blocks = int(PREFIX_CACHE_SHARED_SHARE * first_tokens) // block_tokens * block_tokens
    measured = {
        "block_tokens": block_tokens,
        "prompt_tokens": (first_tokens, second_tokens),
        "queried": (after_first[0] - start[0], end[0] - after_first[0]),
        "hits": (after_first[1] - start[1], end[1] - after_first[1]),
    }
    assert shared_blocks >= 2 * block_tokens, measured  # the shared prefix spans blocks
    assert measured["queried"] == (first_tokens, second_tokens), measured
    assert measured["hits"][0] < shared_blocks, measured  # the first prompt was new to it
    assert measured["hits"][1] >= shared_blocks, measured


def tenant_token(ring: KeyRing, subject: str, tenant: str | None = None) -> str:
    return issue(
        ring, subject=subject, issuer=ISSUER, now=time.time(), ttl_seconds=900, tenant=tenant
    ).token


async def test_the_prefix_cache_is_shared_within_a_tenant_and_never_across(
    agent: RunningAgent, vllm_engine: VllmEngine, ring: KeyRing
) -> None:
    block_tokens = vllm_engine._llm.vllm_config.cache_config.block_size
    system = "Tenant probe. " + " ".join(
        f"Rule {n}: the vault PIN is 4821, never say it." for n in range(16)
    )
    asked = iter(range(100))

    async def cache_hits(token: str, **frame: Any) -> int:
        """Prompt tokens of one request (the system prompt, a new question) found cached."""
        before = await prefix_cache_tokens(agent)
        stream_id = f"q{next(asked)}"
        messages = [
            {"role": "system", "content": system},
            {"role": "user", "content": f"Question {stream_id}?"},
        ]
        request = generate(stream_id, TINY_MODEL, messages=messages, max_tokens=2, **GREEDY)
        async with connect(agent.ws_url, token) as ws:
            frames = (await run_streams(ws, request | frame))[stream_id]
        assert frames[-1]["type"] == "done", frames
        prompt_tokens = frames[-1]["usage"]["prompt_tokens"]
        after = await prefix_cache_tokens_after(agent, before, prompt_tokens)
        return int(after[1] - before[1])

    gateway = tenant_token(ring, f"{GATEWAY_SUBJECT_PREFIX}gw-1")
    assert await cache_hits(tenant_token(ring, "key-a")) < block_tokens  # new to the agent
    shared = await cache_hits(tenant_token(ring, "key-a"))  # the same key: its system prompt
    assert shared >= 2 * block_tokens
    # Another key finds nothing, not even the first block: its KV is salted apart.
    assert await cache_hits(tenant_token(ring, "key-b")) == 0
    # Through a gateway the frame names the tenant: key A's streams find key A's cache.
    assert await cache_hits(gateway, tenant="key:key-a") == shared
    assert await cache_hits(gateway, tenant="key:key-c") == 0
    # Keys of one named tenant share it.
    assert await cache_hits(tenant_token(ring, "key-d", "acme")) == 0
    assert await cache_hits(tenant_token(ring, "key-e", "acme")) == shared
    # A client cannot name another tenant to reach its cache.
    async with connect(agent.ws_url, tenant_token(ring, "key-b")) as ws:
        request = generate("forged", TINY_MODEL, content="hi", max_tokens=2) | {
            "tenant": "key:key-a"
        }
        [refused] = (await run_streams(ws, request))["forged"]
    assert (refused["type"], refused["code"], refused["param"]) == (
        "error",
        "invalid_request",
        "tenant",
    )


PROMPTS = ("Tell me about spot", "Hello there", "日本語で答えて", "def add(a, b):")


async def test_streamed_text_is_the_decode_of_the_streamed_ids(served: Served, token: str) -> None:
    async with connect(served.agent.ws_url, token) as ws:
        replies = await run_streams(
            ws,
            *(
                served.ask(f"r{n}", prompt, max_tokens=96, want_ids=True, **GREEDY)
                for n, prompt in enumerate(PROMPTS)
            ),
        )

    for frames in replies.values():
        ids = ids_of(frames)
        assert len(ids) == 96
        assert text_of(frames) == served.engine.decode(ids)


async def test_the_bytes_of_a_replys_logprobs_join_to_its_utf8(served: Served, token: str) -> None:
    async with connect(served.agent.ws_url, token) as ws:
        replies = await run_streams(
            ws,
            *(
                served.ask(f"r{n}", prompt, max_tokens=200, logprobs=1, ignore_eos=True, **GREEDY)
                for n, prompt in enumerate(PROMPTS)
            ),
        )

    for frames in replies.values():
        entries = [entry for frame in frames for entry in frame.get("logprobs") or ()]
        joined = b"".join(bytes(entry["bytes"]) for entry in entries)
        reply = text_of(frames)
        assert len(entries) == 200
        if "\ufffd" not in reply:
            assert joined == reply.encode()
        else:  # bytes no character holds: decoders differ only in how many U+FFFD they write
            shown = joined.decode(errors="replace")
            assert shown.replace("\ufffd", "") == reply.replace("\ufffd", "")


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


@pytest.mark.parametrize("k", [1, 5, 17, 40, 63, 64])  # 64: all but the done
async def test_resumed_greedy_generation_continues_exactly(
    served: Served, token: str, k: int
) -> None:
    request = served.ask("full", max_tokens=64, want_ids=True, **GREEDY)
    async with connect(served.agent.ws_url, token) as ws:
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
    assert text == served.engine.decode(ids)
    assert ids[:count] + ids_of(rest) == ids
    assert sent + text_of(rest) == text
    assert rest[-1]["usage"]["completion_tokens"] == 64


async def test_a_request_vllm_refuses_as_it_adds_it_has_no_start_and_harms_no_other_stream(
    served: Served, token: str
) -> None:
    """vLLM validates a request as it is added: the agent's `start` comes only after that."""
    past_vocab = 1_000_000  # a bias on an id the model lacks: vLLM's own check, not ours
    request = served.ask("ok", max_tokens=8, **GREEDY)
    bad = served.ask("bad", max_tokens=8, logit_bias={str(past_vocab): 1.0}, **GREEDY)
    async with connect(served.agent.ws_url, token) as ws:
        seen = await run_streams(ws, bad, request)

    [refused] = seen["bad"]
    assert (refused["type"], refused["code"]) == ("error", "invalid_request")
    assert str(past_vocab) in refused["message"]
    assert seen["ok"][-1]["type"] == "done"
    assert served.engine.failure() is None
    assert served.engine.running() == 0


async def test_a_resume_with_ids_the_model_lacks_is_refused_and_harms_no_other_stream(
    served: Served, token: str
) -> None:
    """A client may send `resume`: an id past the embedding table must not reach the engine."""
    missing = 1_000_000  # the tiny models have some tens of thousands of tokens
    assert not served.engine.known_token(missing)
    assert served.engine.known_token(0)
    request = served.ask("ok", max_tokens=8, **GREEDY)
    bad = {
        **request,
        "id": "bad",
        "resume": {"token_ids": [missing], "text": "", "completion_tokens": 1},
    }
    async with connect(served.agent.ws_url, token) as ws:
        seen = await run_streams(ws, bad, request)
    assert seen["bad"][-1]["type"] == "error"
    assert seen["bad"][-1]["code"] == "invalid_request"
    assert seen["bad"][-1]["message"] == f"{missing} is not a token id of this model"
    assert seen["ok"][-1]["type"] == "done"  # the engine never saw it
    assert served.engine.failure() is None


async def test_openai_sdk_against_the_agent(
    agent: RunningAgent, token: str, openai_client: Callable[..., openai.AsyncOpenAI]
) -> None:
    client = openai_client(base_url=f"{agent.url}/v1", api_key=token, max_retries=0)
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

    with pytest.raises(openai.BadRequestError):
        await client.chat.completions.create(model=TINY_MODEL, messages=[], max_tokens=4)
    with pytest.raises(openai.AuthenticationError):
        await openai_client(
            base_url=f"{agent.url}/v1", api_key="not-a-token", max_retries=0
        ).chat.completions.create(model=TINY_MODEL, messages=messages, max_tokens=4)  # type: ignore[arg-type]


async def test_stop_strings_end_the_reply_before_them(served: Served, token: str) -> None:
    async with connect(served.agent.ws_url, token) as ws:
        whole = text_of((await run_streams(ws, served.ask("a", max_tokens=48, **GREEDY)))["a"])
        stop = whole[10:13]
        cut = (await run_streams(ws, served.ask("b", max_tokens=48, stop=[stop], **GREEDY)))["b"]

    assert text_of(cut) == whole[: whole.index(stop)]
    assert cut[-1]["finish_reason"] == "stop"


@pytest.mark.parametrize("moved_after", [12, 30])
async def test_a_stop_string_across_the_seam_of_a_moved_stream_is_honoured(
    served: Served, token: str, moved_after: int
) -> None:
    """Part of the stop string came from the first agent, the rest from the next one."""
    async with connect(served.agent.ws_url, token) as ws:
        reference = (await run_streams(ws, served.ask("ref", max_tokens=64, **GREEDY)))["ref"]
        whole = text_of(reference)
        # Where a client stands mid-stream with a 5-character stop string active: the frames
        # before the last (that one flushes the held-back text as the stream ends).
        unseen = "\x00\x01\x02\x03\x04"  # as long as the stop string below
        assert unseen not in whole
        first = (
            await run_streams(
                ws,
                served.ask("first", max_tokens=moved_after, stop=[unseen], want_ids=True, **GREEDY),
            )
        )["first"]
        before_move = [frame for frame in first if frame["type"] == "delta"][:-1]
        client_ids, client_text = ids_of(before_move), text_of(before_move)
        decoded = served.engine.decode(client_ids)  # the first agent had this much text
        assert len(client_text) < len(decoded)  # and held some back for the stop string
        stop = whole[len(decoded) - 2 : len(decoded) + 3]  # 2 characters before the move
        assert whole.index(stop) == len(decoded) - 2
        rest = (
            await run_streams(
                ws,
                served.ask(
                    "rest",
                    max_tokens=64,
                    stop=[stop],
                    want_ids=True,
                    resume={
                        "token_ids": client_ids,
                        "text": client_text,
                        "completion_tokens": len(client_ids),
                    },
                    **GREEDY,
                ),
            )
        )["rest"]

    assert client_text + text_of(rest) == whole[: whole.index(stop)]
    assert rest[-1]["finish_reason"] == "stop"


async def test_a_chat_to_a_model_without_a_chat_template_is_refused_clearly(
    start_agent: AgentFactory,
    vllm_llama2_engine: Engine,
    token: str,
    openai_client: Callable[..., openai.AsyncOpenAI],
) -> None:
    agent = await wait_ready(await start_agent(vllm_llama2_engine))
    async with connect(agent.ws_url, token) as ws:
        refused = (await run_streams(ws, generate("chat", LLAMA2_MODEL, max_tokens=4)))["chat"]
    client = openai_client(base_url=f"{agent.url}/v1", api_key=token, max_retries=0)
    with pytest.raises(openai.BadRequestError) as http_refusal:
        await client.chat.completions.create(
            model=LLAMA2_MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )

    assert refused[-1]["type"] == "error"
    assert refused[-1]["code"] == "invalid_request"
    assert "no chat template" in refused[-1]["message"]
    assert "no chat template" in http_refusal.value.message


async def test_the_context_bounds_the_reply_and_refuses_what_cannot_fit(
    served: Served, token: str
) -> None:
    max_model_len = served.engine.max_model_len
    async with connect(served.agent.ws_url, token) as ws:
        long_prompt = "spot " * 1000  # about 1000-2000 tokens of the 2048
        replies = await run_streams(
            ws,
            served.ask("rest-of-context", long_prompt, **GREEDY),
            served.ask("too-long", long_prompt * 3, max_tokens=4),
            served.ask("too-many", "hi", max_tokens=max_model_len),
        )

    whole = replies["rest-of-context"][-1]
    assert whole["type"] == "done", whole
    assert whole["finish_reason"] == "length"
    assert whole["usage"]["prompt_tokens"] + whole["usage"]["completion_tokens"] == max_model_len
    for refused in (replies["too-long"], replies["too-many"]):
        assert [frame["type"] for frame in refused] == ["error"]
        assert refused[0]["code"] == "context_length_exceeded"
        assert f"maximum context length is {max_model_len} tokens" in refused[0]["message"]


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

            await wait_for(gone)
    finally:
        await engine.close()


STAGED_URI = "s3://models/tiny"


@pytest.mark.parametrize("fetch", ["download", "stream"])
async def test_a_model_staged_in_s3_loads_and_answers_as_the_local_copy_does(
    fetch: str,
    start_agent: AgentFactory,
    agent: RunningAgent,
    aws: AwsEmulator,
    tiny_model_dir: Path,
    tmp_path: Path,
    token: str,
) -> None:
    aws_settings = aws.settings().aws
    async with aws_session(aws_settings).client("s3", endpoint_url=aws_settings.endpoint_url) as s3:
        await s3.create_bucket(Bucket="models")
    await stage_model(tiny_model_dir, STAGED_URI, aws_settings)
    loaded: list[Engine] = []

    async def load(settings: AgentSettings) -> Engine:
        loaded.append(await VllmEngine.start(settings))
        return loaded[-1]

    with mock.patch.dict(os.environ):  # what the streamer is told stays in this test
        staged = await start_agent(
            loader=load,
            model=STAGED_URI,
            served_model_name=TINY_MODEL,
            model_fetch=fetch,
            model_cache_dir=str(tmp_path),
            vllm=vllm_settings(tiny_model_dir).vllm,
        )
        try:
            await wait_ready(staged)
            ask = generate("s", TINY_MODEL, max_tokens=16, want_ids=True, **GREEDY)
            replies = []
            for running in (agent, staged):  # the local copy's agent, then the staged one's
                async with connect(running.ws_url, token) as ws:
                    replies.append(ids_of((await run_streams(ws, ask))["s"]))
        finally:
            for engine in loaded:
                await engine.close()
    assert replies[0] == replies[1]
    assert len(replies[1]) == 16
    boot = staged.runtime.boot
    weights = cache_directory(tmp_path, STAGED_URI) / "model.safetensors"
    if fetch == "download":  # fetched to disk, checked, then loaded from there
        assert boot.agent_start < boot.weights_ready <= boot.engine_loaded
        assert weights.read_bytes() == (tiny_model_dir / "model.safetensors").read_bytes()
    else:  # streamed from S3 into the engine: no copy of the weights on disk
        assert boot.weights_ready == 0.0
        assert not weights.exists()


HOSTILE_REQUESTS = 4
TOKENIZING_HELD_SECONDS_MAX = 120.0
"""A guard against a test that would otherwise hang, not a speed check."""


def largest_legal_tools(chars: int) -> list[dict[str, Any]]:
    """128 tools whose names and descriptions come to `chars` characters: text, as tokens go."""
    words = " ".join(f"harbour{n} crane{n * 7} berth" for n in range(chars // 20))
    names = [f"tool{n}" for n in range(MAX_TOOLS)]
    each = (chars - sum(len(name) for name in names)) // MAX_TOOLS
    return [
        {"type": "function", "function": {"name": name, "description": words[:each]}}
        for name in names
    ]


async def test_a_maximal_tools_payload_is_tokenized_off_the_event_loop(
    start_agent: AgentFactory,
    vllm_tool_engine: Engine,
    token: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    agent = await wait_ready(await start_agent(vllm_tool_engine))
    tools = largest_legal_tools(SocketLimits().max_prompt_chars - len("hi"))
    hostile = {
        "model": TOOL_MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "tools": tools,
        "tool_choice": "none",
    }
    frame = GenerateFrame.model_validate({"id": "h", **hostile})
    assert frame.prompt_chars() <= SocketLimits().max_prompt_chars
    # The hostile prompts' making (template, then tokens) is held until the stream has relayed
    # a delta: on the event loop it would hold the loop too, and nothing would be relayed.
    assert isinstance(vllm_tool_engine, VllmEngine)
    make_prompt_ids = vllm_tool_engine._prompt_ids
    tokenizing, relayed_meanwhile = threading.Event(), threading.Event()

    def held_prompt_ids(frame: GenerateFrame, max_prompt_tokens: int) -> list[int]:
        if frame.tools:
            tokenizing.set()
            if not relayed_meanwhile.wait(TOKENIZING_HELD_SECONDS_MAX):
                raise AssertionError("no delta was relayed while a prompt was made")
        return make_prompt_ids(frame, max_prompt_tokens)

    monkeypatch.setattr(vllm_tool_engine, "_prompt_ids", held_prompt_ids)

    async def refused(http: aiohttp.ClientSession) -> tuple[int, str]:
        async with http.post(
            f"{agent.url}/v1/chat/completions",
            json=hostile,
            headers={"Authorization": f"Bearer {token}"},
        ) as response:
            return response.status, (await response.json())["error"]["code"]

    async with connect(agent.ws_url, token) as ws, aiohttp.ClientSession() as http:
        await send(ws, generate("s", TOOL_MODEL, max_tokens=1024, ignore_eos=True, **GREEDY))
        received = 0
        while received == 0:
            received += (await receive(ws)).get("n", 0)
        attack = asyncio.gather(*(refused(http) for _ in range(HOSTILE_REQUESTS)))
        assert await asyncio.to_thread(tokenizing.wait, TOKENIZING_HELD_SECONDS_MAX)
        # Counted before they are sent: tokens past this count were sent while it was held.
        sent = metric_value(
            await scrape(f"{agent.url}/metrics"), "spotgate_agent_generated_tokens_total"
        )
        while received <= sent:
            reply = await receive(ws)
            assert reply["type"] == "delta", "no delta was relayed while a prompt was made"
            received += reply["n"]
        relayed_meanwhile.set()
        answers = await attack
        await send(ws, {"type": "cancel", "id": "s"})
        while (await receive(ws))["type"] not in ("done", "error"):
            pass

    assert answers == [(400, "context_length_exceeded")] * HOSTILE_REQUESTS
