from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from spotgate.emulator import AwsEmulator
from spotgate.registry import AgentState, Registry
from spotgate.tokens import KeyRing
from tests.agents import ISSUER, free_port, wait_for
from tests.gpu_agent.wsclient import connect, generate, receive, send


@pytest.fixture
def agent_process(aws: AwsEmulator, ring: KeyRing) -> Iterator[tuple[subprocess.Popen[str], int]]:
    port = free_port()
    env = {
        **os.environ,
        "SPOTGATE_AWS__ENDPOINT_URL": aws.url,
        "SPOTGATE_AWS__ACCESS_KEY_ID": "local",
        "SPOTGATE_AWS__SECRET_ACCESS_KEY": "local",
        "SPOTGATE_LOG_FORMAT": "json",
        "SPOTGATE_AGENT_ENGINE": "synthetic",
        "SPOTGATE_AGENT_SERVED_MODEL_NAME": "synth",
        "SPOTGATE_AGENT_AGENT_ID": "local-cli",
        "SPOTGATE_AGENT_PORT": str(port),
        "SPOTGATE_AGENT_PINNED_PUBLIC_KEY": ring.signing_key.verify_key.to_pem(),
        "SPOTGATE_AGENT_TOKEN_ISSUER": ISSUER,
        "SPOTGATE_AGENT_IMDS_URL": "http://127.0.0.1:9",
        "SPOTGATE_AGENT_HEARTBEAT_SECONDS": "0.5",
        "SPOTGATE_AGENT_DRAIN_GRACE_SECONDS": "60",
        "SPOTGATE_AGENT_SYNTHETIC__TOKENS_PER_SECOND": "40",
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "spotgate.cli", "agent"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
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

        async def state_is(state: AgentState) -> bool:
            record = await registry.get_agent("local-cli")
            return record is not None and record.state is state

        await wait_for(lambda: state_is(AgentState.READY), within=60)
        async with connect(f"ws://127.0.0.1:{port}/v1/ws", token) as ws:
            await send(ws, generate("s", "synth", max_tokens=40))
            assert (await receive(ws))["type"] == "start"

            process.send_signal(signal.SIGTERM)
            await wait_for(lambda: state_is(AgentState.DRAINING), within=5)
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


def test_model_tiny_command_writes_a_model(tmp_path: Path) -> None:
    out = tmp_path / "tiny"
    result = subprocess.run(
        [sys.executable, "-m", "spotgate.cli", "model", "tiny", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert (out / "config.json").exists()
    again = subprocess.run(
        [sys.executable, "-m", "spotgate.cli", "model", "tiny", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert again.returncode == 2
    assert "not empty" in again.stderr
