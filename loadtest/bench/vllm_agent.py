"""A spotgate agent on vLLM's CPU engine, as the single-agent benchmarks run it.

One engine configuration (`BenchEngine`) names every argument the engine starts with, so a
benchmark that compares the agent with `vllm serve` starts both the same way, and its report
says how.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from loadtest.bench.harness import Server, bench_shared, spawn_service
from spotgate.process import free_port
from spotgate.registry import Registry
from spotgate.settings import AgentSettings, SharedSettings, VllmSettings
from spotgate.tokens import KeyRing, issue

ISSUER = "http://bench.local"
TOKEN_TTL_SECONDS = 900


@dataclass(frozen=True, slots=True)
class BenchEngine:
    """The vLLM CPU engine's arguments (eager: no graph capture on the CPU)."""

    max_num_seqs: int
    dtype: str = "float32"
    max_model_len: int = 2048
    # On vLLM's CPU backend, the share of the NUMA node's memory each engine may take at
    # start: two engines side by side must both fit.
    memory_utilization: float = 0.3
    kv_cache_gib: str = "1"

    @property
    def label(self) -> str:
        """The arguments, as a report states them."""
        return (
            f"dtype {self.dtype}, max_model_len {self.max_model_len}, "
            f"max_num_seqs {self.max_num_seqs}, eager"
        )

    @property
    def env(self) -> dict[str, str]:
        """What the CPU backend reads from the environment: its KV cache's size."""
        return {"VLLM_CPU_KVCACHE_SPACE": self.kv_cache_gib}

    def vllm_settings(self) -> VllmSettings:
        """The agent's engine settings."""
        return VllmSettings(
            dtype=self.dtype,
            max_model_len=self.max_model_len,
            max_num_seqs=self.max_num_seqs,
            enforce_eager=True,
            gpu_memory_utilization=self.memory_utilization,
        )


def start_vllm_agent(
    model: Path,
    served_name: str,
    engine: BenchEngine,
    aws: SharedSettings,
    ring: KeyRing,
    log: Path,
) -> Server:
    """An agent serving `model` as `served_name`, and a token of `ring`'s that it takes."""
    port = free_port()
    settings = AgentSettings(
        shared=bench_shared(aws),
        engine="vllm",
        model=str(model),
        served_model_name=served_name,
        port=port,
        pinned_public_key=ring.signing_key.verify_key.to_pem(),
        token_issuer=ISSUER,
        imds_url="http://127.0.0.1:9",
        vllm=engine.vllm_settings(),
    )
    token = issue(
        ring, subject="bench", issuer=ISSUER, now=time.time(), ttl_seconds=TOKEN_TTL_SECONDS
    ).token
    process = spawn_service(settings, log, env=engine.env)
    headers = {"Authorization": f"Bearer {token}"}
    return Server("spotgate agent", f"http://127.0.0.1:{port}", headers, process, served_name)


async def create_tables(aws: SharedSettings) -> None:
    """The registry's tables, which an agent registers in."""
    async with Registry.open(aws) as registry:
        await registry.create_tables()
