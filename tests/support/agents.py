"""Agent fixtures for every suite: the tiny models, agents on loopback (engines: `engines`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
import urllib.request
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from gpu_agent.engine import Engine, EngineStep, GenerationRequest
from gpu_agent.imds import InstanceIdentity
from gpu_agent.imds_emulator import create_app as create_imds_app
from gpu_agent.runtime import AgentRuntime
from gpu_agent.server import RUNTIME, create_app
from gpu_agent.synthetic_engine import SyntheticEngine, synthetic_reply
from gpu_agent.tiny_model import write_tiny_adapter, write_tiny_model
from pool_manager.launches import vouch_for_agent
from spotgate.process import loopback_socket, serving_on_loopback, socket_port
from spotgate.registry import Registry
from spotgate.settings import AgentSettings, SyntheticSettings, VllmSettings, advertised_url
from spotgate.tokens import KeyRing, SigningKey, issue
from stack.emulator import AwsEmulator
from stack.local import TINY_MODEL_CACHE_ENV
from tests.support.tokenizers import tokenizer_dir

ISSUER = "http://gateway.test"
TINY_MODEL = "tiny"
LLAMA2_MODEL = "tiny-llama2"
"""The tiny Llama on Llama-2's published tokenizer: SentencePiece, byte fallback, no template."""
TOOL_MODEL = "tiny-qwen3-tools"
"""A tiny Llama on Qwen3's published tokenizer and chat template, taught `TOOL_CALL_REPLY`,
served with vLLM's `hermes` tool-call parser (what Qwen3 is served with)."""
TOOL_CALL_CONTENT = "Let me look that up.\n"
TOOL_CALL_ARGUMENTS = {
    "city": "Oslo",
    "unit": "celsius",
    "note": "Pack a light raincoat; showers seem likely near the harbour by evening, with "
    "strong gusts along its waterfront and cold mornings before sunrise.",
}
TOOL_CALL_REPLY = (
    f"{TOOL_CALL_CONTENT}<tool_call>\n"
    + json.dumps({"name": "get_weather", "arguments": TOOL_CALL_ARGUMENTS})
    + "\n</tool_call>"
)
"""Some content, then a call in Qwen3's markup: what the tool model answers every chat with.
No word repeats in it: a model this small tells its place in the reply by the last tokens."""
REASONING_MODEL = "tiny-qwen3-reasoning"
"""A tiny Llama on Qwen3's published tokenizer and chat template, taught `REASONING_REPLY`,
served with vLLM's `qwen3` reasoning parser and `hermes` tool-call parser, as Qwen3 is."""
REASONING_THINKING = (
    "\nThe user asks about Oslo; rain seems likely there today, so an umbrella helps.\n"
)
REASONING_ANSWER = "\n\nYes: bring one along, since showers are expected this afternoon."
REASONING_REPLY = f"<think>{REASONING_THINKING}</think>{REASONING_ANSWER}"
"""Thinking between Qwen3's tags, then the answer: 34 tokens, the closing tag the 20th."""
REASONING_THINKING_TOKENS = 18
"""`REASONING_THINKING`'s tokens: those before `</think>`, the opening tag left out."""
LORA_MODEL = "tiny-lora"
"""The tiny Llama served with LoRA adapters `LORA_ADAPTERS` (random, one per seed) and one
that cannot load (`broken`: a config and no weights)."""
LORA_ADAPTERS = {"a1": 1, "a2": 2, "a3": 3}
MAX_LORAS = 2
TINY_MODEL_CACHE = Path(
    os.environ.get(TINY_MODEL_CACHE_ENV, Path(__file__).parents[2] / ".cache/tiny-models")
)
"""The tiny models' cache (`write_tiny_model`'s `cache`), in the checkout: shared by the
workers and the `up`s they start, and kept between runs, since teaching a model its reply
takes half a minute of a core."""


@dataclass
class MotoState:
    """What the tests know of moto's state: one per process, which every emulator in it serves."""

    tables_created: bool = False  # the registry's tables, since the last reset


MOTO_STATE = MotoState()


def reset_emulator(emulator: AwsEmulator) -> None:
    """Empty the AWS emulator: no tables, no queues (DynamoDB then refuses every write)."""
    request = urllib.request.Request(f"{emulator.url}/moto-api/reset", method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200
    MOTO_STATE.tables_created = False


async def ensure_tables(emulator: AwsEmulator) -> None:
    """The registry's tables in the emulator: created once after each reset, not again by
    each fixture that needs them (thirteen requests, though the tables exist)."""
    if not MOTO_STATE.tables_created:
        async with Registry.open(emulator.settings()) as registry:
            await registry.create_tables()
        MOTO_STATE.tables_created = True


async def wait_for(condition: Callable[[], Awaitable[bool]], within: float = 30.0) -> None:
    """Poll an async condition until it holds (the registry offers no change events)."""
    async with asyncio.timeout(within):
        while not await condition():  # noqa: ASYNC110 - DynamoDB has no change events here
            await asyncio.sleep(0.05)


@pytest.fixture(scope="session")
def ring() -> KeyRing:
    return KeyRing([SigningKey.generate()])


@pytest.fixture
def token(ring: KeyRing) -> str:
    return issue(ring, subject="test-key", issuer=ISSUER, now=time.time(), ttl_seconds=900).token


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model on its own tokenizer, with random weights."""
    return write_tiny_model(tmp_path_factory.mktemp("models") / "tiny", cache=TINY_MODEL_CACHE)


@pytest.fixture(scope="session")
def llama2_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model on Llama-2's published tokenizer."""
    out = tmp_path_factory.mktemp("models") / "llama2"
    return write_tiny_model(out, tokenizer_dir("llama2"), cache=TINY_MODEL_CACHE)


@pytest.fixture(scope="session")
def reasoning_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model on Qwen3's tokenizer, taught `REASONING_REPLY`."""
    out = tmp_path_factory.mktemp("models") / "reasoning"
    return write_tiny_model(
        out, tokenizer_dir("qwen3"), reply=REASONING_REPLY, cache=TINY_MODEL_CACHE
    )


@pytest.fixture(scope="session")
def lora_adapter_dirs(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, str]:
    out = tmp_path_factory.mktemp("adapters")
    adapters = {
        name: str(write_tiny_adapter(out / name, tiny_model_dir, seed))
        for name, seed in LORA_ADAPTERS.items()
    }
    broken = out / "broken"
    broken.mkdir()
    (broken / "adapter_config.json").write_text((out / "a1" / "adapter_config.json").read_text())
    return {**adapters, "broken": str(broken)}


@pytest.fixture(scope="session")
def tool_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model on Qwen3's tokenizer, taught `TOOL_CALL_REPLY`."""
    out = tmp_path_factory.mktemp("models") / "tools"
    return write_tiny_model(
        out, tokenizer_dir("qwen3"), reply=TOOL_CALL_REPLY, cache=TINY_MODEL_CACHE
    )


ENGINE_BATCHED_TOKENS = 4096
"""The tests' engines' `--max-num-batched-tokens`, given as a `vllm serve` flag."""
ENGINE_KV_CACHE_BYTES = 256 * 2**20
"""The tests' engines' KV cache: 131,072 of the tiny model's tokens, twice what 32 streams of
2,048 hold; a quarter of the agent's default on a CPU, so several engines fit at once."""


def vllm_settings(
    model_dir: Path,
    served_model_name: str = TINY_MODEL,
    tool_call_parser: str | None = None,
    reasoning_parser: str | None = None,
) -> AgentSettings:
    return AgentSettings(
        engine="vllm",
        model=str(model_dir),
        served_model_name=served_model_name,
        vllm=VllmSettings(
            dtype="float32",
            max_model_len=2048,
            max_num_seqs=32,
            enforce_eager=True,
            # On the CPU backend: the share of the NUMA node's memory taken at start.
            gpu_memory_utilization=0.3,
            tool_call_parser=tool_call_parser,
            reasoning_parser=reasoning_parser,
            # Any `vllm serve` flag besides: the tests' engines take one.
            engine_args=f"--max-num-batched-tokens {ENGINE_BATCHED_TOKENS} "
            f"--kv-cache-memory-bytes {ENGINE_KV_CACHE_BYTES}",
        ),
    )


@dataclass
class RunningAgent:
    url: str
    app: web.Application

    @property
    def runtime(self) -> AgentRuntime:
        return self.app[RUNTIME]

    @property
    def ws_url(self) -> str:
        return self.url.replace("http://", "ws://") + "/v1/ws"


IMDS_LAUNCHED_AT = 1_795_000_000.0  # the emulated instance's launch, in its identity document


@dataclass
class Imds:
    url: str
    app: web.Application


@pytest.fixture
async def imds() -> AsyncIterator[Imds]:
    identity = InstanceIdentity(
        "i-0test", "g6.xlarge", "us-east-1a", "spot", launched_at=IMDS_LAUNCHED_AT
    )
    app = create_imds_app(identity)
    async with serving_on_loopback(app) as url:
        yield Imds(url, app)


AgentFactory = Callable[..., Awaitable[RunningAgent]]


@pytest.fixture
async def start_agent(aws: AwsEmulator, ring: KeyRing, imds: Imds) -> AsyncIterator[AgentFactory]:
    """Start agents serving a given engine (not closed with the agent: it is shared).

    Each is vouched for by a launch record, as the pool manager writes one for an agent it
    launches (`vouched=False`: none, e.g. while the registry is down).
    """
    servers = contextlib.AsyncExitStack()

    async def start(
        engine: Engine | None = None,
        *,
        loader: Callable[[AgentSettings], Awaitable[Engine]] | None = None,
        vouched: bool = True,
        **overrides: object,
    ) -> RunningAgent:
        sock = loopback_socket()
        port = socket_port(sock)
        values: dict[str, object] = {
            "shared": aws.settings(),
            "port": port,
            "pinned_public_key": ring.signing_key.verify_key.to_pem(),
            "token_issuer": ISSUER,
            "imds_url": imds.url,
            "imds_poll_seconds": 0.2,
            "heartbeat_seconds": 0.5,
            # Agents here may share one engine: a probe of one would join another's batch and
            # could change its greedy tokens. Tests of the check set their own.
            "engine_check_seconds": 3600.0,
            "agent_id": f"agent-{port}",
            **overrides,
        }
        settings = AgentSettings.model_validate(values)
        if settings.agent_id is not None and vouched:  # as the pool manager would have
            model = engine.model if engine is not None else settings.served_model_name
            async with Registry.open(aws.settings()) as registry:
                await vouch_for_agent(
                    registry,
                    agent_id=settings.agent_id,
                    model=model or "",
                    url=advertised_url(settings),
                )

        async def given(_settings: AgentSettings) -> Engine:
            assert engine is not None
            return engine

        app = create_app(settings, engine_loader=loader or given, owns_engine=False)
        url = await servers.enter_async_context(serving_on_loopback(app, sock))
        return RunningAgent(url, app)

    await ensure_tables(aws)
    async with servers:
        yield start


@pytest.fixture
def synthetic_engine() -> SyntheticEngine:
    return synthetic(tokens_per_second=200.0, ttft_seconds=0.01)


ENGINE_READY_SECONDS_MAX = 480.0
"""A guard against an agent that never turns ready, not a speed check: a vLLM engine's start
took 148 s on two cores shared with other tests' engines."""


async def wait_ready(agent: RunningAgent) -> RunningAgent:
    """The agent once ready; an agent whose engine failed fails the test at once, saying why."""
    runtime = agent.runtime

    async def ready_or_failed() -> bool:
        return runtime.became_ready.is_set() or runtime.phase == "failed"

    await wait_for(ready_or_failed, within=ENGINE_READY_SECONDS_MAX)
    assert runtime.phase != "failed", runtime.failure
    return agent


def synthetic(
    tokens_per_second: float,
    model: str = "synth",
    ttft_seconds: float = 0.0,
    kind: type[SyntheticEngine] = SyntheticEngine,
    **more: Any,
) -> SyntheticEngine:
    """A synthetic engine (or one of `kind`) at a given pace (`more`: other `SyntheticSettings`)."""
    return kind(
        AgentSettings(
            engine="synthetic",
            served_model_name=model,
            synthetic=SyntheticSettings(
                ttft_seconds=ttft_seconds, tokens_per_second=tokens_per_second, **more
            ),
        )
    )


class WedgingEngine(SyntheticEngine):
    """A synthetic engine that stops producing, its agent still answering: a GPU that hangs
    under a live event loop (`/healthz` green, heartbeats going), until `unwedge` (if ever).

    Also a reply held mid-stream, after exactly `after_tokens` tokens, for as long as a test
    needs, on any machine (`pace`: the synthetic engine's settings, an echo's say)."""

    def __init__(
        self,
        model: str = "synth",
        after_tokens: int | None = None,
        pace: SyntheticSettings | None = None,
    ) -> None:
        pace = pace or SyntheticSettings(ttft_seconds=0.01, tokens_per_second=200.0)
        super().__init__(AgentSettings(engine="synthetic", served_model_name=model, synthetic=pace))
        self.after_tokens = after_tokens  # every reply hangs after this many; None: none does
        self.wedged = asyncio.Event()  # set once a reply hangs
        self._unwedged = asyncio.Event()

    def wedge(self) -> None:
        """From now on every reply hangs before its first token."""
        self.hang_after(0)

    def hang_after(self, tokens: int) -> None:
        """From now on every reply hangs once it produced `tokens` tokens, until `unwedge`."""
        self.after_tokens = tokens
        self.wedged.clear()
        self._unwedged.clear()

    def unwedge(self) -> None:
        """The replies hanging go on, and later ones no longer hang."""
        self.after_tokens = None
        self._unwedged.set()

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[EngineStep, None]:
        """The synthetic reply, hanging after `after_tokens` until unwedged.

        A step that would pass the mark is cut there: the synthetic engine's late step holds
        every token due since the last, which on a loaded machine could be the whole reply.
        """
        produced = 0
        async for step in super().generate(request):
            ids = list(step.token_ids)
            if self.after_tokens is not None and produced + len(ids) > self.after_tokens:
                head = max(0, self.after_tokens - produced)
                if head:
                    yield EngineStep(ids[:head])
                    produced, ids = produced + head, ids[head:]
                self.wedged.set()
                await self._unwedged.wait()
            yield EngineStep(ids, step.finish_reason)
            produced += len(ids)


class HeldEngine(SyntheticEngine):
    """A synthetic engine whose replies, once `hold` is called, stay in their prefill until
    `released` is set: a prefill that lasts as long as a test needs, on any machine."""

    def __init__(self, model: str, tokens_per_second: float) -> None:
        pace = SyntheticSettings(ttft_seconds=0.01, tokens_per_second=tokens_per_second)
        super().__init__(AgentSettings(engine="synthetic", served_model_name=model, synthetic=pace))
        self.holding = False  # off while the agent warms up
        self.held = asyncio.Event()  # set once a reply waits in its prefill
        self.released = asyncio.Event()

    def hold(self) -> None:
        """From now on every reply waits for `released` before its first token."""
        self.holding = True

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[EngineStep, None]:
        """The synthetic reply, after the hold."""
        if self.holding:
            self.held.set()
            await self.released.wait()
        async for step in super().generate(request):
            yield step


async def spot_notice(imds: Imds, in_seconds: float) -> float:
    """Have the IMDS emulator announce an interruption; returns its deadline (epoch seconds)."""
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{imds.url}/_emulator/spot-notice", json={"in_seconds": in_seconds}) as reply,
    ):
        deadline: float = (await reply.json())["deadline"]
    return deadline


expected_text = synthetic_reply  # what the synthetic engine says to a one-message chat
