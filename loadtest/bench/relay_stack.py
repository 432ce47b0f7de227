"""The gateway relay benchmarks' stack: one synthetic agent, direct and through each relay.

The agent's **synthetic engine** (fixed TTFT and rate) adds no noise. The paths: its own
OpenAI endpoint and websocket, our gateway in front of it (SSE and websocket), and LiteLLM's
proxy in front of the same endpoint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import aiohttp
from pydantic import SecretStr

from loadtest.bench.harness import (
    BENCH_KEY,
    Server,
    bench_spec,
    spawn,
    stop_servers,
    wait_ready,
    warmed,
)
from spotgate.process import free_port, loopback_socket, socket_port
from spotgate.settings import (
    TOKEN_TTL_MAX_SECONDS,
    AgentSettings,
    GatewaySettings,
    SocketLimits,
    SyntheticSettings,
    TokenSettings,
)
from spotgate.tokens import GATEWAY_SUBJECT_PREFIX, KeyRing, SigningKey, issue
from stack.builder import AgentProcess, GatewayReplica, LocalStack
from stack.children import GatewaySockets

MODEL = "synth"
TOKENS_PER_SECOND = 50.0
TTFT_SECONDS = 0.05
AGENT_CAPACITY = 4096
AGENT_ID = "bench-agent"
ADDED_TTFT_HISTOGRAM = "spotgate_gateway_added_ttft_seconds"
LITELLM_READY_PATH = "/health/liveliness"


@dataclass
class AgentToken:
    """The direct paths' and LiteLLM's token to the agent: a gateway's, issued anew per run.

    The direct websocket client multiplexes like a gateway does. A token lives at most
    `TOKEN_TTL_MAX_SECONDS`, and the whole bench runs longer than that.
    """

    keys: KeyRing
    issuer: str
    headers: dict[str, str] = field(default_factory=dict)  # the direct paths' own

    def __post_init__(self) -> None:
        self.renew()  # the direct paths are warmed before the first run

    def renew(self) -> str:
        """A fresh token, also set in the direct paths' headers."""
        token = issue(
            self.keys,
            subject=f"{GATEWAY_SUBJECT_PREFIX}bench",
            issuer=self.issuer,
            now=time.time(),
            ttl_seconds=TOKEN_TTL_MAX_SECONDS,
        ).token
        self.headers["Authorization"] = f"Bearer {token}"
        return token


@dataclass
class RelayPaths:
    """The paths under test, and how each run gets a fresh token to the agent."""

    servers: dict[str, Server]
    token: AgentToken
    start_litellm: Callable[[str], Server] | None  # its proxy, holding the given token

    async def before_run(self, http: aiohttp.ClientSession, server: Server) -> Server:
        """`server`, its token to the agent fresh: LiteLLM's proxy restarted with a new one."""
        token = self.token.renew()
        if server.name != "litellm" or self.start_litellm is None:
            return server
        stop_servers([self.servers["litellm"]])  # the one the last run used
        restarted = self.servers["litellm"] = self.start_litellm(token)
        await wait_ready(http, restarted, LITELLM_READY_PATH)
        await warmed(http, restarted)
        return restarted


@contextlib.asynccontextmanager
async def relay_stack(
    logs: Path, litellm: Path | None, client_cpus: set[int], relay_cpus: set[int]
) -> AsyncIterator[RelayPaths]:
    """The emulator and the agent on the client's CPUs, the relays on their own."""
    key = SigningKey.generate()
    gateway_sockets, agent_socket = GatewaySockets.bind(), loopback_socket()
    gateway_url, agent_url = gateway_sockets.url, f"http://127.0.0.1:{socket_port(agent_socket)}"
    agent = AgentSettings(
        engine="synthetic",
        served_model_name=MODEL,
        agent_id=AGENT_ID,
        pinned_public_key=key.verify_key.to_pem(),
        token_issuer=gateway_url,
        imds_url="http://127.0.0.1:9",
        synthetic=SyntheticSettings(
            tokens_per_second=TOKENS_PER_SECOND, ttft_seconds=TTFT_SECONDS, capacity=AGENT_CAPACITY
        ),
    )
    gateway = GatewaySettings(
        public_url=gateway_url,
        token=TokenSettings(signing_key_pem=SecretStr(key.to_pem())),
        limits=SocketLimits(max_streams_per_connection=AGENT_CAPACITY),
        max_streams_per_key=AGENT_CAPACITY,
    )
    spec = bench_spec(
        logs,
        [GatewayReplica("gateway", gateway, gateway_sockets, frozenset(relay_cpus))],
        [AgentProcess("agent", agent, agent_socket, AGENT_CAPACITY, frozenset(client_cpus))],
    )
    # The emulator beside the client: its requests weigh on every path alike.
    spec = dataclasses.replace(spec, emulator_cpus=frozenset(client_cpus))
    async with LocalStack(spec) as stack:
        token = AgentToken(KeyRing([key]), gateway_url)
        servers = _servers(stack, agent_url, token.headers)
        start_litellm = None
        if litellm is not None:
            start_litellm = functools.partial(
                _litellm_proxy, litellm, logs, agent_url, cpus=relay_cpus
            )
            servers["litellm"] = start_litellm(token.renew())
        try:
            yield RelayPaths(servers, token, start_litellm)
        finally:
            if litellm is not None:
                stop_servers([servers["litellm"]])


def _servers(stack: LocalStack, agent_url: str, agent_auth: dict[str, str]) -> dict[str, Server]:
    """The paths through the stack's agent and gateway: direct, and relayed."""
    agent, gateway = stack.child("agent"), stack.child("gateway")
    if agent is None or gateway is None:
        raise RuntimeError("the stack is not running")
    gateway_auth = {"Authorization": f"Bearer {stack.keys[BENCH_KEY].api_key}"}
    sockets = stack.spec.gateways[0].sockets

    def relayed(name: str, transport: Literal["sse", "ws"], own_sockets: bool = False) -> Server:
        return Server(
            name,
            sockets.url,
            gateway_auth,
            gateway.process,
            MODEL,
            transport,
            ADDED_TTFT_HISTOGRAM,
            sockets.ops_url,
            ws_socket_per_client=own_sockets,
        )

    def direct(name: str, transport: Literal["sse", "ws"], own_sockets: bool = False) -> Server:
        return Server(
            name,
            agent_url,
            agent_auth,
            agent.process,
            MODEL,
            transport,
            ws_socket_per_client=own_sockets,
        )

    return {
        "direct": direct("direct", "sse"),
        "direct ws": direct("direct ws", "ws"),
        "direct ws, own sockets": direct("direct ws, own sockets", "ws", own_sockets=True),
        "gateway": relayed("gateway", "sse"),
        "gateway ws": relayed("gateway ws", "ws"),
        "gateway ws, own sockets": relayed("gateway ws, own sockets", "ws", own_sockets=True),
    }


def _litellm_proxy(
    litellm: Path, logs: Path, agent_url: str, agent_token: str, cpus: set[int]
) -> Server:
    """LiteLLM's proxy (its `litellm` binary) in front of the agent's OpenAI endpoint."""
    port = free_port()
    config = logs / "litellm.yaml"
    master_key = f"sk-{secrets.token_hex(16)}"
    config.write_text(
        f"general_settings:\n  master_key: {master_key}\n"
        "model_list:\n"
        f"  - model_name: {MODEL}\n"
        "    litellm_params:\n"
        f"      model: openai/{MODEL}\n"
        f"      api_base: {agent_url}/v1\n"
        f"      api_key: {agent_token}\n"
    )
    proxy = spawn(
        [str(litellm), "--config", str(config), "--port", str(port),
         "--host", "127.0.0.1", "--num_workers", "1"],
        logs / "litellm.log",
        {**os.environ, "LITELLM_LOG": "ERROR"},
        cpus,
    )  # fmt: skip
    return Server(
        "litellm",
        f"http://127.0.0.1:{port}",
        {"Authorization": f"Bearer {master_key}"},
        proxy,
        MODEL,
    )
