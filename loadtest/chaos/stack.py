"""The local stack of the fault scenarios: emulator, gateway, pool manager and its agents."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import tempfile
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import aiohttp
import psutil
import websockets
from pydantic import SecretStr

from gpu_agent.synthetic_engine import synthetic_reply
from gpu_agent.tiny_model import write_tiny_model
from pool_manager.events import interruption_warning
from pool_manager.local_provider import LOCAL_PLACEMENTS
from spotgate.process import Child
from spotgate.registry import AgentRecord, Registry, aws_session
from spotgate.settings import (
    AgentSettings,
    GatewaySettings,
    LocalPoolSettings,
    Placement,
    PoolModel,
    PoolSettings,
    QueueSettings,
    RegistryTimings,
    SharedSettings,
    SyntheticSettings,
    TokenSettings,
    settings_env,
)
from spotgate.tokens import SigningKey
from stack.builder import (
    POOL_MANAGER,
    ApiKeySpec,
    GatewayReplica,
    LocalStack,
    StackFailed,
    StackSpec,
    replica_name,
)
from stack.children import GatewaySockets
from stack.emulator import EMULATOR_REGION, AwsEmulator
from stack.local import LOCAL_VLLM, OMP_THREADS_ENV, TINY_SERVED_NAME
from stack.redis_server import RedisServer
from stack.supervision import Supervisor

MODEL = "synthetic"
STREAM_TOKENS = 60
TOKENS_PER_SECOND = 20.0  # 3-second streams: every fault lands on streams mid-reply
VLLM_STREAM_TOKENS = 400  # seconds of decoding for the tiny model on a few CPU cores
READY_TIMEOUT_SECONDS = 120.0
RECOVERY_TIMEOUT_SECONDS = 120.0
VLLM_START_TIMEOUT_SECONDS = 600.0  # an engine starting next to a busy one on a few cores
# Several engines share this machine's few cores: with a worker process of its own (an
# operator's VLLM_ENABLE_V1_MULTIPROCESSING=1) vLLM would pin each one's OpenMP threads to the
# same core; left to the scheduler, with one thread each, they spread out.
VLLM_SHARED_CPU_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "nobind", OMP_THREADS_ENV: "1"}
AGENT_HEARTBEAT_SECONDS = 1.0
GATEWAYS = 2  # replicas sharing one pool, as behind a load balancer
GATEWAY_GRACE_SECONDS = 10.0  # streams last 3 s: every one in flight finishes within it
REGISTRY_POLL_SECONDS = 0.1
# A wedged engine, at this scale: its streams move after 10 s without a token (vLLM on these
# CPUs gaps by well under a second), its agent leaves after 20 s.
STREAM_STALL_SECONDS = 10.0
ENGINE_CHECK_SECONDS = 2.0
ENGINE_STALL_SECONDS = 20.0


@dataclass(frozen=True)
class StackTimings:
    """How long the stack's services wait on one another before they give up on one.

    `gateway_grace_seconds`: a stopping gateway's drain; `stream_stall_seconds`: a stream
    without a token before the gateway moves it; `registry`: how long an agent's entry lives
    after its last heartbeat, so how long a hung agent stays in the pool.
    """

    gateway_grace_seconds: float = GATEWAY_GRACE_SECONDS
    stream_stall_seconds: float = STREAM_STALL_SECONDS
    registry: RegistryTimings = field(default_factory=RegistryTimings)

    @property
    def long_stream_seconds(self) -> float:
        """A stream that outlives a gateway's drain by as long again (synthetic pace)."""
        return 2 * self.gateway_grace_seconds


DEFAULT_TIMINGS = StackTimings()


@dataclass(frozen=True)
class StackEngine:
    """What the agents of a stack run, and how long its clients and faults wait for them."""

    kind: Literal["synthetic", "vllm"]
    model: str
    stream_tokens: int
    ready_timeout_seconds: float
    recovery_timeout_seconds: float

    def prompt(self, client: str, number: int, sent: int) -> str:
        """A client's chat message for its `sent`th stream.

        Synthetic replies are known for any prompt; vLLM's are learnt first, one per client
        number, so a vLLM client asks the same each time (and hits the prefix cache).
        """
        if self.kind == "synthetic":
            return f"{client} {number} stream {sent}"
        return f"Tell me about spot instance number {number}"

    def generate_frame(
        self, stream_id: str, prompt: str, session: str, max_tokens: int | None = None
    ) -> dict[str, Any]:
        """A greedy `generate` frame for one stream of this length (or `max_tokens`)."""
        return {
            "type": "generate", "id": stream_id, "model": self.model,
            "max_tokens": max_tokens or self.stream_tokens, "temperature": 0,
            "session": session,
            "messages": [{"role": "user", "content": prompt}],
            "want_ids": True,  # what a client needs to resume through another gateway
        }  # fmt: skip


SYNTHETIC = StackEngine(
    "synthetic", MODEL, STREAM_TOKENS, READY_TIMEOUT_SECONDS, RECOVERY_TIMEOUT_SECONDS
)
VLLM = StackEngine(
    "vllm",
    TINY_SERVED_NAME,
    VLLM_STREAM_TOKENS,
    VLLM_START_TIMEOUT_SECONDS,
    VLLM_START_TIMEOUT_SECONDS,
)
ENGINES = {engine.kind: engine for engine in (SYNTHETIC, VLLM)}


class ChaosStack:
    """The emulator, the gateway and the pool manager (local provider), for one run.

    The pool is held at `agents` (its minimum and its maximum), each agent taking at most
    `agent_capacity` streams at once.
    """

    def __init__(
        self,
        directory: Path,
        agents: int,
        agent_capacity: int,
        engine: StackEngine = SYNTHETIC,
        timings: StackTimings = DEFAULT_TIMINGS,
    ) -> None:
        self.directory = directory
        self.agents = agents
        self.agent_capacity = agent_capacity
        self.engine = engine
        self.timings = timings
        self.replies: dict[str, str] = {}  # vLLM: prompt → its uninterrupted greedy reply
        # The gateways' sockets, bound here: their ports are known before the gateways start,
        # and each stays its gateway's across a restart (a new process on the same port).
        self.gateway_sockets = [GatewaySockets.bind() for _ in range(GATEWAYS)]
        self.gateway_names = [replica_name(n) for n in range(GATEWAYS)]
        self.gateway_urls = [sockets.url for sockets in self.gateway_sockets]
        self.gateway_url = self.gateway_urls[0]
        self.stack = LocalStack(self._spec())
        self.processes = self.stack.processes
        self.api_key = ""

    def _spec(self) -> StackSpec:
        """The stack: gateways restarted when they exit, as `spotgate up`'s are."""
        # Replicas as behind a load balancer: one issuer and signing key, one limit store;
        # each names itself in `ws_url`.
        gateway = GatewaySettings(
            token_issuer=self.gateway_url,
            token=TokenSettings(signing_key_pem=SecretStr(SigningKey.generate().to_pem())),
            models=(self.engine.model,),
            queue=QueueSettings(
                deadline_seconds=60, stall_seconds=self.timings.stream_stall_seconds
            ),
            shutdown_grace_seconds=self.timings.gateway_grace_seconds,
        )
        pool = PoolSettings(
            provider="local",
            models=(self._pool_model(),),
            min_agents=self.agents,
            max_agents=self.agents,
            spot_overprovision=0,
            on_demand_fallback=False,
            loop_seconds=1,
            event_wait_seconds=0,
            port=0,
            # What the pool manager vouches each agent serves: the capacity the stack gives them.
            placements=tuple(
                Placement(
                    instance_type=p.instance_type,
                    zone=p.zone,
                    spot_price_per_hour=p.spot_price_per_hour,
                    on_demand_price_per_hour=p.on_demand_price_per_hour,
                    capacity=self.agent_capacity,
                )
                for p in LOCAL_PLACEMENTS
            ),
            local=LocalPoolSettings(
                engine=self.engine.kind,
                jwks_url=f"{self.gateway_url}/.well-known/jwks.json",
                drain_grace_seconds=15,
                log_dir=str(self.directory / "logs"),
            ),
        )
        return StackSpec(
            log_dir=self.directory / "logs",
            shared=SharedSettings(log_format="json", registry=self.timings.registry),
            fresh_emulator=True,
            keys=(ApiKeySpec("chaos"),),
            limit_store=True,
            interruption_queue="chaos-events",
            gateways=tuple(
                GatewayReplica(name, gateway, sockets)
                for name, sockets in zip(self.gateway_names, self.gateway_sockets, strict=True)
            ),
            pool=pool,
            supervise=True,
            # Its faults stop and start the store themselves.
            supervise_limit_store=False,
        )

    async def __aenter__(self) -> ChaosStack:
        await self.stack.__aenter__()
        self.api_key = self.stack.keys["chaos"].api_key
        return self

    @property
    def emulator(self) -> AwsEmulator:
        """The AWS emulator (DynamoDB, SQS)."""
        return self.stack.emulator

    @property
    def limit_store(self) -> RedisServer:
        """The gateways' limit store."""
        if self.stack.limit_store is None:
            raise RuntimeError("the stack has no limit store")
        return self.stack.limit_store

    @property
    def supervisor(self) -> Supervisor:
        """What restarts the stack's children when they exit."""
        if self.stack.supervisor is None:
            raise RuntimeError("the stack is not started")
        return self.stack.supervisor

    @property
    def gateways(self) -> list[Child]:
        """The gateway replicas' processes now (a restarted one is a new process)."""
        return [
            child for name in self.gateway_names if (child := self.stack.child(name)) is not None
        ]

    @property
    def pool_manager(self) -> Child | None:
        """The pool manager's process now."""
        return self.stack.child(POOL_MANAGER)

    def _pool_model(self) -> PoolModel:
        """The model the pool runs, and its agents' engine."""
        model = PoolModel(name=self.engine.model)
        agent = AgentSettings(
            heartbeat_seconds=AGENT_HEARTBEAT_SECONDS,
            imds_poll_seconds=1,
            engine_check_seconds=ENGINE_CHECK_SECONDS,
            engine_stall_seconds=ENGINE_STALL_SECONDS,
        )
        if self.engine.kind == "synthetic":
            synthetic = SyntheticSettings(
                tokens_per_second=TOKENS_PER_SECOND, capacity=self.agent_capacity
            )
            agent_env = settings_env(agent.model_copy(update={"synthetic": synthetic}))
            return model.model_copy(update={"agent_env": agent_env})
        vllm = LOCAL_VLLM.model_copy(update={"max_num_seqs": self.agent_capacity})
        agent_env = {**settings_env(agent.model_copy(update={"vllm": vllm})), **VLLM_SHARED_CPU_ENV}
        source = str(write_tiny_model(self.directory / "tiny"))
        return model.model_copy(update={"source": source, "agent_env": agent_env})

    def expected_reply(self, prompt: str, max_tokens: int | None = None) -> str:
        """The whole reply a stream of `prompt` must deliver (synthetic: of any length)."""
        if self.engine.kind == "synthetic":
            return synthetic_reply(prompt, max_tokens or self.engine.stream_tokens)
        return self.replies[prompt]

    async def learn_replies(self, clients: int) -> None:
        """vLLM: take each client number's reply from an uninterrupted run, all at once."""
        prompts = {f"learn-{n}": self.engine.prompt("learn", n, 1) for n in range(clients)}
        url = self.gateway_url.replace("http", "ws", 1) + "/v1/ws"
        headers = {"Authorization": f"Bearer {self.api_key}"}
        texts: defaultdict[str, list[str]] = defaultdict(list)
        async with websockets.connect(url, additional_headers=headers) as ws:
            for stream_id, prompt in prompts.items():
                await ws.send(json.dumps(self.generate_frame(stream_id, prompt, stream_id)))
            pending = set(prompts)
            async with asyncio.timeout(self.engine.ready_timeout_seconds):
                while pending:
                    frame = json.loads(await ws.recv())
                    if frame["type"] == "delta":
                        texts[frame["id"]].append(frame["text"])
                    elif frame["type"] == "error":
                        raise RuntimeError(f"learning a reply failed: {frame}")
                    elif frame["type"] == "done":
                        pending.discard(frame["id"])
        self.replies = {prompt: "".join(texts[sid]) for sid, prompt in prompts.items()}

    def generate_frame(
        self, stream_id: str, prompt: str, session: str, max_tokens: int | None = None
    ) -> dict[str, Any]:
        """A greedy `generate` frame for one stream of the engine's length (or `max_tokens`)."""
        return self.engine.generate_frame(stream_id, prompt, session, max_tokens)

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.stack.__aexit__(*exc)
        except StackFailed as err:
            raise RuntimeError(f"the stack stopped: {err}") from err

    async def ready_agents(self) -> dict[str, str]:
        """Agent id → URL of the agents registered ready (empty while AWS is unreachable)."""
        try:
            async with Registry.open(self.emulator.settings()) as registry:
                return {a.agent_id: a.url for a in await registry.list_ready(self.engine.model)}
        except Exception:
            return {}

    async def agent(self, agent_id: str) -> AgentRecord | None:
        """One agent's registry entry."""
        async with Registry.open(self.emulator.settings()) as registry:
            return await registry.get_agent(agent_id)

    def agent_processes(self) -> dict[str, psutil.Process]:
        """Agent id → process of each agent the pool manager runs now."""
        if self.pool_manager is None:
            return {}
        found = {}
        for child in psutil.Process(self.pool_manager.process.pid).children():
            with contextlib.suppress(psutil.Error):
                agent_id = child.environ().get("SPOTGATE_AGENT_AGENT_ID")
                if agent_id is not None and child.is_running():
                    found[agent_id] = child
        return found

    def serving_processes(self, ready: dict[str, str]) -> dict[str, psutil.Process]:
        """Agent id → process of the `ready` agents still running, in `ready`'s order.

        An agent that just exited can still look ready in the registry for a heartbeat or two.
        """
        running = self.agent_processes()
        found = {agent_id: running[agent_id] for agent_id in ready if agent_id in running}
        if not found:
            raise LookupError("no ready agent has a live process")
        return found

    async def restart_gateway(self, index: int = 0) -> None:
        """SIGTERM a gateway (it drains); its supervisor starts it again on its port, ready."""
        restarts = self.gateway_restarts(index)
        self._gateway(index).process.send_signal(signal.SIGTERM)
        await self.wait_gateway_restarted(index, restarts, READY_TIMEOUT_SECONDS)

    def kill_gateway(self, index: int) -> None:
        """SIGKILL a gateway: its sockets drop with no word to anyone (then it is restarted)."""
        self.processes.kill(self._gateway(index))

    def _gateway(self, index: int) -> Child:
        child = self.stack.child(self.gateway_names[index])
        if child is None:
            raise RuntimeError("the stack is not running")
        return child

    def gateway_restarts(self, index: int) -> int:
        """How many times the supervisor has started gateway `index` again."""
        return self.supervisor.restarted.get(self.gateway_names[index], 0)

    async def wait_gateway_restarted(self, index: int, after: int, within_seconds: float) -> None:
        """Wait until gateway `index` was restarted more than `after` times, and is ready."""
        started = time.monotonic()
        async with asyncio.timeout(within_seconds), self.supervisor.restarts:
            await self.supervisor.restarts.wait_for(lambda: self.gateway_restarts(index) > after)
        await self.wait_gateway_ready(within_seconds - (time.monotonic() - started), index)

    async def wait_gateway_ready(self, within_seconds: float, index: int = 0) -> None:
        """Poll a gateway's `/readyz` until it answers 200."""
        deadline = time.monotonic() + within_seconds
        async with aiohttp.ClientSession() as http:
            while time.monotonic() < deadline:
                with contextlib.suppress(aiohttp.ClientError):
                    ready = f"{self.gateway_sockets[index].ops_url}/readyz"
                    async with http.get(ready) as response:
                        if response.status == 200:
                            return
                await asyncio.sleep(REGISTRY_POLL_SECONDS)
        raise TimeoutError(f"the gateway was not ready within {within_seconds:.0f} s")

    async def wait_ready(self, exclude: set[str], within_seconds: float) -> float | None:
        """Seconds until `agents` others than `exclude` are ready; None if not in time."""
        started = time.monotonic()
        while time.monotonic() - started < within_seconds:
            ready = set(await self.ready_agents()) - exclude
            if len(ready) >= self.agents:
                return time.monotonic() - started
            await asyncio.sleep(0.5)
        return None

    async def interrupt(self, agent_id: str, in_seconds: float) -> None:
        """EC2's spot interruption warning for an agent, on the pool's queue."""
        body = interruption_warning(agent_id, time.time() + in_seconds, EMULATOR_REGION)
        settings = self.emulator.settings()
        async with aws_session(settings.aws).client(
            "sqs", endpoint_url=settings.aws.endpoint_url
        ) as sqs:
            await sqs.send_message(QueueUrl=self.stack.queue_url, MessageBody=json.dumps(body))


@contextlib.asynccontextmanager
async def chaos_stack(
    agents: int,
    agent_capacity: int,
    engine: StackEngine = SYNTHETIC,
    timings: StackTimings = DEFAULT_TIMINGS,
) -> AsyncIterator[ChaosStack]:
    """A stack in a scratch directory."""
    with tempfile.TemporaryDirectory(prefix="spotgate-chaos-") as scratch:
        async with ChaosStack(Path(scratch), agents, agent_capacity, engine, timings) as stack:
            yield stack
