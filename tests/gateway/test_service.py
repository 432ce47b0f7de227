"""The gateway as a process: what a SIGTERM does to the sockets it serves."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import websockets
from pydantic import SecretStr

from spotgate.process import ChildProcesses
from spotgate.registry import CreatedApiKey
from spotgate.settings import GatewaySettings, TokenSettings
from spotgate.tokens import SigningKey
from stack.children import GatewaySockets, start_service
from stack.emulator import AwsEmulator
from tests.gateway.conftest import MODEL
from tests.support.agents import (
    AgentFactory,
    WedgingEngine,
    expected_text,
    wait_for,
    wait_ready,
)
from tests.support.wsclient import Frame, connect, generate, receive, send, text_of


async def test_sigterm_refuses_new_streams_and_lets_those_in_flight_finish(
    aws: AwsEmulator, start_agent: AgentFactory, api_key: CreatedApiKey, tmp_path: Path
) -> None:
    key = SigningKey.generate()
    sockets = GatewaySockets.bind()
    url = sockets.url
    processes = ChildProcesses(tmp_path)
    settings = GatewaySettings(
        shared=aws.settings(),
        public_url=url,
        token=TokenSettings(signing_key_pem=SecretStr(key.to_pem())),
        shutdown_grace_seconds=10,
    )
    # The parent keeps its copy of the sockets, as `spotgate up` does to restart a gateway:
    # new connections are refused all the same once the drain begins.
    gateway = start_service(processes, "gateway", settings, sockets)
    # The stream is held after its first tokens until the late one was refused: it is still
    # in flight then, however slowly the signal and the drain come on a loaded machine.
    engine = WedgingEngine(MODEL, after_tokens=5)
    try:
        await wait_ready(
            await start_agent(
                engine,
                pinned_public_key=key.verify_key.to_pem(),
                token_issuer=url,
            )
        )

        async def routable() -> bool:
            """Whether `/readyz`, on the operations port, lists the model."""
            async with (
                aiohttp.ClientSession() as http,
                http.get(f"{sockets.ops_url}/readyz") as response,
            ):
                return MODEL in (await response.json())["models"]

        async def stopped_listening() -> bool:
            """Whether the traffic port refuses connections."""
            try:
                async with aiohttp.ClientSession() as http, http.get(f"{url}/healthz"):
                    return False
            except aiohttp.ClientError:
                return True

        await wait_for(routable)
        frames: list[Frame] = []
        async with connect(f"{url.replace('http', 'ws', 1)}/v1/ws", api_key.api_key) as ws:
            await send(ws, generate("s", MODEL, content="finish me", max_tokens=40))
            while not frames or frames[-1]["type"] != "delta":
                frames.append(await receive(ws))
            gateway.process.send_signal(signal.SIGTERM)
            await wait_for(stopped_listening)  # it refuses new streams from that moment on
            await send(ws, generate("late", MODEL))
            try:
                while not frames or frames[-1].get("id") != "late":
                    frames.append(await receive(ws))
                engine.unwedge()
                while True:
                    frames.append(await receive(ws))
            except websockets.ConnectionClosed as closed:
                close_code = closed.rcvd.code if closed.rcvd else None
    finally:
        await processes.stop(lambda _child: True, 30)
        processes.close()
        sockets.close()
    late = [frame for frame in frames if frame.get("id") == "late"]

    # aiohttp's cleanup drops what arrives on open sockets: the drain must come before it.
    assert [frame["code"] for frame in late] == ["going_away"]
    assert text_of([f for f in frames if f.get("id") == "s"]) == expected_text("finish me", 40)
    assert close_code == 1001


def test_a_gateway_on_real_aws_without_a_signing_key_refuses_to_start() -> None:
    """Each replica would sign with a key of its own, and refuse the others' tokens."""
    env = {
        key: value for key, value in os.environ.items() if not key.startswith(("SPOTGATE_", "AWS_"))
    }
    env |= {
        "SPOTGATE_GATEWAY_PORT": "0",
        "SPOTGATE_GATEWAY_OPS_PORT": "0",
        "AWS_ACCESS_KEY_ID": "x",
        "AWS_SECRET_ACCESS_KEY": "x",
    }
    result = subprocess.run(
        [sys.executable, "-m", "gateway"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "no token signing key" in result.stderr
    assert "SIGNING_KEY_SECRET_ID" in result.stderr
