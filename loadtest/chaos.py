"""Fault scenarios on a local stack under steady traffic: nothing lost, recovery timed.

    python -m loadtest.chaos [--agents 3] [--streams 12] [--write docs/reliability.md]

    python -m loadtest.chaos --engine vllm [--write docs/reliability.md]

The stack is real processes: an AWS emulator (moto server, in this process so it can be
stopped and started), the gateway, and the pool manager with the `local` provider running
agents of the synthetic engine or of vLLM (the CPU build, with the generated tiny model),
the pool held at `--agents` (its minimum and its maximum). Websocket clients keep
`--streams` streams going, each a one-message chat in a session of its client, whose whole
reply is known in advance (the synthetic engine is deterministic; vLLM decodes greedily, and
each prompt's reply is first taken from an uninterrupted run), so every stream is
classified: exact (the full reply, byte for byte), resumed (exact, and served by more than
one agent), failed with a clear error code, or lost (it ended wrong or not at all); streams
that waited in the gateway's queue are counted too. Each fault is injected into the
running stack; recovery is the time until the pool has its target of ready agents again,
none of them a faulted one (for a gateway restart: until the new gateway is ready and has
finished a stream; for a full pool: until the last stream of the surplus ended).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import aiohttp
import psutil
import websockets
from pydantic import SecretStr

from gpu_agent.synthetic_engine import synthetic_reply
from gpu_agent.tiny_model import write_tiny_model
from loadtest.bench.report import machine_facts, write_section
from pool_manager.events import interruption_warning
from spotgate.process import Child, ChildProcesses, free_port
from spotgate.registry import AgentRecord, Registry, aws_session
from spotgate.settings import (
    AgentSettings,
    GatewaySettings,
    LocalPoolSettings,
    PoolSettings,
    QueueSettings,
    SyntheticSettings,
    TokenSettings,
    settings_env,
)
from spotgate.tokens import SigningKey
from stack.children import start_service
from stack.emulator import EMULATOR_REGION, AwsEmulator
from stack.local import LOCAL_VLLM, TINY_SERVED_NAME

MODEL = "synthetic"
DEFAULT_AGENTS = 3
DEFAULT_STREAMS = 12
STREAM_TOKENS = 60
TOKENS_PER_SECOND = 20.0  # 3-second streams: every fault lands on streams mid-reply
VLLM_STREAM_TOKENS = 400  # seconds of decoding for the tiny model on a few CPU cores
STREAM_TIMEOUT_SECONDS = 90.0
READY_TIMEOUT_SECONDS = 120.0
RECOVERY_TIMEOUT_SECONDS = 120.0
VLLM_START_TIMEOUT_SECONDS = 600.0  # an engine starting next to a busy one on a few cores
# Several engines share this machine's few cores: vLLM would pin each one's OpenMP threads
# to the same core; left to the scheduler, with one thread each, they spread out.
VLLM_SHARED_CPU_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}
NOTICE_SECONDS = 20.0
AGENT_HEARTBEAT_SECONDS = 1.0
GATEWAY_GRACE_SECONDS = 10.0  # streams last 3 s: every one in flight finishes within it
GATEWAY_STOP_TIMEOUT_SECONDS = GATEWAY_GRACE_SECONDS + 10.0
RECONNECT_PAUSE_SECONDS = 0.5
FAILED_STREAM_PAUSE_SECONDS = 1.0  # after an error without `retry_after`, as a client would
REGISTRY_POLL_SECONDS = 0.1
# A fresh agent is killed this long after it is seen registered, or once it has a stream:
# well within its first heartbeat interval, and long enough for the gateway to route to it.
NEWCOMER_LIFETIME_SECONDS = 0.4 * AGENT_HEARTBEAT_SECONDS
GOING_AWAY = 1001  # the websocket close code of a server shutting down
COMMAND = "python -m loadtest.chaos --write docs/reliability.md"
REPORT_TITLE = "# Reliability\n\nEach section names the command that produced it.\n"


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


@dataclass
class Tally:
    """Streams by outcome."""

    started: int = 0
    exact: int = 0
    resumed: int = 0
    queued: int = 0  # streams that waited in the gateway's queue, whatever their outcome
    failed: Counter[str] = field(default_factory=Counter)
    lost: int = 0

    def reply_ended(self, expected: str, text: str, agents: int) -> bool:
        """Count a reply that ended normally (exact or lost); whether it was exact."""
        if text != expected:
            self.lost += 1
            return False
        self.exact += 1
        self.resumed += agents > 1
        return True

    def failed_text(self) -> str:
        """The failed streams by code, e.g. `2 going_away, 1 no_capacity`."""
        return ", ".join(f"{n} {code}" for code, n in sorted(self.failed.items())) or "0"

    def row(self) -> str:
        """`streams | exact | resumed | queued | failed | lost` cells of the report."""
        return (
            f"{self.started} | {self.exact} | {self.resumed} | {self.queued} | "
            f"{self.failed_text()} | {self.lost}"
        )


class ChaosStack:
    """The emulator, the gateway and the pool manager (local provider), for one run.

    The pool is held at `agents` (its minimum and its maximum), each agent taking at most
    `agent_capacity` streams at once.
    """

    def __init__(
        self, directory: Path, agents: int, agent_capacity: int, engine: StackEngine = SYNTHETIC
    ) -> None:
        self.directory = directory
        self.agents = agents
        self.agent_capacity = agent_capacity
        self.engine = engine
        self.replies: dict[str, str] = {}  # vLLM: prompt → its uninterrupted greedy reply
        self.emulator = AwsEmulator()
        self.processes = ChildProcesses(directory / "logs")
        self.gateway: Child | None = None
        self.pool_manager: Child | None = None
        self.gateway_url = ""
        self.api_key = ""
        self.queue_url = ""

    async def __aenter__(self) -> ChaosStack:
        self.emulator.start()
        # moto's state belongs to the process: an earlier stack's agents (the same ids, some
        # `gone`) would refuse this stack's registrations.
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{self.emulator.url}/moto-api/reset") as response,
        ):
            response.raise_for_status()
        settings = self.emulator.settings()
        async with Registry.open(settings) as registry:
            await registry.create_tables()
            self.api_key = (await registry.create_key("chaos")).api_key
        async with aws_session(settings.aws).client(
            "sqs", endpoint_url=settings.aws.endpoint_url
        ) as sqs:
            self.queue_url = (await sqs.create_queue(QueueName="chaos-events"))["QueueUrl"]
        port = free_port()
        self.gateway_url = f"http://127.0.0.1:{port}"
        shared = settings.model_copy(update={"log_format": "json"})
        gateway = GatewaySettings(
            shared=shared,
            port=port,
            public_url=self.gateway_url,
            token=TokenSettings(signing_key_pem=SecretStr(SigningKey.generate().to_pem())),
            models=(self.engine.model,),
            queue=QueueSettings(deadline_seconds=60),
            shutdown_grace_seconds=GATEWAY_GRACE_SECONDS,
        )
        self.gateway = start_service(self.processes, "gateway", gateway)
        pool = PoolSettings(
            shared=shared,
            provider="local",
            models=(self.engine.model,),
            min_agents=self.agents,
            max_agents=self.agents,
            spot_overprovision=0,
            on_demand_fallback=False,
            loop_seconds=1,
            event_wait_seconds=0,
            port=0,
            interruption_queue_url=self.queue_url,
            local=self._local_pool(),
        )
        self.pool_manager = start_service(self.processes, "pool-manager", pool)
        return self

    def _local_pool(self) -> LocalPoolSettings:
        """How the pool manager runs its agents, and their engine."""
        local = LocalPoolSettings(
            served_model_name=self.engine.model,
            jwks_url=f"{self.gateway_url}/.well-known/jwks.json",
            drain_grace_seconds=15,
            log_dir=str(self.directory / "logs"),
        )
        agent = AgentSettings(heartbeat_seconds=AGENT_HEARTBEAT_SECONDS, imds_poll_seconds=1)
        if self.engine.kind == "synthetic":
            synthetic = SyntheticSettings(
                tokens_per_second=TOKENS_PER_SECOND, capacity=self.agent_capacity
            )
            agent_env = settings_env(agent.model_copy(update={"synthetic": synthetic}))
            return local.model_copy(update={"agent_env": agent_env})
        vllm = LOCAL_VLLM.model_copy(update={"max_num_seqs": self.agent_capacity})
        agent_env = {**settings_env(agent.model_copy(update={"vllm": vllm})), **VLLM_SHARED_CPU_ENV}
        model = str(write_tiny_model(self.directory / "tiny"))
        return local.model_copy(update={"engine": "vllm", "model": model, "agent_env": agent_env})

    def expected_reply(self, prompt: str) -> str:
        """The whole reply a stream of `prompt` must deliver."""
        if self.engine.kind == "synthetic":
            return synthetic_reply(prompt, self.engine.stream_tokens)
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

    def generate_frame(self, stream_id: str, prompt: str, session: str) -> dict[str, Any]:
        """A greedy `generate` frame for one stream of the engine's length."""
        return {
            "type": "generate", "id": stream_id, "model": self.engine.model,
            "max_tokens": self.engine.stream_tokens, "temperature": 0, "session": session,
            "messages": [{"role": "user", "content": prompt}],
        }  # fmt: skip

    async def __aexit__(self, *_exc: object) -> None:
        await self.processes.stop(lambda child: child.name == "pool-manager", 60)
        await self.processes.stop(lambda child: True, 30)
        self.processes.close()
        self.emulator.stop()

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

    async def restart_gateway(self) -> None:
        """SIGTERM the gateway (it drains), then start it again: same port, key and settings."""
        if self.gateway is None:
            raise RuntimeError("the stack is not running")
        self.gateway = await self.processes.restart(self.gateway, GATEWAY_STOP_TIMEOUT_SECONDS)

    async def wait_gateway_ready(self, within_seconds: float) -> None:
        """Poll `/readyz` until it answers 200."""
        deadline = time.monotonic() + within_seconds
        async with aiohttp.ClientSession() as http:
            while time.monotonic() < deadline:
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(f"{self.gateway_url}/readyz") as response:
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
            await sqs.send_message(QueueUrl=self.queue_url, MessageBody=json.dumps(body))


class Clients:
    """`streams` concurrent clients run as tasks until stopped; subclasses say what each does."""

    def __init__(self, stack: ChaosStack, streams: int, tally: Tally | None = None) -> None:
        self._stack = stack
        self._streams = streams
        self.tally = tally if tally is not None else Tally()
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        """Start every client."""
        self._tasks = [asyncio.create_task(self._client(n)) for n in range(self._streams)]

    async def stop(self) -> None:
        """Let each client finish its stream in flight, then stop."""
        self._stop.set()
        await self.finished()

    async def finished(self) -> None:
        """Wait for every client to end."""
        await asyncio.gather(*self._tasks)

    async def _client(self, number: int) -> None:
        raise NotImplementedError


class Traffic(Clients):
    """`streams` websocket clients, each streaming one known reply after another.

    Client `n` sends its streams in session `{name}-{n}`, so they stick to one agent while it
    serves; `rounds` caps the streams each client sends (None: until `stop`).
    """

    def __init__(
        self,
        stack: ChaosStack,
        streams: int,
        *,
        name: str = "client",
        rounds: int | None = None,
        tally: Tally | None = None,
    ) -> None:
        super().__init__(stack, streams, tally)
        self._name = name
        self._rounds = rounds
        self.serving: Counter[str] = Counter()  # agent id → streams it is replying to now
        self.placed: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)  # by agent id
        self.replying = asyncio.Event()
        self.completed = asyncio.Event()  # set by every exact stream; clear it to await one

    def busiest_first(self, ready: dict[str, str]) -> dict[str, str]:
        """`ready`, the agents with the most streams in flight first."""
        return dict(sorted(ready.items(), key=lambda item: -self.serving[item[0]]))

    def _goes_on(self, sent: int) -> bool:
        return not self._stop.is_set() and (self._rounds is None or sent < self._rounds)

    async def _client(self, number: int) -> None:
        url = self._stack.gateway_url.replace("http", "ws", 1) + "/v1/ws"
        headers = {"Authorization": f"Bearer {self._stack.api_key}"}
        session = f"{self._name}-{number}"
        sent = 0
        while self._goes_on(sent):
            try:
                async with websockets.connect(url, additional_headers=headers) as ws:
                    while self._goes_on(sent):
                        sent += 1
                        prompt = self._stack.engine.prompt(self._name, number, sent)
                        await self._one_stream(ws, f"{session}-{sent}", prompt, session)
            except (OSError, websockets.WebSocketException):
                await asyncio.sleep(RECONNECT_PAUSE_SECONDS)  # the gateway went away

    async def _one_stream(self, ws: Any, stream_id: str, prompt: str, session: str) -> None:
        await ws.send(json.dumps(self._stack.generate_frame(stream_id, prompt, session)))
        self.tally.started += 1
        text: list[str] = []
        agents: set[str] = set()
        serving = ""
        queued = False
        try:
            async with asyncio.timeout(STREAM_TIMEOUT_SECONDS):
                while True:
                    frame = json.loads(await ws.recv())
                    if frame.get("id") != stream_id:
                        continue
                    if frame["type"] == "queued":
                        queued = True
                    elif frame["type"] == "start":
                        self.serving.subtract(agents & {serving})
                        serving = frame["agent"]
                        agents.add(serving)
                        self.serving[serving] += 1
                        self.placed[serving].set()
                    elif frame["type"] == "delta":
                        text.append(frame["text"])
                        self.replying.set()
                    elif frame["type"] == "error":
                        self.tally.failed[frame["code"]] += 1
                        await asyncio.sleep(frame.get("retry_after") or FAILED_STREAM_PAUSE_SECONDS)
                        return
                    elif frame["type"] == "done":
                        break
        except websockets.ConnectionClosed as closed:
            if closed.rcvd is None or closed.rcvd.code != GOING_AWAY:
                self.tally.lost += 1
            else:  # the gateway said it is going away: a clear end, the client reconnects
                self.tally.failed["going_away"] += 1
            raise
        except (TimeoutError, websockets.WebSocketException):
            self.tally.lost += 1  # no end at all: the one outcome that must never happen
            raise websockets.ConnectionClosed(None, None) from None
        finally:
            self.serving.subtract(agents & {serving})
            self.tally.queued += queued
        expected = self._stack.expected_reply(prompt)
        if self.tally.reply_ended(expected, "".join(text), len(agents)):
            self.completed.set()


Fault = Callable[[ChaosStack, Traffic, dict[str, str]], Awaitable[set[str]]]
"""Inject a fault into running traffic, given the ready agents (id → URL, busiest first);
return the agents it took out."""


async def kill_9(stack: ChaosStack, traffic: Traffic, ready: dict[str, str]) -> set[str]:
    """SIGKILL one serving agent."""
    victim, process = next(iter(stack.serving_processes(ready).items()))
    process.send_signal(signal.SIGKILL)
    return {victim}


async def spot_notice(stack: ChaosStack, traffic: Traffic, ready: dict[str, str]) -> set[str]:
    """A spot interruption with a 20-second deadline."""
    victim = next(iter(stack.serving_processes(ready)))
    await stack.interrupt(victim, NOTICE_SECONDS)
    return {victim}


async def two_interrupted(stack: ChaosStack, traffic: Traffic, ready: dict[str, str]) -> set[str]:
    """Two agents interrupted at once (20-second deadline)."""
    victims = set(list(stack.serving_processes(ready))[:2])
    await asyncio.gather(*(stack.interrupt(v, NOTICE_SECONDS) for v in victims))
    return victims


async def hang(stack: ChaosStack, traffic: Traffic, ready: dict[str, str]) -> set[str]:
    """An agent that stops answering but keeps its sockets open (SIGSTOP), killed later."""
    victim, process = next(iter(stack.serving_processes(ready).items()))
    process.suspend()
    kill_in_seconds = stack.engine.recovery_timeout_seconds / 2
    asyncio.get_running_loop().call_later(kill_in_seconds, _kill_quietly, process)
    return {victim}


def _kill_quietly(process: psutil.Process) -> None:
    with contextlib.suppress(psutil.NoSuchProcess):
        process.kill()


def aws_down(seconds: float) -> Fault:
    """The AWS emulator (DynamoDB, SQS) unreachable for `seconds`."""

    async def fault(stack: ChaosStack, _traffic: Traffic, _ready: dict[str, str]) -> set[str]:
        stack.emulator.stop()
        await asyncio.sleep(seconds)
        stack.emulator.start()
        return set()

    fault.__doc__ = f"the AWS emulator stopped for {seconds:.0f} s"
    return fault


async def gateway_restart(stack: ChaosStack, traffic: Traffic, _ready: dict[str, str]) -> set[str]:
    """SIGTERM the gateway, start a new one on its port; done once the new one ends a stream."""
    await stack.restart_gateway()
    await stack.wait_gateway_ready(READY_TIMEOUT_SECONDS)
    traffic.completed.clear()  # the old gateway is gone: the next exact stream is the new one's
    async with asyncio.timeout(STREAM_TIMEOUT_SECONDS):
        await traffic.completed.wait()
    return set()


async def dies_after_registering(
    stack: ChaosStack, traffic: Traffic, ready: dict[str, str]
) -> set[str]:
    """SIGKILL a serving agent, then its replacement as soon as it registers ready.

    The replacement dies before its first heartbeat, once it has a stream or shortly after
    it registers, so its entry looks healthy to the gateway until it expires.
    """
    before = set(stack.agent_processes())
    victims = await kill_9(stack, traffic, ready)
    async with asyncio.timeout(stack.engine.ready_timeout_seconds):
        while not (fresh := stack.agent_processes().keys() - before):  # noqa: ASYNC110 - polled
            await asyncio.sleep(REGISTRY_POLL_SECONDS)
        newcomer = fresh.pop()
        process = stack.agent_processes()[newcomer]
        async with Registry.open(stack.emulator.settings()) as registry:
            record = None
            while record is None or record.ready_at is None:
                await asyncio.sleep(REGISTRY_POLL_SECONDS)
                record = await registry.get_agent(newcomer)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(traffic.placed[newcomer].wait(), NEWCOMER_LIFETIME_SECONDS)
            process.kill()
            record = await registry.get_agent(newcomer)
    if record is None or record.heartbeat_at != record.ready_at:
        raise RuntimeError(f"{newcomer} sent a heartbeat before it was killed")
    return victims | {newcomer}


async def full_pool(stack: ChaosStack, traffic: Traffic, _ready: dict[str, str]) -> set[str]:
    """As many streams again as the whole pool holds, at once: the surplus must queue."""
    surplus = Traffic(
        stack, stack.agents * stack.agent_capacity, name="surge", rounds=1, tally=traffic.tally
    )
    surplus.start()
    await surplus.finished()
    return set()


@dataclass(frozen=True)
class Outcome:
    """One scenario's row of the report."""

    name: str
    tally: Tally
    recovery_seconds: float | None


async def run_scenario(
    stack: ChaosStack, name: str, fault: Fault, streams: int, settle_seconds: float
) -> Outcome:
    """Steady traffic, the fault, recovery, more traffic; every stream accounted for."""
    if await stack.wait_ready(set(), stack.engine.ready_timeout_seconds) is None:
        raise RuntimeError(f"{name}: the pool did not reach its target before the fault")
    traffic = Traffic(stack, streams)
    traffic.start()
    await traffic.replying.wait()
    await asyncio.sleep(1.0)  # streams are mid-reply when the fault lands
    faulted_at = time.monotonic()
    victims = await fault(stack, traffic, traffic.busiest_first(await stack.ready_agents()))
    remaining = stack.engine.recovery_timeout_seconds - (time.monotonic() - faulted_at)
    recovered = await stack.wait_ready(victims, remaining)
    recovery = None if recovered is None else time.monotonic() - faulted_at
    await asyncio.sleep(settle_seconds)
    await traffic.stop()
    return Outcome(name, traffic.tally, recovery)


SCENARIOS: dict[str, Callable[[float], Fault]] = {
    "kill -9 of a serving agent": lambda _: kill_9,
    "spot notice, 20 s deadline": lambda _: spot_notice,
    "two agents interrupted at once": lambda _: two_interrupted,
    "agent hangs (SIGSTOP), socket open": lambda _: hang,
    "AWS (moto server) stopped": aws_down,
    "gateway restarted (SIGTERM, new process)": lambda _: gateway_restart,
    "replacement killed before its first heartbeat": lambda _: dies_after_registering,
    "full pool: a surge of its whole capacity": lambda _: full_pool,
}


@contextlib.asynccontextmanager
async def chaos_stack(
    agents: int, agent_capacity: int, engine: StackEngine = SYNTHETIC
) -> AsyncIterator[ChaosStack]:
    """A stack in a scratch directory."""
    with tempfile.TemporaryDirectory(prefix="spotgate-chaos-") as scratch:
        async with ChaosStack(Path(scratch), agents, agent_capacity, engine) as stack:
            yield stack


async def run_all(
    agents: int,
    streams: int,
    aws_down_seconds: float,
    settle_seconds: float,
    engine: StackEngine = SYNTHETIC,
    scenarios: Sequence[str] = tuple(SCENARIOS),
) -> list[Outcome]:
    """The `scenarios` (all by default), one after another, on one stack.

    Each agent takes `streams` streams at once: one agent alone can carry the whole steady
    traffic while the others are faulted, and the full pool needs a surge beyond it.
    """
    outcomes = []
    async with chaos_stack(agents, streams, engine) as stack:
        if engine.kind == "vllm":
            if await stack.wait_ready(set(), engine.ready_timeout_seconds) is None:
                raise RuntimeError("the pool did not reach its target")
            await stack.learn_replies(agents * streams)  # the surge's clients too
        for name in scenarios:
            make = SCENARIOS[name]
            fault = make(aws_down_seconds)
            label = f"{name} ({aws_down_seconds:.0f} s)" if make is aws_down else name
            outcomes.append(await run_scenario(stack, label, fault, streams, settle_seconds))
    return outcomes


VLLM_RECOVERY_NOTE = (
    " A replacement's recovery includes its engine's start (importing vLLM, loading the "
    "model, a first generation), here on the cores a busy engine is decoding on: minutes, "
    "where two replacements with no traffic to serve start in about one. Every engine runs "
    "with `VLLM_CPU_OMP_THREADS_BIND=nobind` and one OpenMP thread, so several share the "
    "cores."
)


def render(outcomes: list[Outcome], agents: int, streams: int, engine: StackEngine) -> str:
    """The scenario table for `docs/reliability.md`."""
    if engine.kind == "synthetic":
        title = "synthetic engine"
        replies = (
            f"stream one {STREAM_TOKENS}-token reply after another "
            f"({STREAM_TOKENS / TOKENS_PER_SECOND:.0f} s each)"
        )
    else:
        title = "vLLM CPU engine, tiny model"
        replies = (
            f"stream one greedy reply of up to {engine.stream_tokens} tokens after another, the "
            "same prompt each time (each client number's reply was first taken from an "
            "uninterrupted run)"
        )
    lines = [
        f"## Fault scenarios under steady traffic (local stack, {title})",
        "",
        f"Command: `{command(engine, agents, streams)}`.",
        f"The pool manager (local provider) holds the pool at {agents} agents (its minimum and "
        f"maximum), each taking {streams} streams at once; {streams} websocket clients, each in "
        f"a session of its own, {replies} through the gateway. The full pool's "
        f"surge adds {agents * streams} clients sending one stream each. *exact*: the whole "
        "reply, byte for byte; *resumed*: exact and served by two agents or more; *queued*: "
        "waited in the gateway's queue for an agent with room; *failed*: ended with an error "
        "frame (its code), or `going_away`: the gateway closed the socket mid-stream with 1001; "
        "*lost*: ended wrong or not at all. *Recovery*: fault to the pool back at its target "
        "with no faulted agent; for the gateway restart, SIGTERM to the new gateway ready and "
        "done with a stream; for the full pool, the surge's start to its last stream's end."
        + ("" if engine.kind == "synthetic" else VLLM_RECOVERY_NOTE),
        f"Machine: {machine_facts()}.",
        "",
        "| scenario | streams | exact | resumed | queued | failed | lost | recovery |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for outcome in outcomes:
        recovery = "—" if outcome.recovery_seconds is None else f"{outcome.recovery_seconds:.1f} s"
        lines.append(f"| {outcome.name} | {outcome.tally.row()} | {recovery} |")
    return "\n".join(lines)


def command(engine: StackEngine, agents: int, streams: int) -> str:
    """The command line that writes the table."""
    options = "" if engine is SYNTHETIC else f" --engine {engine.kind}"
    if (agents, streams) != (DEFAULT_AGENTS, DEFAULT_STREAMS):
        options += f" --agents {agents} --streams {streams}"
    return COMMAND.replace(" --write", f"{options} --write")


def main() -> None:
    """Run the scenarios and print (and optionally write) the table."""
    parser = argparse.ArgumentParser(description="spotgate fault scenarios")
    parser.add_argument("--engine", choices=sorted(ENGINES), default="synthetic")
    parser.add_argument("--agents", type=int, default=DEFAULT_AGENTS)
    parser.add_argument("--streams", type=int, default=DEFAULT_STREAMS)
    parser.add_argument("--aws-down-seconds", type=float, default=30.0)
    parser.add_argument("--settle-seconds", type=float, default=5.0)
    parser.add_argument("--write", type=Path)
    args = parser.parse_args()
    engine = ENGINES[args.engine]
    outcomes = asyncio.run(
        run_all(args.agents, args.streams, args.aws_down_seconds, args.settle_seconds, engine)
    )
    section = render(outcomes, args.agents, args.streams, engine)
    print(section)
    if args.write:
        if not args.write.exists():
            args.write.write_text(REPORT_TITLE)
        write_section(args.write, "chaos" if engine is SYNTHETIC else "chaos-vllm", section)
    if any(outcome.tally.lost for outcome in outcomes):
        raise SystemExit("streams were lost")


if __name__ == "__main__":
    main()
