"""The stack under attack: the emulator, the gateway and one synthetic agent as processes."""

from __future__ import annotations

import asyncio
from contextlib import suppress
from pathlib import Path

import aiohttp
from pydantic import SecretStr

from loadtest.hostile.client import MODEL, chat_body
from spotgate.apikeys import parse_api_key
from spotgate.process import Child, ChildProcesses, loopback_socket, socket_port
from spotgate.registry import CreatedApiKey
from spotgate.settings import (
    AgentSettings,
    GatewaySettings,
    QueueSettings,
    SharedSettings,
    SyntheticSettings,
    TokenSettings,
)
from spotgate.tokens import SigningKey
from stack.builder import AgentProcess, ApiKeySpec, GatewayReplica, LocalStack, StackSpec
from stack.children import GatewaySockets
from stack.emulator import AwsEmulator

FUZZ_KEY_MAX_TOKENS = 64  # keeps fuzzed requests that happen to be valid short
TOKENS_PER_SECOND = 20_000.0  # fast enough that a client that never reads falls behind at once
SLOW_SENDER_TIMEOUT_SECONDS = 3.0  # the stack's keep-alive (header) and body timeouts
FLOOD_MAX_TOKENS = 1_000_000  # the longest reply the battery asks for (never read)
ALLOWED_ORIGIN = "https://chat.example"
ROGUE_BILLED_TPM = 5_000
"""The tokens per minute of the key a rogue agent's `done` frames try to bill (`rogue_agent`)."""
AGENT_ID = "hostile-agent"
"""The stack's one agent, vouched for as the pool manager would have launched it."""
ENDED_EARLY_TPM = 1000
"""The tokens per minute of the key whose streams end early (`revocation`)."""
INVENTED_RESUME_TPM = 2000
"""The tokens per minute of the key that resumes streams it made up (`resume_charges`)."""
GATEWAY_START_SECONDS = 60.0


KEYS = (
    ApiKeySpec("fuzz", max_tokens=FUZZ_KEY_MAX_TOKENS),
    *(ApiKeySpec(name) for name in ("reader", "victim", "bystander", "revoked")),
    ApiKeySpec("early", tpm=ENDED_EARLY_TPM),
    ApiKeySpec("resumer", tpm=INVENTED_RESUME_TPM),
    ApiKeySpec("billed", tpm=ROGUE_BILLED_TPM),
)
"""The battery's keys, by name: what each attack uses."""


class HostileStack:
    """The emulator, the gateway and one synthetic agent as processes, logging JSON to files."""

    def __init__(self, directory: Path) -> None:
        self.log_dir = directory / "logs"
        # Bound here and handed down: the URLs are known before the services start, and the
        # gateway keeps its port when it restarts with a new signing key.
        self.gateway_sockets, self.agent_socket = GatewaySockets.bind(), loopback_socket()
        self.gateway_port = socket_port(self.gateway_sockets.traffic)
        self.gateway_url = self.gateway_sockets.url
        self.gateway_ops_url = self.gateway_sockets.ops_url
        self.agent_url = f"http://127.0.0.1:{socket_port(self.agent_socket)}"
        self.signing_key = SigningKey.generate()
        self.stack = LocalStack(
            StackSpec(
                log_dir=self.log_dir,
                # The most a log could say.
                shared=SharedSettings(log_format="json", log_level="debug"),
                keys=KEYS,
                gateways=(self._gateway("gateway"),),
                agents=(AgentProcess("agent", self._agent(), self.agent_socket),),
            )
        )
        self.processes: ChildProcesses = self.stack.processes
        self.keys: dict[str, CreatedApiKey] = self.stack.keys
        self.secrets: set[str] = set()  # what no log line may contain
        self.gateway: Child | None = None
        self.agent: Child | None = None
        self._http: aiohttp.ClientSession | None = None

    @property
    def emulator(self) -> AwsEmulator:
        """The AWS emulator (DynamoDB)."""
        return self.stack.emulator

    @property
    def http(self) -> aiohttp.ClientSession:
        """A session for the battery's own well-behaved calls."""
        if self._http is None:
            raise RuntimeError("the stack is not started")
        return self._http

    async def __aenter__(self) -> HostileStack:
        self._http = aiohttp.ClientSession()
        self._keep_secret()
        await self.stack.__aenter__()
        for created in self.keys.values():
            self.secrets.add(created.api_key)
            self.secrets.add(parse_api_key(created.api_key).secret)
        self.gateway, self.agent = self.stack.child("gateway"), self.stack.child("agent")
        await self.wait_routable()
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.stack.__aexit__(*exc)
        finally:
            if self._http is not None:
                await self._http.close()

    def agent_settings(self, agent_id: str, **synthetic: float) -> AgentSettings:
        """A synthetic agent of this stack's model, trusting its gateway, with no IMDS."""
        return AgentSettings(
            engine="synthetic",
            served_model_name=MODEL,
            agent_id=agent_id,
            jwks_url=f"{self.gateway_url}/.well-known/jwks.json",
            imds_url="http://127.0.0.1:9",
            heartbeat_seconds=1,
            synthetic=SyntheticSettings.model_validate(
                {"tokens_per_second": TOKENS_PER_SECOND, "ttft_seconds": 0.01, **synthetic}
            ),
        )

    def _agent(self) -> AgentSettings:
        """The stack's own agent: slow senders time out, and the flood's replies fit."""
        # Room for the flood's replies: a smaller context would refuse them outright.
        agent = self.agent_settings(AGENT_ID, max_model_len=2 * FLOOD_MAX_TOKENS)
        timeouts = {
            "keepalive_seconds": SLOW_SENDER_TIMEOUT_SECONDS,
            "http_body_timeout_seconds": SLOW_SENDER_TIMEOUT_SECONDS,
        }
        return agent.model_copy(update=timeouts)

    def _gateway(self, name: str) -> GatewayReplica:
        """The gateway, signing with the current signing key."""
        gateway = GatewaySettings(
            public_url=self.gateway_url,
            token=TokenSettings(
                signing_key_pem=SecretStr(self.signing_key.to_pem()), ttl_seconds=900
            ),
            models=(MODEL,),
            queue=QueueSettings(deadline_seconds=5),
            allowed_origins=(ALLOWED_ORIGIN,),
            keepalive_seconds=SLOW_SENDER_TIMEOUT_SECONDS,
            http_body_timeout_seconds=SLOW_SENDER_TIMEOUT_SECONDS,
        )
        return GatewayReplica(name, gateway, self.gateway_sockets)

    def _keep_secret(self) -> None:
        """The current signing key's lines go on the list of what no log may contain."""
        pem = self.signing_key.to_pem()
        self.secrets.update(line for line in pem.splitlines() if "-----" not in line)

    async def rotate_signing_key(self) -> None:
        """Restart the gateway with a new signing key and without the old one (retired)."""
        gateway = self.gateway
        if gateway is None:
            raise RuntimeError("the gateway is not started")
        await self.processes.stop(lambda child: child is gateway, 30)
        self.processes.children.remove(gateway)  # its log stays, for the secrets search
        self.signing_key = SigningKey.generate()
        self._keep_secret()
        rotated = self._gateway("gateway-rotated")
        self.gateway = self.stack.start_gateway(rotated)
        await self.stack.wait_gateway_ready(rotated, GATEWAY_START_SECONDS)
        await self.wait_routable()

    async def wait_routable(self) -> None:
        """Until a short chat through the gateway completes (the agent is ready and linked)."""
        headers = {"Authorization": f"Bearer {self.keys['bystander'].api_key}"}
        async with asyncio.timeout(90):
            while True:
                self.processes.check()
                with suppress(aiohttp.ClientError):
                    async with self.http.post(
                        f"{self.gateway_url}/v1/chat/completions", data=chat_body(), headers=headers
                    ) as reply:
                        if reply.status == 200:
                            return
                await asyncio.sleep(0.5)

    async def token(self, key: str) -> str:
        """A token for the named API key, from `POST /v1/token`."""
        headers = {"Authorization": f"Bearer {self.keys[key].api_key}"}
        async with self.http.post(f"{self.gateway_url}/v1/token", headers=headers) as reply:
            token: str = (await reply.json())["token"]
        self.secrets.add(token)
        return token

    def pid(self, child: Child | None) -> int:
        """The process id of a running child."""
        if child is None or not child.running:
            raise RuntimeError("that process is not running")
        return child.process.pid

    def log_lines(self) -> list[tuple[str, str]]:
        """(file name, line) of everything every process wrote."""
        return [
            (path.name, line)
            for path in sorted(self.log_dir.glob("*.log"))
            for line in path.read_text(errors="replace").splitlines()
        ]
