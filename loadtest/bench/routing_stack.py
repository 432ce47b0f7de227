"""The routing benchmarks' stack: vLLM CPU agents on one registry, behind their gateways.

Agents running the real vLLM CPU engine serve one tiny model, each pinned to a CPU and vouched
for as the pool manager does; gateways share that registry, one signing key and one issuer,
as replicas behind one load balancer.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import aiohttp
from pydantic import SecretStr

from gpu_agent.vllm_environment import CPU_KV_CACHE_ENV
from loadtest.bench.harness import BENCH_KEY, Server, bench_spec, metric_value, metrics_text
from spotgate.process import loopback_socket
from spotgate.settings import (
    AgentSettings,
    GatewaySettings,
    QueueSettings,
    RoutingSettings,
    SocketLimits,
    TokenSettings,
    VllmSettings,
)
from spotgate.tokens import SigningKey
from stack.builder import AgentProcess, GatewayReplica, LocalStack
from stack.children import GatewaySockets

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


@contextlib.asynccontextmanager
async def stack(
    model: Path, logs: Path, agent_cpus: Sequence[int], load_skew: float
) -> AsyncIterator[tuple[dict[str, Server], list[Server]]]:
    """The AWS emulator, an agent per CPU given, and a least-load and a prefix-aware gateway."""
    key = SigningKey.generate()
    sockets = {name: GatewaySockets.bind() for name in (LEAST_LOAD, PREFIX_AWARE)}
    # Replicas as behind one load balancer: one issuer and signing key for the agents.
    issuer = sockets[PREFIX_AWARE].url
    agents = [agent_process(model, key, issuer, n, cpu) for n, cpu in enumerate(agent_cpus)]
    gateways = {
        name: gateway_replica(key, issuer, name, each, load_skew) for name, each in sockets.items()
    }
    async with LocalStack(bench_spec(logs, gateways.values(), agents)) as running:
        api_key = running.keys[BENCH_KEY].api_key
        yield (
            {name: gateway_server(running, name, gateways[name], api_key) for name in gateways},
            [agent_server(running, n, agent) for n, agent in enumerate(agents)],
        )


def agent_process(
    model: Path,
    key: SigningKey,
    issuer: str,
    n: int,
    cpu: int,
    *,
    imds_url: str = NO_IMDS_URL,
    imds_poll_seconds: float = AgentSettings.model_fields["imds_poll_seconds"].default,
    max_model_len: int = MAX_MODEL_LEN,
    limits: SocketLimits | None = None,
) -> AgentProcess:
    """Agent `n + 1` on vLLM's CPU engine, pinned to `cpu`, taking tokens of `key`.

    `imds_url`: an IMDS (emulator) it polls for spot notices every `imds_poll_seconds`;
    `limits`: its sockets' (the defaults unless given).
    """
    settings = AgentSettings(
        agent_id=f"bench-agent-{n + 1}",
        engine="vllm",
        model=str(model),
        served_model_name=SERVED_NAME,
        pinned_public_key=key.verify_key.to_pem(),
        token_issuer=issuer,
        imds_url=imds_url,
        imds_poll_seconds=imds_poll_seconds,
        heartbeat_seconds=HEARTBEAT_SECONDS,
        limits=limits or SocketLimits(),
        vllm=VllmSettings(
            dtype=ENGINE_DTYPE,
            max_model_len=max_model_len,
            max_num_seqs=MAX_NUM_SEQS,
            enforce_eager=True,
            gpu_memory_utilization=MEMORY_UTILIZATION,
        ),
    )
    # The agent's process is pinned to its CPU, and with it the engine it runs (one process:
    # `set_engine_environment`) and that engine's one OpenMP thread.
    env = {CPU_KV_CACHE_ENV: KV_CACHE_GIB}
    return AgentProcess(
        f"agent-{n + 1}", settings, loopback_socket(), cpus=frozenset({cpu}), env=env
    )


def agent_server(running: LocalStack, n: int, agent: AgentProcess) -> Server:
    """How the clients reach agent `n + 1` of a running stack."""
    child = running.child(agent.name)
    if child is None:
        raise RuntimeError(f"{agent.name} is not running")
    return Server(f"agent {n + 1}", agent.url, {}, child.process, SERVED_NAME)


def gateway_replica(
    key: SigningKey,
    issuer: str,
    name: str,
    sockets: GatewaySockets,
    load_skew: float,
    shared_prompt_sha256: tuple[str, ...] = (),
    move_before_break: bool = True,
    limits: SocketLimits | None = None,
) -> GatewayReplica:
    """Gateway `name` on `sockets`, signing with `key`: prefix-aware unless named LEAST_LOAD.

    `limits`: its clients' sockets' (the defaults unless given).
    """
    settings = GatewaySettings(
        public_url=issuer,
        token=TokenSettings(signing_key_pem=SecretStr(key.to_pem())),
        routing=RoutingSettings(
            prefix_aware=name != LEAST_LOAD,
            prefix_load_skew=load_skew,
            shared_prompt_sha256=shared_prompt_sha256,
        ),
        queue=QueueSettings(move_before_break=move_before_break),
        limits=limits or SocketLimits(),
    )
    return GatewayReplica(f"gateway-{name.replace(' ', '-')}", settings, sockets)


def gateway_server(running: LocalStack, name: str, replica: GatewayReplica, api_key: str) -> Server:
    """How the clients reach gateway `name` of a running stack, with `api_key`."""
    child = running.child(replica.name)
    if child is None:
        raise RuntimeError(f"{replica.name} is not running")
    return Server(
        f"gateway ({name})",
        replica.sockets.url,
        {"Authorization": f"Bearer {api_key}"},
        child.process,
        SERVED_NAME,
        ops_url=replica.sockets.ops_url,
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
