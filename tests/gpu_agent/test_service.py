from __future__ import annotations

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
