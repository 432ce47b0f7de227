"""The two small functions the stack deploys, run here: the registry metrics (Python) and the
signing-key generator (Node, with a stand-in Secrets Manager and a local response URL)."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from conftest import CDK_DIR
from stacks.functions.registry_metrics import count, metric_data

from spotgate.registry import POOL_TARGET_SOURCE, AgentState
from spotgate.tokens import load_signing_keys_pem

NOW = 1_000_000.0
FUNCTIONS = CDK_DIR / "stacks" / "functions"


def _agent(model: str, state: str, expires_at: float) -> dict[str, Any]:
    return {"model": {"S": model}, "state": {"S": state}, "expires_at": {"N": str(expires_at)}}


def _demand(model: str, gateway: str, pending: int, expires_at: float | None) -> dict[str, Any]:
    item: dict[str, Any] = {
        "model": {"S": model},
        "gateway_id": {"S": gateway},
        "pending": {"N": str(pending)},
    }
    if expires_at is not None:
        item["expires_at"] = {"N": str(expires_at)}
    return item


def test_registry_metrics_count_live_ready_agents_and_fresh_queues() -> None:
    agents = [
        _agent("m", AgentState.READY.value, NOW + 10),
        _agent("m", AgentState.READY.value, NOW - 1),  # expired, TTL has not deleted it yet
        _agent("m", AgentState.DRAINING.value, NOW + 10),
        _agent("other", AgentState.STARTING.value, NOW + 10),
    ]
    demand = [
        _demand("m", "gw-1", 3, NOW + 5),
        _demand("m", "gw-2", 2, NOW + 5),
        _demand("m", "gw-old", 7, NOW - 5),
        _demand("m", POOL_TARGET_SOURCE, 9, None),
    ]
    counts = count(
        agents,
        demand,
        models=["m", "idle"],
        now=NOW,
        ready_state=AgentState.READY.value,
        pool_target_source=POOL_TARGET_SOURCE,
    )
    assert counts == {"idle": (0, 0), "m": (1, 5), "other": (0, 0)}
    data = metric_data(counts)
    assert {(d["MetricName"], d["Dimensions"][0]["Value"], d["Value"]) for d in data} >= {
        ("ReadyAgents", "m", 1),
        ("QueuedStreams", "m", 5),
        ("ReadyAgents", "idle", 0),
    }


# A stand-in for the AWS SDK module the Lambda runtime provides.
FAKE_SECRETS_MANAGER = """
const fs = require("node:fs");
const store = process.env.FAKE_SECRET_FILE;
class GetSecretValueCommand { constructor(input) { this.input = input; this.name = "get"; } }
class PutSecretValueCommand { constructor(input) { this.input = input; this.name = "put"; } }
class SecretsManagerClient {
  async send(command) {
    if (command.name === "get") { return { SecretString: fs.readFileSync(store, "utf8") }; }
    fs.writeFileSync(store, command.input.SecretString);
    return {};
  }
}
module.exports = { SecretsManagerClient, GetSecretValueCommand, PutSecretValueCommand };
"""


class _Responses(BaseHTTPRequestHandler):
    received: list[dict[str, Any]] = []  # noqa: RUF012 — shared with the test on purpose

    def do_PUT(self) -> None:
        length = int(self.headers["Content-Length"])
        _Responses.received.append(json.loads(self.rfile.read(length)))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *_args: Any) -> None:
        """Quiet."""


@pytest.fixture
def response_url() -> Iterator[str]:
    """A local stand-in for CloudFormation's presigned response URL."""
    _Responses.received = []
    server = HTTPServer(("127.0.0.1", 0), _Responses)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/response"
    server.shutdown()
    thread.join()


def _invoke(tmp_path: Path, secret: Path, response_url: str, request_type: str) -> dict[str, Any]:
    node = shutil.which("node")
    if node is None:
        pytest.skip("needs Node (the CDK needs it too)")
    modules = tmp_path / "node_modules" / "@aws-sdk" / "client-secrets-manager"
    modules.mkdir(parents=True, exist_ok=True)
    (modules / "index.js").write_text(FAKE_SECRETS_MANAGER)
    shutil.copy(FUNCTIONS / "signing_key.js", tmp_path / "index.js")
    event = {
        "RequestType": request_type,
        "ResponseURL": response_url,
        "StackId": "stack",
        "RequestId": "request",
        "LogicalResourceId": "SigningKey",
        "ResourceProperties": {"SecretId": "secret"},
    }
    script = f"require('./index.js').handler({json.dumps(event)})"
    result = subprocess.run(
        [node, "-e", script],
        cwd=tmp_path,
        env={"FAKE_SECRET_FILE": str(secret), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return _Responses.received[-1]


def test_signing_key_generator_writes_one_ed25519_key_and_keeps_it(
    tmp_path: Path, response_url: str
) -> None:
    secret = tmp_path / "secret"
    secret.write_text("a random placeholder Secrets Manager generated")
    created = _invoke(tmp_path, secret, response_url, "Create")
    assert created["Status"] == "SUCCESS", created
    assert created["Reason"] == "signing key created"
    pem = secret.read_text()
    (key,) = load_signing_keys_pem(pem)  # the gateway can sign with it

    updated = _invoke(tmp_path, secret, response_url, "Update")
    assert updated["Status"] == "SUCCESS"
    assert updated["Reason"] == "signing key kept"
    assert secret.read_text() == pem
    assert updated["PhysicalResourceId"] == created["PhysicalResourceId"]
    assert load_signing_keys_pem(secret.read_text())[0].kid == key.kid


def test_signing_key_generator_reports_failure_to_cloudformation(
    tmp_path: Path, response_url: str
) -> None:
    missing = tmp_path / "no-such-secret"
    failed = _invoke(tmp_path, missing, response_url, "Create")
    assert failed["Status"] == "FAILED"
    assert failed["Reason"].startswith("signing key: ")
