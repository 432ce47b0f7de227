"""The agent's EC2 boot run end to end on this machine (`make boot`).

An instance (Debian booted by systemd, in a container on the host's network) runs the boot
script the CDK app renders, as user data; systemd runs the agent's image (its CPU variant,
built from agent.Dockerfile) pulled from a registry; the agent finds itself in IMDS, fetches
the tiny model from the emulator's S3, registers and serves. Then the instance is stopped
into the warm pool (the agent drains), started again (the agent comes back on the model it
kept), and told of a spot interruption (it drains and leaves, and systemd leaves it gone).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from stacks.config import DeployConfig, ModelConfig
from stacks.gpu_pool import AGENT_PORT, agent_settings, boot_script, pool_agent_settings

from boot import machine
from gpu_agent.tiny_model import write_tiny_model
from spotgate.model_store import stage_model
from spotgate.process import loopback_socket, socket_port
from spotgate.registry import AgentState, Registry, aws_session, instance_agent_id
from spotgate.settings import AgentSettings, emulator_settings, settings_env
from spotgate.settings_env_names import env_names
from spotgate.tokens import KeyRing, SigningKey, issue
from stack.emulator import AwsEmulator

REGION = "us-east-1"
ZONE = "us-east-1a"
INSTANCE_ID = "i-0b00700000000000"
INSTANCE = "spotgate-boot-instance"
AGENT_CONTAINER = "spotgate-agent"
# Fetched to disk (`download`): the cache a warm start finds it in (one that streams does not).
MODEL = ModelConfig(name="tiny", model="s3://models/tiny", fetch="download", warm_pool_size=1)
ISSUER = "http://gateway.boot"
REGISTRY_PASSWORD = "boot-registry-password"  # noqa: S105 - a local registry's, no secret
CACHE = Path("/var/cache/spotgate")
"""The model cache: the instance's and, for the agent's container beside it, the host's."""
READY_SECONDS = 900.0
"""A guard, not a speed check: a pull, a model fetch and a CPU engine's start on two cores."""
CPU_ENGINE = {
    "dtype": "float32",
    "enforce_eager": "true",
    "max_model_len": "2048",
    "gpu_memory_utilization": "0.3",
    "engine_args": "--kv-cache-memory-bytes 268435456",
}
"""The agent's vLLM settings on a CPU the machine shares (the pool's are a GPU's)."""


@dataclass
class Boot:
    """The running pieces: the emulator, IMDS, the agent's row and a token for it."""

    aws: AwsEmulator
    imds_url: str
    agent_id: str
    ring: KeyRing
    directory: Path


def instance(*args: str) -> str:
    """A command run inside the instance."""
    return machine.docker("exec", INSTANCE, *args)


@pytest.fixture(scope="module")
def boot(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Boot]:
    if os.geteuid() != 0:
        pytest.fail("the boot runs as root: it adds IMDS's address and runs Docker")
    directory = tmp_path_factory.mktemp("boot")
    machine.build_images()
    _remove_containers()
    aws = AwsEmulator()
    aws.start()
    ring = KeyRing([SigningKey.generate()])
    with (
        machine.registry(directory, _free_port()) as registry,
        machine.imds_on_link_local(directory, INSTANCE_ID, ZONE) as imds_url,
    ):
        image = f"{registry}/spotgate-agent:cpu"
        machine.docker("tag", machine.AGENT_IMAGE, image)
        machine.docker("push", image)
        asyncio.run(_prepare_aws(aws, ring, directory))
        script = _rendered_boot_script(aws, image)
        (directory / "user-data").write_text(script)
        (directory / "registry-password").write_text(REGISTRY_PASSWORD)
        agent_id = instance_agent_id("aws", REGION, "123456789012", INSTANCE_ID)
        try:
            _start_instance(directory)
            yield Boot(aws, imds_url, agent_id, ring, directory)
        finally:
            _remove_containers()
            aws.stop()


def _remove_containers() -> None:
    for name in (INSTANCE, AGENT_CONTAINER):
        subprocess.run(["docker", "rm", "--force", name], capture_output=True, check=False)


def _free_port() -> int:
    with loopback_socket() as sock:
        return socket_port(sock)


async def _prepare_aws(aws: AwsEmulator, ring: KeyRing, directory: Path) -> None:
    """The account as `cdk deploy` leaves it: tables, the staged model, the gateway's keys."""
    settings = emulator_settings(aws.url, REGION)
    async with Registry.open(settings) as registry:
        await registry.create_tables()
    session = aws_session(settings.aws)
    async with session.client("s3", endpoint_url=aws.url) as s3:
        await s3.create_bucket(Bucket="models")
    await stage_model(write_tiny_model(directory / "tiny"), MODEL.model, settings.aws)
    async with session.client("ssm", endpoint_url=aws.url) as ssm:
        parameter = DeployConfig().jwks_parameter
        await ssm.put_parameter(Name=parameter, Value=json.dumps(ring.jwks()), Type="String")


def _rendered_boot_script(aws: AwsEmulator, image: str) -> str:
    """The boot script as the CDK app renders it, its AWS the emulator, its engine the CPU's."""
    config = DeployConfig(region=REGION, models=(MODEL,))
    shared = settings_env(emulator_settings(aws.url, REGION))
    settings = agent_settings(pool_agent_settings(config, shared, ISSUER), MODEL)
    settings |= env_names(AgentSettings, {f"vllm.{k}": v for k, v in CPU_ENGINE.items()})
    return boot_script(config, MODEL, settings, image, "spotgate-boot")


def _start_instance(directory: Path) -> None:
    """Boot the instance: systemd as its first process, the user data run once."""
    shutil.rmtree(CACHE, ignore_errors=True)  # a new instance: no model kept
    CACHE.mkdir(parents=True)
    docker_client = shutil.which("docker")
    assert docker_client is not None, "no docker client on PATH"
    machine.docker(
        "run",
        "--detach",
        "--name",
        INSTANCE,
        # systemd mounts and manages cgroups; the host need grant no more than that.
        "--cap-add=SYS_ADMIN",
        "--security-opt=seccomp=unconfined",
        "--security-opt=apparmor=unconfined",
        "--network=host",
        "--tmpfs=/run",
        "--tmpfs=/run/lock",
        "--volume=/sys/fs/cgroup:/sys/fs/cgroup",
        # The agent's container runs beside the instance, by the host's Docker: the cache
        # path it mounts is the host's, the same directory as the instance's.
        "--volume=/var/run/docker.sock:/var/run/docker.sock",
        f"--volume={docker_client}:/usr/libexec/docker-cli:ro",
        f"--volume={CACHE}:{CACHE}",
        f"--volume={directory / 'user-data'}:/var/lib/cloud/user-data:ro",
        f"--volume={directory / 'registry-password'}:/etc/spotgate-boot/registry-password:ro",
        machine.INSTANCE_IMAGE,
    )


async def _agent_state(boot: Boot) -> AgentState | None:
    async with Registry.open(emulator_settings(boot.aws.url, REGION)) as registry:
        record = await registry.get_agent(boot.agent_id)
    return None if record is None else record.state


async def _wait_for_state(boot: Boot, *states: AgentState) -> None:
    deadline = time.monotonic() + READY_SECONDS
    while (state := await _agent_state(boot)) not in states:
        if time.monotonic() > deadline:
            log = instance("journalctl", "--no-pager", "--lines=80")
            raise AssertionError(f"the agent is {state}, not {states}; the instance's log:\n{log}")
        await asyncio.sleep(1.0)  # polling: the registry has no change events


async def _generate(boot: Boot) -> str:
    """One reply from the agent, on the address the boot script advertised."""
    request = {
        "type": "generate",
        "id": "boot",
        "model": MODEL.name,
        "messages": [{"role": "user", "content": "Hello from the boot"}],
        "max_tokens": 8,
    }
    token = issue(boot.ring, subject="boot", issuer=ISSUER, now=time.time()).token
    text = ""
    async with aiohttp.ClientSession() as http:
        url = f"ws://127.0.0.1:{AGENT_PORT}/v1/ws"
        async with http.ws_connect(url, headers={"Authorization": f"Bearer {token}"}) as ws:
            await ws.send_json(request)
            async for message in ws:
                frame = json.loads(message.data)
                if frame["type"] == "delta":
                    text += frame["text"]
                if frame["type"] in ("done", "error"):
                    assert frame["type"] == "done", frame
                    return text
    raise AssertionError("the agent closed the stream before it ended")


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def test_the_boot_script_runs_the_agent_which_registers_and_serves(boot: Boot) -> None:
    await _wait_for_state(boot, AgentState.READY)
    assert await _generate(boot)
    calls = instance("cat", "/var/log/docker-calls.log").splitlines()
    (run,) = [call for call in calls if call.startswith("run ")]
    assert "--gpus all" in run  # as the unit gave them
    assert "--log-driver awslogs" in run
    assert any(call.startswith("login --username AWS --password-stdin") for call in calls)
    assert instance("cat", "/var/log/aws-calls.log").startswith("aws ecr get-login-password")
    assert _cached_files()  # the model, fetched into the cache the unit mounts


def _cached_files() -> list[Path]:
    return [path for path in CACHE.rglob("*") if path.is_file()]


def _cache_state() -> dict[Path, int]:
    """Each cached file and when it was last written."""
    return {path: path.stat().st_mtime_ns for path in _cached_files()}


async def test_a_stop_drains_the_agent_and_a_start_brings_it_back(boot: Boot) -> None:
    await _wait_for_state(boot, AgentState.READY)
    machine.docker("stop", "--time", "300", INSTANCE)  # EC2's stop: systemd stops the unit
    # The unit's stop ran `docker stop`: the agent drained and left before the instance ended.
    assert await _agent_state(boot) == AgentState.GONE
    assert not machine.docker("ps", "--all", "--quiet", "--filter", f"name={AGENT_CONTAINER}")
    kept = _cache_state()
    # Out of the warm pool as the pool manager starts it: its last boot's `gone` row removed
    # first, so the new boot registers afresh; the unit is enabled, so systemd starts it.
    async with Registry.open(emulator_settings(boot.aws.url, REGION)) as registry:
        await registry.remove_gone(boot.agent_id)
    machine.docker("start", INSTANCE)
    await _wait_for_state(boot, AgentState.READY)
    assert await _generate(boot)
    # It came back on the model it kept: no file of it fetched again.
    assert _cache_state() == kept
    calls = instance("cat", "/var/log/docker-calls.log").splitlines()
    assert (
        [call for call in calls if call.startswith("stop ")]
        == [call for call in calls if call.startswith("stop --time") and AGENT_CONTAINER in call]
        != []
    )
    assert len([call for call in calls if call.startswith("run ")]) == 2


async def test_a_spot_notice_drains_the_agent_and_it_stays_gone(
    boot: Boot, http: aiohttp.ClientSession
) -> None:
    await _wait_for_state(boot, AgentState.READY)
    async with http.post(f"{boot.imds_url}/_emulator/spot-notice", json={"in_seconds": 120}):
        pass
    await _wait_for_state(boot, AgentState.GONE)
    state = instance("systemctl", "show", "spotgate-agent.service", "--property=Result")
    assert state == "Result=success"
