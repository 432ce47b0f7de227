"""The routing benchmarks' stack: vLLM CPU agents on one registry, behind their gateways.

Agents running the real vLLM CPU engine serve one tiny model, each pinned to a CPU and vouched
for as the pool manager does; gateways share that registry, one signing key and one issuer,
as replicas behind one load balancer.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import aiohttp
from pydantic import SecretStr

from loadtest.bench.harness import (
    Server,
    bench_shared,
    emulator_process,
    metric_value,
    metrics_text,
    spawn_service,
    stop_servers,
)
from pool_manager.launches import vouch_for_agent
from spotgate.process import free_port
from spotgate.registry import Registry
from spotgate.settings import (
    AgentSettings,
    GatewaySettings,
    QueueSettings,
    RoutingSettings,
    SharedSettings,
    TokenSettings,
    VllmSettings,
)
from spotgate.tokens import SigningKey

SERVED_NAME = "prefix-bench"
# Measured on this repository's 2-core machine, one core per engine: prefilling 2,000 fresh
# tokens takes ~0.7-0.9 s, the last 200 of them on a cached prefix ~0.2 s, so a cache hit shows
# in TTFT. The default tiny model (hidden 128, 2 layers) prefills 2,000 tokens in ~0.2 s.
MODEL_HIDDEN_SIZE = 256
MODEL_LAYERS = 4
ENGINE_DTYPE = "float32"
MAX_MODEL_LEN = 4096
MAX_NUM_SEQS = 16
# Share of the machine's memory each engine may take at start; every agent must fit.
MEMORY_UTILIZATION = 0.2
# 8 KiB of KV per token (4 layers × keys and values × 256 floats): 1 GiB holds 131k tokens,
# several times one run's conversations (16 × ~2,000 tokens) even if all went to one agent.
KV_CACHE_GIB = "1"
HEARTBEAT_SECONDS = 1.0
# No IMDS (a closed port): the agent takes its identity from its settings, and no notice comes.
NO_IMDS_URL = "http://127.0.0.1:9"
READY_AGENTS_SAMPLE = 'spotgate_gateway_agents{state="ready"}'
GATEWAY_VIEW_TIMEOUT_SECONDS = 60.0

LEAST_LOAD, PREFIX_AWARE = "least load", "prefix-aware"
"""The two gateways: one routing by least load only, the other spotgate's default."""


def placement(agents: int, cpus: Sequence[int]) -> tuple[list[int], str]:
    """Each agent's CPU, and the sentence saying what shares what."""
    chosen = [cpus[n % len(cpus)] for n in range(agents)]
    pinned = ", ".join(f"agent {n + 1} to CPU {cpu}" for n, cpu in enumerate(chosen))
    shared = " (agents share CPUs: more agents than CPUs)" if agents > len(cpus) else ""
    return chosen, (
        f"Pinned: {pinned}{shared}, each engine's one OpenMP thread bound to its agent's CPU; "
        f"the gateways, the AWS emulator and the client are not pinned and share the "
        f"{len(cpus)} CPUs with the agents."
    )


@contextlib.contextmanager
def stack(
    model: Path, logs: Path, agent_cpus: Sequence[int], load_skew: float
) -> Iterator[tuple[dict[str, Server], list[Server]]]:
    """The AWS emulator, an agent per CPU given, and a least-load and a prefix-aware gateway."""
    with emulator_process(logs / "aws-emulator.log") as aws:
        api_key = asyncio.run(prepare_registry(aws))
        key = SigningKey.generate()
        ports = {name: free_port() for name in (LEAST_LOAD, PREFIX_AWARE)}
        # Replicas as behind one load balancer: one issuer and signing key for the agents.
        issuer = f"http://127.0.0.1:{ports[PREFIX_AWARE]}"
        started: list[Server] = []
        try:
            agents = [
                start_agent(model, aws, key, issuer, n, cpu, logs)
                for n, cpu in enumerate(agent_cpus)
            ]
            started += agents
            asyncio.run(vouch_agents(aws, agents))
            gateways = {
                name: start_gateway(aws, key, issuer, port, name, api_key, logs, load_skew)
                for name, port in ports.items()
            }
            started += gateways.values()
            yield gateways, agents
        finally:
            stop_servers(started)


async def vouch_agents(aws: SharedSettings, agents: Sequence[Server]) -> None:
    """Launch records for the agents, as the pool manager writes them: gateways route to them."""
    async with Registry.open(aws) as registry:
        for n, agent in enumerate(agents):
            await vouch_for_agent(
                registry, agent_id=f"bench-agent-{n + 1}", model=SERVED_NAME, url=agent.url
            )


async def prepare_registry(aws: SharedSettings) -> str:
    """The registry's tables, and an API key for the benchmark's clients."""
    async with Registry.open(aws) as registry:
        await registry.create_tables()
        return (await registry.create_key("bench")).api_key


def start_agent(
    model: Path,
    aws: SharedSettings,
    key: SigningKey,
    issuer: str,
    n: int,
    cpu: int,
    logs: Path,
    *,
    imds_url: str = NO_IMDS_URL,
    imds_poll_seconds: float = AgentSettings.model_fields["imds_poll_seconds"].default,
    max_model_len: int = MAX_MODEL_LEN,
) -> Server:
    """Agent `n + 1` on vLLM's CPU engine, pinned to `cpu`, taking tokens of `key`.

    `imds_url`: an IMDS (emulator) it polls for spot notices every `imds_poll_seconds`.
    """
    port = free_port()
    settings = AgentSettings(
        shared=bench_shared(aws),
        agent_id=f"bench-agent-{n + 1}",
        engine="vllm",
        model=str(model),
        served_model_name=SERVED_NAME,
        port=port,
        pinned_public_key=key.verify_key.to_pem(),
        token_issuer=issuer,
        imds_url=imds_url,
        imds_poll_seconds=imds_poll_seconds,
        heartbeat_seconds=HEARTBEAT_SECONDS,
        vllm=VllmSettings(
            dtype=ENGINE_DTYPE,
            max_model_len=max_model_len,
            max_num_seqs=MAX_NUM_SEQS,
            enforce_eager=True,
            gpu_memory_utilization=MEMORY_UTILIZATION,
        ),
    )
    # vLLM binds its OpenMP threads itself (VLLM_CPU_OMP_THREADS_BIND): to the agent's CPU.
    env = {"VLLM_CPU_KVCACHE_SPACE": KV_CACHE_GIB, "VLLM_CPU_OMP_THREADS_BIND": str(cpu)}
    process = spawn_service(settings, logs / f"agent-{n + 1}.log", {cpu}, env)
    return Server(f"agent {n + 1}", f"http://127.0.0.1:{port}", {}, process, SERVED_NAME)


def start_gateway(
    aws: SharedSettings,
    key: SigningKey,
    issuer: str,
    port: int,
    name: str,
    api_key: str,
    logs: Path,
    load_skew: float,
    shared_prompt_sha256: tuple[str, ...] = (),
    move_before_break: bool = True,
) -> Server:
    """Gateway `name` on `port`, signing with `key`: prefix-aware unless named LEAST_LOAD."""
    ops_port = free_port()
    settings = GatewaySettings(
        shared=bench_shared(aws),
        port=port,
        ops_port=ops_port,
        public_url=issuer,
        token=TokenSettings(signing_key_pem=SecretStr(key.to_pem())),
        routing=RoutingSettings(
            prefix_aware=name != LEAST_LOAD,
            prefix_load_skew=load_skew,
            shared_prompt_sha256=shared_prompt_sha256,
        ),
        queue=QueueSettings(move_before_break=move_before_break),
    )
    process = spawn_service(settings, logs / f"gateway-{name.replace(' ', '-')}.log")
    headers = {"Authorization": f"Bearer {api_key}"}
    return Server(
        f"gateway ({name})",
        f"http://127.0.0.1:{port}",
        headers,
        process,
        SERVED_NAME,
        ops_url=f"http://127.0.0.1:{ops_port}",
    )


async def wait_for_agents(http: aiohttp.ClientSession, gateway: Server, agents: int) -> None:
    """Until the gateway's metrics count `agents` ready agents (TimeoutError after a minute)."""
    deadline = time.monotonic() + GATEWAY_VIEW_TIMEOUT_SECONDS
    while (
        metric_value(await metrics_text(http, gateway.operations_url), READY_AGENTS_SAMPLE) < agents
    ):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{gateway.name} does not see {agents} ready agents")
        await asyncio.sleep(0.5)
