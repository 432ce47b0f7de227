"""One builder for every local stack: a typed `StackSpec` in, its processes up in order.

`spotgate up`, the fault scenarios, the hostile-input battery and the tests describe what
they run as a `StackSpec` (the AWS emulator, a limit store, gateway replicas with their
settings, agents run directly or a pool manager with its provider); `LocalStack` starts the
parts in that order, fills in what only exists once an earlier part runs (the emulator's
endpoint, the store's URL, the queue's URL, the chat page's key), supervises them when asked
(`stack.supervision`), and stops them in reverse: the pool manager first (it drains its
agents), then the other children, the store, the emulator.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp
from pydantic import SecretStr

from pool_manager.launches import vouch_for_agent
from spotgate.file_store import FileStore
from spotgate.process import Child, ChildExited, ChildProcesses, free_port, socket_port
from spotgate.registry import CreatedApiKey, Registry, aws_session
from spotgate.settings import (
    DEFAULT_AGENT_CAPACITY,
    AgentSettings,
    AwsSettings,
    GatewaySettings,
    PoolSettings,
    SharedSettings,
    emulator_settings,
)
from stack.children import GatewaySockets, start_service
from stack.redis_server import RedisServer
from stack.supervision import GaveUp, Supervisor

if TYPE_CHECKING:
    from stack.emulator import AwsEmulator

POOL_MANAGER = "pool-manager"
EMULATOR = "aws-emulator"
READY_TIMEOUT_SECONDS = 600.0
READY_POLL_SECONDS = 0.2
INTERRUPTION_RULE_NAME = "spotgate-ec2-events"


def replica_name(index: int) -> str:
    """Gateway replica `index`'s name: `gateway`, then `gateway-2` and so on."""
    return "gateway" if index == 0 else f"gateway-{index + 1}"


class StackFailed(RuntimeError):
    """A part of a local stack did not come up, or kept failing; the message says which."""


@dataclass(frozen=True, slots=True)
class ApiKeySpec:
    """An API key the stack creates in its registry before its services start."""

    name: str
    tpm: int | None = None
    max_tokens: int | None = None
    tenant: str | None = None  # whose prefix cache and fair turn it shares (None: its own)


@dataclass(frozen=True, slots=True)
class GatewayReplica:
    """One gateway replica: its name (and log's), its settings and its bound sockets."""

    name: str
    settings: GatewaySettings
    sockets: GatewaySockets
    cpus: frozenset[int] | None = None  # pinned to these (a benchmark's relay side)


@dataclass(frozen=True, slots=True)
class AgentProcess:
    """An agent run directly, on its bound socket, vouched for as a pool manager would."""

    name: str
    settings: AgentSettings
    socket: socket.socket
    capacity: int = DEFAULT_AGENT_CAPACITY  # streams its launch record vouches it serves
    cpus: frozenset[int] | None = None  # pinned to these (a benchmark's engine per CPU)
    env: dict[str, str] = field(default_factory=dict)  # its engine's own variables

    @property
    def url(self) -> str:
        """Where gateways reach it: the URL it advertises, else its socket's."""
        return self.settings.advertise_url or f"http://127.0.0.1:{socket_port(self.socket)}"

    @property
    def agent_id(self) -> str:
        """The id its settings give it (an agent run directly is named by them)."""
        if self.settings.agent_id is None:
            raise ValueError(f"{self.name}: an agent run directly needs an agent_id")
        return self.settings.agent_id

    @property
    def model(self) -> str:
        """The model it serves, by the name its settings give it."""
        if self.settings.served_model_name is None:
            raise ValueError(f"{self.name}: an agent run directly needs a served_model_name")
        return self.settings.served_model_name


@dataclass(frozen=True, slots=True)
class StackSpec:
    """What a local stack runs, as typed settings; `LocalStack` starts it in this order.

    Each service's `shared` AWS settings, a gateway's `limit_store` (with `limit_store`) and
    `chat_dev_api_key` (with `chat_key`), and the pool's `interruption_queue_url` (with
    `interruption_queue`) are filled in once the part they name runs.
    """

    log_dir: Path
    # Logging and the rest of what every service shares; its AWS part is the emulator's.
    shared: SharedSettings
    # Forget what an earlier stack in this process left in the emulator (moto's state is the
    # process's): its agents, some `gone`, would refuse this stack's registrations.
    fresh_emulator: bool = False
    # The emulator in a process of its own (`python -m stack.emulator`), pinned to
    # `emulator_cpus` if given, as the benchmarks run it: its request handling never holds
    # the load generator's interpreter, nor only one path's CPUs.
    emulator_process: bool = False
    emulator_cpus: frozenset[int] | None = None
    # An emulator already running (a test session's): the stack starts none and leaves it.
    running_emulator: AwsSettings | None = None
    # The in-process emulator's journal (`stack.aws_journal`): keys, usage, files and batches
    # outlive the stack, even killed, and the next stack with the same file goes on from them.
    aws_journal: Path | None = None
    keys: tuple[ApiKeySpec, ...] = ()
    chat_key: str | None = None  # the name of the key the gateways' chat page uses
    limit_store: bool = False
    interruption_queue: str | None = None  # the SQS queue (and EventBridge rule) the pool reads
    agents: tuple[AgentProcess, ...] = ()
    gateways: tuple[GatewayReplica, ...] = ()
    pool: PoolSettings | None = None
    # Restart what exits, as ECS does (a child on its sockets, the store empty on its port).
    supervise: bool = False
    # False: the store is left to whoever runs the stack (a fault that stops it on purpose).
    supervise_limit_store: bool = True
    stop_timeout_seconds: float = 30.0
    pool_stop_timeout_seconds: float = 60.0


class LocalStack:
    """The processes of a `StackSpec`: started in order on entry, stopped in reverse on exit.

    A failure to start stops what had started. With `supervise`, a process that keeps
    failing ends `gave_up()`, and the exit raises `StackFailed` saying which.
    """

    def __init__(self, spec: StackSpec) -> None:
        self.spec = spec
        self.processes = ChildProcesses(spec.log_dir)
        self.limit_store = RedisServer(log=spec.log_dir / "redis.log") if spec.limit_store else None
        self.keys: dict[str, CreatedApiKey] = {}
        self.queue_url = ""
        self.supervisor: Supervisor | None = None
        self._emulator: AwsEmulator | None = None
        self._aws: AwsSettings | None = None
        self._supervising: asyncio.Task[GaveUp] | None = None

    @property
    def emulator(self) -> AwsEmulator:
        """The AWS emulator running in this process."""
        if self._emulator is None:
            raise RuntimeError("the stack's emulator does not run in this process")
        return self._emulator

    @property
    def shared(self) -> SharedSettings:
        """The spec's shared settings, reaching this stack's emulator."""
        if self._aws is None:
            raise RuntimeError("the stack is not started")
        return self.spec.shared.model_copy(update={"aws": self._aws})

    def child(self, name: str) -> Child | None:
        """The process running as `name` now (a restarted one is a new process)."""
        return next((child for child in self.processes.children if child.name == name), None)

    async def __aenter__(self) -> LocalStack:
        try:
            await self._start()
        except BaseException:
            await self._stop()
            raise
        return self

    async def __aexit__(self, *_exc: object) -> None:
        gave_up = await self._stop()
        if gave_up is not None:
            raise StackFailed(gave_up.message())

    async def _start(self) -> None:
        if self.spec.running_emulator is not None:
            self._aws = self.spec.running_emulator
        elif self.spec.emulator_process:
            self._aws = await self._start_emulator_process()
        else:
            self._emulator = _start_emulator(self.spec.aws_journal, self.spec.shared)
            self._aws = self._emulator.settings().aws
        if self.spec.fresh_emulator:
            async with (
                aiohttp.ClientSession() as http,
                http.post(f"{self._aws.endpoint_url}/moto-api/reset") as response,
            ):
                response.raise_for_status()
        async with Registry.open(self.shared) as registry, FileStore.open(self.shared) as files:
            await registry.create_tables()
            await files.create_bucket()
            for key in self.spec.keys:
                self.keys[key.name] = await registry.create_key(
                    key.name, tpm=key.tpm, max_tokens=key.max_tokens, tenant=key.tenant
                )
        if self.limit_store is not None:
            try:
                self.limit_store.start()
            except RuntimeError as err:
                raise StackFailed(f"the limit store did not start: {err}") from err
        if self.spec.interruption_queue is not None:
            self.queue_url = await _create_interruption_queue(
                self.shared, self.spec.interruption_queue
            )
        for replica in self.spec.gateways:
            self.start_gateway(replica)
        for replica in self.spec.gateways:
            await self.wait_gateway_ready(replica, READY_TIMEOUT_SECONDS)
        for agent in self.spec.agents:
            await self.start_agent(agent)
        if self.spec.pool is not None:
            pool = self.spec.pool.model_copy(update={"shared": self.shared})
            if self.queue_url:
                pool = pool.model_copy(update={"interruption_queue_url": self.queue_url})
            start_service(self.processes, POOL_MANAGER, pool)
        if self.spec.supervise:
            self.supervisor = Supervisor(
                self.processes,
                lambda _child: True,
                others=self._supervised_store(),
                stop_timeout_seconds=self.spec.stop_timeout_seconds,
            )
            self._supervising = asyncio.create_task(self.supervisor.run(), name="supervise")

    def _supervised_store(self) -> tuple[RedisServer, ...]:
        if self.limit_store is None or not self.spec.supervise_limit_store:
            return ()
        return (self.limit_store,)

    def gateway_settings(self, replica: GatewayReplica) -> GatewaySettings:
        """A replica's settings, reaching this stack's emulator, store and chat key."""
        update: dict[str, object] = {"shared": self.shared}
        if self.limit_store is not None:
            update["limit_store"] = self.limit_store.settings()
        if self.spec.chat_key is not None:
            update["chat_dev_api_key"] = SecretStr(self.keys[self.spec.chat_key].api_key)
        return replica.settings.model_copy(update=update)

    def start_gateway(self, replica: GatewayReplica) -> Child:
        """Run a gateway replica as a child of this stack, on its sockets."""
        settings = self.gateway_settings(replica)
        child = start_service(self.processes, replica.name, settings, replica.sockets)
        return _pinned(child, replica.cpus)

    async def start_agent(self, agent: AgentProcess) -> Child:
        """Vouch for an agent as a pool manager would, then run it as a child on its socket.

        The caller owns the socket of an agent the spec does not name.
        """
        async with Registry.open(self.shared) as registry:
            await vouch_for_agent(
                registry,
                agent_id=agent.agent_id,
                model=agent.model,
                url=agent.url,
                capacity=agent.capacity,
            )
        settings = agent.settings.model_copy(update={"shared": self.shared})
        child = start_service(self.processes, agent.name, settings, agent.socket, agent.env)
        return _pinned(child, agent.cpus)

    async def _start_emulator_process(self) -> AwsSettings:
        """The emulator as a child; its settings once it accepts connections."""
        from stack.emulator import EMULATOR_REGION

        port = free_port()
        child = self.processes.start(EMULATOR, ["stack.emulator", "--port", str(port)], {})
        _pinned(child, self.spec.emulator_cpus)
        await self.wait_accepting(port, child, READY_TIMEOUT_SECONDS)
        return emulator_settings(f"http://127.0.0.1:{port}", EMULATOR_REGION).aws

    async def wait_accepting(self, port: int, child: Child, within_seconds: float) -> None:
        """Until `child` accepts connections on the loopback `port` (`StackFailed` if not)."""
        deadline = time.monotonic() + within_seconds
        while not await _accepts(port):
            self.check()
            if time.monotonic() > deadline:
                raise StackFailed(f"{child.name} did not start; see {child.log}")
            await asyncio.sleep(READY_POLL_SECONDS)

    def check(self) -> None:
        """Raise `StackFailed` if a child has exited."""
        try:
            self.processes.check()
        except ChildExited as err:
            raise StackFailed(str(err)) from err

    async def wait_gateway_ready(self, replica: GatewayReplica, within_seconds: float) -> None:
        """Poll a replica's `/readyz` until it answers 200 (`StackFailed` if not in time)."""
        url = f"{replica.sockets.ops_url}/readyz"
        deadline = time.monotonic() + within_seconds
        async with aiohttp.ClientSession() as http:
            while time.monotonic() < deadline:
                self.check()
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(url) as response:
                        if response.status == 200:
                            return
                await asyncio.sleep(READY_POLL_SECONDS)
        raise StackFailed(f"the gateway at {replica.sockets.url} did not answer at {url} in time")

    async def gave_up(self) -> GaveUp:
        """Wait until the supervisor gives up on a process that keeps failing."""
        if self._supervising is None:
            raise RuntimeError("the stack is not supervised")
        return await asyncio.shield(self._supervising)

    async def _stop(self) -> GaveUp | None:
        gave_up = None
        if self._supervising is not None:  # first: nothing is restarted from here on
            self._supervising.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                gave_up = await self._supervising
        spec = self.spec
        await self.processes.stop(lambda c: c.name == POOL_MANAGER, spec.pool_stop_timeout_seconds)
        # The emulator last: agents and gateways leave the registry as they stop.
        await self.processes.stop(lambda c: c.name != EMULATOR, spec.stop_timeout_seconds)
        await self.processes.stop(lambda _child: True, spec.stop_timeout_seconds)
        self.processes.close()
        if self.limit_store is not None:
            self.limit_store.stop()
        if self._emulator is not None:
            self._emulator.stop()
        for replica in spec.gateways:
            replica.sockets.close()
        for agent in spec.agents:
            agent.socket.close()
        return gave_up


def _pinned(child: Child, cpus: frozenset[int] | None) -> Child:
    """The child, run on `cpus` from now on (None: wherever the kernel likes)."""
    if cpus is not None:
        os.sched_setaffinity(child.process.pid, cpus)
    return child


async def _accepts(port: int) -> bool:
    """Whether something accepts connections on the loopback `port`."""
    try:
        _reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    writer.close()
    await writer.wait_closed()
    return True


def _start_emulator(journal_path: Path | None, shared: SharedSettings) -> AwsEmulator:
    try:  # moto is heavy, and an extra of its own: only local stacks need it
        from stack.aws_journal import AwsJournal, Kept
        from stack.emulator import AwsEmulator
    except ImportError as err:
        raise StackFailed(
            f"the local AWS emulator is not installed ({err}); pip install 'spotgate[local]'"
        ) from err
    journal = AwsJournal(journal_path, Kept.of(shared)) if journal_path is not None else None
    emulator = AwsEmulator(journal=journal)
    emulator.start()
    return emulator


async def _create_interruption_queue(settings: SharedSettings, name: str) -> str:
    """The SQS queue and the EventBridge rule feeding it EC2's spot and state events."""
    from pool_manager.events import EC2_EVENT_PATTERN  # the rule the pool manager expects

    session = aws_session(settings.aws)
    endpoint = settings.aws.endpoint_url
    async with session.client("sqs", endpoint_url=endpoint) as sqs:
        queue_url = (await sqs.create_queue(QueueName=name))["QueueUrl"]
        attributes = await sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])
    async with session.client("events", endpoint_url=endpoint) as events:
        await events.put_rule(
            Name=INTERRUPTION_RULE_NAME, EventPattern=json.dumps(EC2_EVENT_PATTERN)
        )
        await events.put_targets(
            Rule=INTERRUPTION_RULE_NAME,
            Targets=[{"Id": "pool-manager", "Arn": attributes["Attributes"]["QueueArn"]}],
        )
    return str(queue_url)
