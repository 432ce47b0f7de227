from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.main import main
from spotgate.process import loopback_socket, socket_port
from spotgate.registry import AgentState, Registry
from spotgate.settings import AgentSettings, SyntheticSettings, settings_env
from spotgate.tokens import KeyRing
from stack.emulator import AwsEmulator
from tests.support.agents import ISSUER, wait_for
from tests.support.wsclient import connect, generate, receive, send


@pytest.fixture
def agent_process(aws: AwsEmulator, ring: KeyRing) -> Iterator[tuple[subprocess.Popen[str], int]]:
    sock = loopback_socket()  # handed over: the agent serves on it
    port = socket_port(sock)
    settings = AgentSettings(
        shared=aws.settings().model_copy(update={"log_format": "json"}),
        engine="synthetic",
        served_model_name="synth",
        agent_id="local-cli",
        port=port,
        listen_fd=sock.fileno(),
        pinned_public_key=ring.signing_key.verify_key.to_pem(),
        token_issuer=ISSUER,
        imds_url="http://127.0.0.1:9",
        heartbeat_seconds=0.5,
        drain_grace_seconds=60,
        synthetic=SyntheticSettings(tokens_per_second=40),
    )
    env = {**os.environ, **settings_env(settings)}
    process = subprocess.Popen(
        [sys.executable, "-m", "cli", "agent"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        pass_fds=[sock.fileno()],
    )
    sock.close()
    yield process, port
    if process.poll() is None:
        process.kill()
        process.wait()


async def test_agent_process_drains_on_sigterm_and_leaves_gone(
    aws: AwsEmulator, agent_process: tuple[subprocess.Popen[str], int], token: str
) -> None:
    process, port = agent_process
    async with Registry.open(aws.settings()) as registry:
        await registry.create_tables()

        async def state_is(*states: AgentState) -> bool:
            record = await registry.get_agent("local-cli")
            return record is not None and record.state in states

        await wait_for(lambda: state_is(AgentState.READY), within=60)
        async with connect(f"ws://127.0.0.1:{port}/v1/ws", token) as ws:
            await send(ws, generate("s", "synth", max_tokens=40))
            assert (await receive(ws))["type"] == "start"

            process.send_signal(signal.SIGTERM)
            # Gone as soon as its stream ends: a slow poll may see only that.
            await wait_for(lambda: state_is(AgentState.DRAINING, AgentState.GONE))
            frame = await receive(ws)
            while frame["type"] == "delta":
                frame = await receive(ws)

        assert frame["type"] == "done"
        assert frame["usage"]["completion_tokens"] == 40
        assert process.wait(timeout=30) == 0
        assert await state_is(AgentState.GONE)
    output = process.stdout.read() if process.stdout else ""
    assert token not in output
    assert "draining" in output


def run_agent(settings: AgentSettings) -> subprocess.CompletedProcess[str]:
    """`spotgate agent` with these settings, run to its exit."""
    env = {**os.environ, **settings_env(settings)}
    command = [sys.executable, "-m", "cli", "agent"]
    return subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=120, check=False
    )


async def test_an_agent_whose_port_is_taken_says_so_in_the_registry_and_one_line(
    aws: AwsEmulator, ring: KeyRing
) -> None:
    with loopback_socket() as taken:
        port = socket_port(taken)
        settings = AgentSettings(
            shared=aws.settings(),
            engine="synthetic",
            agent_id="local-taken",
            port=port,
            pinned_public_key=ring.signing_key.verify_key.to_pem(),
            token_issuer=ISSUER,
            imds_url="http://127.0.0.1:9",
        )
        async with Registry.open(aws.settings()) as registry:
            await registry.create_tables()
        agent = await asyncio.to_thread(run_agent, settings)
    async with Registry.open(aws.settings()) as registry:
        record = await registry.get_agent("local-taken")

    reason = f"cannot listen on 127.0.0.1:{port}: Address already in use"
    assert agent.returncode == 2
    assert agent.stderr.strip().splitlines()[-1] == f"spotgate agent: {reason}"
    assert record is not None
    assert (record.shown_state, record.failure) == ("failed", reason)


def test_an_agent_given_a_key_that_is_not_pem_says_so_in_one_line(aws: AwsEmulator) -> None:
    settings = AgentSettings(
        shared=aws.settings(), engine="synthetic", pinned_public_key="x", token_issuer=ISSUER
    )
    agent = run_agent(settings)
    assert agent.returncode == 2
    assert agent.stderr.strip().splitlines() == [
        "spotgate agent: SPOTGATE_AGENT_PINNED_PUBLIC_KEY: not a PEM public key"
    ]


def test_model_tiny_command_writes_a_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # In this process: a second interpreter would import torch again for the same command.
    out = tmp_path / "tiny"
    assert main(["model", "tiny", "--out", str(out)]) == 0
    assert (out / "config.json").exists()
    capsys.readouterr()
    assert main(["model", "tiny", "--out", str(out)]) == 2
    assert "not empty" in capsys.readouterr().err
