"""A spotgate agent on vLLM's CPU engine, as the single-agent benchmarks run it."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

from loadtest.bench.cpu_engine import BenchEngine
from loadtest.bench.harness import Server, bench_spec
from spotgate.process import loopback_socket
from spotgate.settings import AgentSettings
from spotgate.tokens import KeyRing, SigningKey, issue
from stack.builder import AgentProcess, LocalStack

ISSUER = "http://bench.local"
TOKEN_TTL_SECONDS = 900
AGENT_ID = "bench-agent"


@contextlib.asynccontextmanager
async def vllm_agent(
    model: Path, served_name: str, engine: BenchEngine, logs: Path
) -> AsyncIterator[tuple[LocalStack, Server]]:
    """A stack of one agent serving `model` as `served_name`, and a token it takes."""
    ring = KeyRing([SigningKey.generate()])
    settings = AgentSettings(
        agent_id=AGENT_ID,
        engine="vllm",
        model=str(model),
        served_model_name=served_name,
        pinned_public_key=ring.signing_key.verify_key.to_pem(),
        token_issuer=ISSUER,
        imds_url="http://127.0.0.1:9",
        vllm=engine.vllm_settings(),
    )
    agent = AgentProcess("agent", settings, loopback_socket(), env=engine.env)
    async with LocalStack(bench_spec(logs, (), (agent,), keys=())) as running:
        token = issue(
            ring, subject="bench", issuer=ISSUER, now=time.time(), ttl_seconds=TOKEN_TTL_SECONDS
        ).token
        child = running.child(agent.name)
        if child is None:
            raise RuntimeError("the agent is not running")
        headers = {"Authorization": f"Bearer {token}"}
        yield running, Server("spotgate agent", agent.url, headers, child.process, served_name)
