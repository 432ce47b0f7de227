"""A spotgate agent on vLLM's CPU engine, as the single-agent benchmarks run it."""

from __future__ import annotations

import time
from pathlib import Path

from loadtest.bench.cpu_engine import BenchEngine
from loadtest.bench.harness import Server, bench_shared, spawn_service
from spotgate.process import free_port
from spotgate.registry import Registry
from spotgate.settings import AgentSettings, SharedSettings
from spotgate.tokens import KeyRing, issue

ISSUER = "http://bench.local"
TOKEN_TTL_SECONDS = 900


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
