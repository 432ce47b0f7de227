"""`spotgate up`: the whole system on one machine (DESIGN.md §7), and how commands find it.

It starts an embedded AWS emulator (moto server, real HTTP) with spotgate's tables and a dev
API key, then the gateway and N agents as processes of their own (each agent with its own
IMDS emulator, so interruptions can be injected), waits until every agent is registered
ready, prints one `spotgate ready:` line and writes the same to `.spotgate/up.json`, so that
`spotgate keys …` run from the same directory act on this stack. Ctrl-C drains the agents,
stops the gateway and the emulator. Process logs go to `.spotgate/logs/`.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO

import aiohttp

from spotgate.process import free_port
from spotgate.registry import Registry
from spotgate.settings import SharedSettings, emulator_settings
from spotgate.tokens import SigningKey

UP_DIR = Path(".spotgate")
UP_FILE = UP_DIR / "up.json"
LOG_DIR = UP_DIR / "logs"
TINY_MODEL_DIR = UP_DIR / "models" / "tiny"
TINY_SERVED_NAME = "tiny"
SYNTHETIC_SERVED_NAME = "synthetic"
START_TIMEOUT_SECONDS = 600.0
STOP_TIMEOUT_SECONDS = 120.0


class UpFailed(RuntimeError):
    """A part of the local stack did not come up; the message says which and where to look."""


@dataclass(frozen=True, slots=True)
class UpOptions:
    """What `spotgate up` was asked to run."""

    port: int = 8080
    agents: int = 1
    engine: str = "vllm"
    model: Path | None = None


@dataclass(frozen=True, slots=True)
class LocalStackInfo:
    """What `spotgate up` started, as written to `.spotgate/up.json`."""

    aws_endpoint_url: str
    region: str
    api_key: str
    gateway_url: str | None = None
    chat_url: str | None = None
    model: str | None = None
    agents: list[dict[str, str]] = field(default_factory=list)

    def ready_line(self) -> str:
        """The one line `spotgate up` prints once everything answers."""
        return f"spotgate ready: gateway={self.gateway_url} chat={self.chat_url} key={self.api_key}"

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


@dataclass
class _Process:
    name: str
    process: subprocess.Popen[bytes]
    log: Path


class _Processes:
    """The stack's child processes, each logging to its own file."""

    def __init__(self, directory: Path) -> None:
        self._log_dir = directory / LOG_DIR
        self._log_dir.mkdir(parents=True, exist_ok=True)
        self.running: list[_Process] = []
        self._handles: list[IO[bytes]] = []

    def start(self, name: str, args: list[str], env: dict[str, str]) -> _Process:
        log = self._log_dir / f"{name}.log"
        handle = log.open("wb")
        self._handles.append(handle)
        process = subprocess.Popen(  # noqa: S603 - our own interpreter and modules
            [sys.executable, "-m", *args],
            env={**os.environ, **env},
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches `up`, which stops children in order
        )
        started = _Process(name, process, log)
        self.running.append(started)
        return started

    def check(self) -> None:
        for child in self.running:
            if child.process.poll() is not None:
                raise UpFailed(
                    f"{child.name} exited with {child.process.returncode}; see {child.log}"
                )

    async def stop(self, names: Callable[[str], bool]) -> None:
        chosen = [child for child in self.running if names(child.name)]
        for child in chosen:
            if child.process.poll() is None:
                child.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
        for child in chosen:
            try:
                remaining = max(0.0, deadline - time.monotonic())
                await asyncio.to_thread(child.process.wait, remaining)
            except subprocess.TimeoutExpired:
                child.process.kill()
                child.process.wait()

    def close(self) -> None:
        for child in self.running:
            if child.process.poll() is None:
                child.process.kill()
                child.process.wait()
        for handle in self._handles:
            handle.close()


def _aws_env(info_url: str, region: str) -> dict[str, str]:
    return {
        "SPOTGATE_AWS__ENDPOINT_URL": info_url,
        "SPOTGATE_AWS__REGION": region,
        "SPOTGATE_AWS__ACCESS_KEY_ID": "local",
        "SPOTGATE_AWS__SECRET_ACCESS_KEY": "local",
        "SPOTGATE_LOG_FORMAT": "json",
    }


async def _wait_http_ok(url: str, processes: _Processes, what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            processes.check()
            try:
                async with http.get(url) as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.2)
    raise UpFailed(f"{what} did not answer at {url} in time")


async def _wait_agents_ready(
    registry: Registry, model: str, count: int, processes: _Processes
) -> list[str]:
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        processes.check()
        ready = await registry.list_ready(model)
        if len(ready) >= count:
            return [agent.agent_id for agent in ready]
        await asyncio.sleep(0.5)
    raise UpFailed(f"agents did not register ready in time; see {LOG_DIR}/agent-*.log")


def _model_for(options: UpOptions, directory: Path) -> tuple[str, str]:
    """(model path, served name) for the agents; the tiny model is generated on first run."""
    if options.engine == "synthetic":
        return "", SYNTHETIC_SERVED_NAME
    if options.model is not None:
        return str(options.model), options.model.name
    tiny = directory / TINY_MODEL_DIR
    if not (tiny / "config.json").exists():
        result = subprocess.run(  # noqa: S603 - our own CLI
            [sys.executable, "-m", "spotgate.cli", "model", "tiny", "--out", str(tiny)],
            capture_output=True,
            check=False,
        )
        if result.returncode != 0:
            raise UpFailed(f"could not write the tiny model: {result.stderr.decode()[-500:]}")
    return str(tiny), TINY_SERVED_NAME


async def run_up(directory: Path, options: UpOptions, *, announce: Callable[[str], None]) -> int:
    """Start the local stack, announce it, and run until SIGINT or SIGTERM."""
    from spotgate.emulator import EMULATOR_REGION, AwsEmulator  # moto is heavy: only `up` needs it

    model_path, served = _model_for(options, directory)
    emulator = AwsEmulator()
    emulator.start()
    processes = _Processes(directory)
    up_file = directory / UP_FILE
    try:
        async with Registry.open(emulator.settings()) as registry:
            await registry.create_tables()
            created = await registry.create_key("dev")
            gateway_url = f"http://127.0.0.1:{options.port}"
            aws_env = _aws_env(emulator.url, EMULATOR_REGION)
            processes.start(
                "gateway",
                ["spotgate.cli", "gateway"],
                {
                    **aws_env,
                    "SPOTGATE_GATEWAY_PORT": str(options.port),
                    "SPOTGATE_GATEWAY_PUBLIC_URL": gateway_url,
                    "SPOTGATE_GATEWAY_TOKEN__SIGNING_KEY_PEM": SigningKey.generate().to_pem(),
                    "SPOTGATE_GATEWAY_MODELS": json.dumps([served]),
                    "SPOTGATE_GATEWAY_CHAT_DEV_API_KEY": created.api_key,
                },
            )
            await _wait_http_ok(f"{gateway_url}/readyz", processes, "the gateway")
            agents = []
            for index in range(options.agents):
                agent_id = f"local-{index + 1}"
                port, imds_port = free_port(), free_port()
                imds_url = f"http://127.0.0.1:{imds_port}"
                processes.start(
                    f"imds-{agent_id}",
                    ["gpu_agent.imds_emulator", "--port", str(imds_port),
                     "--instance-id", agent_id, "--lifecycle", "spot"],
                    {},
                )  # fmt: skip
                processes.start(
                    f"agent-{agent_id}",
                    ["spotgate.cli", "agent"],
                    {
                        **aws_env,
                        "SPOTGATE_AGENT_AGENT_ID": agent_id,
                        "SPOTGATE_AGENT_PORT": str(port),
                        "SPOTGATE_AGENT_ENGINE": options.engine,
                        "SPOTGATE_AGENT_MODEL": model_path,
                        "SPOTGATE_AGENT_SERVED_MODEL_NAME": served,
                        "SPOTGATE_AGENT_JWKS_URL": f"{gateway_url}/.well-known/jwks.json",
                        "SPOTGATE_AGENT_IMDS_URL": imds_url,
                        "SPOTGATE_AGENT_DRAIN_GRACE_SECONDS": "20",
                        "SPOTGATE_AGENT_VLLM__GPU_MEMORY_UTILIZATION": "0.3",
                        "SPOTGATE_AGENT_VLLM__MAX_MODEL_LEN": "2048",
                    },
                )
                agents.append({"agent_id": agent_id, "url": f"http://127.0.0.1:{port}",
                               "imds_url": imds_url})  # fmt: skip
            await _wait_agents_ready(registry, served, options.agents, processes)
        info = LocalStackInfo(
            aws_endpoint_url=emulator.url,
            region=EMULATOR_REGION,
            api_key=created.api_key,
            gateway_url=gateway_url,
            chat_url=f"{gateway_url}/",
            model=served,
            agents=agents,
        )
        _write_up_file(directory, info)
        announce(info.ready_line())
        await _wait_for_stop_signal(processes)
        await processes.stop(lambda name: name.startswith("agent-"))
        await processes.stop(lambda name: True)
    finally:
        up_file.unlink(missing_ok=True)
        processes.close()
        emulator.stop()
    return 0


async def _wait_for_stop_signal(processes: _Processes) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        while not stop.is_set():
            processes.check()
            try:
                await asyncio.wait_for(stop.wait(), 1.0)
            except TimeoutError:
                continue
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
