"""A gateway on loopback in front of synthetic agents (in-process, or as real processes)."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pytest
from aiohttp import web
from pydantic import SecretStr

from gateway.routes.health import OPS_PORT
from gateway.server import create_app
from gateway.state import STATE, GatewayState
from gpu_agent.engine import Engine
from spotgate.file_store import FileStore
from spotgate.process import loopback_socket, serving_on_loopback, socket_port
from spotgate.registry import AgentState, CreatedApiKey, Registry
from spotgate.settings import (
    AgentSettings,
    BatchSettings,
    GatewaySettings,
    LimitStoreSettings,
    QueueSettings,
    SyntheticSettings,
    TokenSettings,
)
from spotgate.tokens import SigningKey
from stack import builder
from stack.emulator import AwsEmulator
from tests.support.agents import (
    AgentFactory,
    RunningAgent,
    ensure_tables,
    synthetic,
    wait_for,
    wait_ready,
)

MODEL = "synth"


@dataclass
class Gateway:
    url: str
    app: web.Application
    signing_key: SigningKey

    @property
    def state(self) -> GatewayState:
        return self.app[STATE]

    @property
    def ws_url(self) -> str:
        return self.url.replace("http://", "ws://") + "/v1/ws"

    @property
    def ops_url(self) -> str:
        """Its operations listener: `/readyz` and `/metrics`."""
        return f"http://127.0.0.1:{self.app[OPS_PORT]}"


@pytest.fixture
def gateway_key() -> SigningKey:
    return SigningKey.generate()


@contextlib.asynccontextmanager
async def running_gateway(
    aws: AwsEmulator,
    signing_key: SigningKey,
    clock: Callable[[], float] = time.time,
    **overrides: Any,
) -> AsyncIterator[Gateway]:
    """A gateway on a loopback port of its own with test settings (`overrides` replace them)."""
    sock = loopback_socket()
    port = socket_port(sock)
    url = f"http://127.0.0.1:{port}"
    fields: dict[str, Any] = {
        "shared": aws.settings(),
        "port": port,
        "ops_port": 0,
        "public_url": url,
        "token": TokenSettings(signing_key_pem=SecretStr(signing_key.to_pem())),
        "queue": QueueSettings(max_pending_per_model=4, deadline_seconds=5.0),
        "registry_refresh_seconds": 0.2,
        "demand_publish_seconds": 0.5,
        "models": ("scalable",),
        "shutdown_grace_seconds": 5.0,
    }
    settings = GatewaySettings(**{**fields, **overrides})
    await ensure_tables(aws)
    async with FileStore.open(aws.settings()) as files:  # the emulator's S3 is emptied each test
        await files.create_bucket()
    app = create_app(settings, clock=clock)
    async with serving_on_loopback(app, sock):
        yield Gateway(url, app, signing_key)


@pytest.fixture
async def gateway(
    aws: AwsEmulator, gateway_key: SigningKey, limit_store: LimitStoreSettings
) -> AsyncIterator[Gateway]:
    """A gateway keeping its limits in the session's Redis, as every replica in AWS does."""
    async with running_gateway(aws, gateway_key, limit_store=limit_store) as running:
        yield running


@pytest.fixture
async def api_key(aws: AwsEmulator) -> CreatedApiKey:
    async with Registry.open(aws.settings()) as registry:
        return await registry.create_key("test")


GatewayAgentFactory = Callable[..., Awaitable[RunningAgent]]


def serving(gateway: Gateway) -> set[str]:
    """The agents the gateway has streams open on (a client's `start` names none of them)."""
    return {agent_id for agent_id, n in gateway.state.dispatcher.outstanding.items() if n > 0}


def completed_streams(agent: RunningAgent) -> float:
    """Streams the agent finished generating, as its metrics count them."""
    registry = agent.runtime.metrics.registry
    return registry.get_sample_value("spotgate_agent_streams_total", {"outcome": "completed"}) or 0


async def completed_on(
    agents: Sequence[RunningAgent], before: Sequence[float], streams: int
) -> list[float]:
    """Each agent's completed streams once `streams` more than `before` were counted over all.

    The client may hear a stream's `done` a moment before its agent counts it.
    """

    async def counted() -> bool:
        return sum(map(completed_streams, agents)) >= sum(before) + streams

    await wait_for(counted)
    return [completed_streams(agent) - count for agent, count in zip(agents, before, strict=True)]


@pytest.fixture
def gateway_agent(start_agent: AgentFactory, gateway: Gateway) -> GatewayAgentFactory:
    """Start an in-process synthetic agent that trusts the gateway, and wait until routable."""
    return agents_of(gateway, start_agent)


def agents_of(gateway: Gateway, start_agent: AgentFactory) -> GatewayAgentFactory:
    """Starts in-process agents (synthetic unless given an engine) that `gateway` routes to."""

    async def start(
        tokens_per_second: float = 200.0,
        model: str = MODEL,
        engine: Engine | None = None,
        **overrides: object,
    ) -> RunningAgent:
        if engine is None:
            engine = synthetic(tokens_per_second, model=model, ttft_seconds=0.01)
        agent = await wait_ready(
            await start_agent(
                engine,
                pinned_public_key=gateway.signing_key.verify_key.to_pem(),
                token_issuer=gateway.url,
                **overrides,
            )
        )
        agent_id = agent.runtime.identity.agent_id  # type: ignore[union-attr]

        async def routable() -> bool:
            record = gateway.state.dispatcher.view.record(agent_id)
            return record is not None and record.state is AgentState.READY

        await wait_for(routable)
        return agent

    return start


@dataclass
class AgentProcess:
    agent_id: str
    process: subprocess.Popen[bytes]


class AgentProcesses(Protocol):
    """Starts synthetic agents as processes the gateway routes to (IMDS: none, unless given)."""

    def __call__(
        self,
        count: int,
        tokens_per_second: float,
        *,
        ttft_seconds: float = 0.01,
        imds_url: str = "http://127.0.0.1:9",
    ) -> Awaitable[list[AgentProcess]]: ...


@pytest.fixture
async def agent_processes(
    aws: AwsEmulator, gateway: Gateway, tmp_path: Path
) -> AsyncIterator[AgentProcesses]:
    """Synthetic agents as real processes (so they can be killed with SIGKILL), started by the
    stack builder on the session's emulator; their logs in the test's directory."""
    shared = aws.settings().model_copy(update={"log_level": "warning"})
    spec = builder.StackSpec(log_dir=tmp_path, shared=shared, running_emulator=shared.aws)
    async with builder.LocalStack(spec) as stack:

        async def start(
            count: int,
            tokens_per_second: float,
            *,
            ttft_seconds: float = 0.01,
            imds_url: str = "http://127.0.0.1:9",
        ) -> list[AgentProcess]:
            batch = []
            for _ in range(count):
                sock = loopback_socket()  # handed over: the agent serves on it
                agent_id = f"proc-{socket_port(sock)}"
                settings = AgentSettings(
                    engine="synthetic",
                    served_model_name=MODEL,
                    agent_id=agent_id,
                    pinned_public_key=gateway.signing_key.verify_key.to_pem(),
                    token_issuer=gateway.url,
                    imds_url=imds_url,
                    heartbeat_seconds=1,
                    imds_poll_seconds=0.5,
                    synthetic=SyntheticSettings(
                        tokens_per_second=tokens_per_second, ttft_seconds=ttft_seconds
                    ),
                )
                # Vouched for before it can register ready: it boots in a second or two.
                child = await stack.start_agent(builder.AgentProcess(agent_id, settings, sock))
                sock.close()  # the agent's alone: a killed agent's port refuses connections
                batch.append(AgentProcess(agent_id, child.process))
            return batch

        yield start


@contextlib.asynccontextmanager
async def replicas(
    aws: AwsEmulator,
    gateway_key: SigningKey,
    count: int,
    start_agent: AgentFactory,
    **settings: Any,
) -> AsyncIterator[list[Gateway]]:
    """`count` gateway replicas (one signing key, one registry) and one synthetic agent."""
    async with contextlib.AsyncExitStack() as stack:
        first = await stack.enter_async_context(running_gateway(aws, gateway_key, **settings))
        gateways = [first]
        for _ in range(count - 1):
            gateways.append(
                await stack.enter_async_context(
                    # Its own URL (`ws_url` names it), the tokens of one issuer.
                    running_gateway(aws, gateway_key, token_issuer=first.url, **settings)
                )
            )
        engine = synthetic(20.0, model=MODEL, ttft_seconds=0.01)
        agent = await wait_ready(
            await start_agent(
                engine, pinned_public_key=gateway_key.verify_key.to_pem(), token_issuer=first.url
            )
        )
        agent_id = agent.runtime.identity.agent_id  # type: ignore[union-attr]

        async def routable_everywhere() -> bool:
            records = [gateway.state.dispatcher.view.record(agent_id) for gateway in gateways]
            return all(r is not None and r.state is AgentState.READY for r in records)

        await wait_for(routable_everywhere)
        yield gateways


FAST_BATCHES = BatchSettings(poll_seconds=0.1, lease_seconds=3.0)
"""Workers that look for batches and save progress often (the defaults: 5 s, 30 s)."""


@pytest.fixture
async def batch_gateway(
    aws: AwsEmulator, gateway_key: SigningKey, limit_store: LimitStoreSettings
) -> AsyncIterator[Gateway]:
    async with running_gateway(
        aws, gateway_key, limit_store=limit_store, batch=FAST_BATCHES
    ) as running:
        yield running
