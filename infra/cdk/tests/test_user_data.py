"""The agents' boot script, taken from the synthesized launch template: valid bash, and run in
a sandbox with stand-in commands it installs nothing, writes settings the agent accepts, and
has systemd run the agent's image with exactly that settings file."""

from __future__ import annotations

import itertools
import os
import re
import shlex
import stat
import subprocess
from pathlib import Path

import pytest
from conftest import Synthesized, render
from stacks.config import DeployConfig

from gpu_agent.server import token_issuer
from spotgate.settings import AgentSettings, advertised_url

PRIVATE_IP = "10.0.1.7"
INSTANCE_ID = "i-0abc"
DRAIN_GRACE_SECONDS = AgentSettings.model_fields["drain_grace_seconds"].default
INSTALLERS = ("pip", "apt-get", "apt", "dpkg", "snap", "conda", "uv", "yum", "dnf", "curl -o")
"""What a boot that installs something would run."""

# Stand-ins for what the script calls on an instance; each appends its arguments to calls.log.
STUBS = {
    "systemctl": "",
    "curl": f"""case "$*" in
  *api/token*) echo token ;;
  *local-ipv4*) echo {PRIVATE_IP} ;;
  *instance-id*) echo {INSTANCE_ID} ;;
esac""",
}


def _boot_script(synthesized: Synthesized) -> str:
    _id, template = synthesized.one("AWS::EC2::LaunchTemplate")
    return render(template["Properties"]["LaunchTemplateData"]["UserData"])


def boot_in_sandbox(script_text: str, sandbox: Path, *, nvme: bool) -> Path:
    """Run the boot script with stand-ins under `sandbox`; return the sandbox."""
    root, bin_dir = sandbox / "root", sandbox / "bin"
    root.mkdir()
    bin_dir.mkdir()
    if nvme:  # what the Deep Learning AMI mounts on instances with instance storage
        (root / "opt/dlami/nvme").mkdir(parents=True)
    log = sandbox / "calls.log"
    log.touch()
    for name, body in STUBS.items():
        stub = bin_dir / name
        stub.write_text(f'#!/bin/bash\necho "{name} $*" >> "$STUB_LOG"\n{body}\n')
        stub.chmod(stub.stat().st_mode | stat.S_IXUSR)
    script = sandbox / "boot.sh"
    script.write_text(script_text)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "SPOTGATE_BOOT_ROOT": str(root),
        "STUB_LOG": str(log),
        "HOME": str(sandbox),
    }
    result = subprocess.run(
        ["/bin/bash", str(script)],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return sandbox


@pytest.fixture(scope="module")
def booted(synthesized: Synthesized, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sandbox root the boot script ran in (an instance with NVMe storage), with `calls.log`."""
    return boot_in_sandbox(_boot_script(synthesized), tmp_path_factory.mktemp("boot"), nvme=True)


def _unit_lines(booted: Path) -> list[str]:
    text = (booted / "root/etc/systemd/system/spotgate-agent.service").read_text()
    return [line for line in text.splitlines() if "=" in line and not line.startswith("#")]


def _unit(booted: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in _unit_lines(booted))


def test_boot_script_is_valid_bash(synthesized: Synthesized, tmp_path: Path) -> None:
    script = tmp_path / "boot.sh"
    script.write_text(_boot_script(synthesized))
    result = subprocess.run(
        ["/bin/bash", "-n", str(script)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert script.read_text().startswith("#!/bin/bash\n")


def test_the_boot_installs_nothing(synthesized: Synthesized, booted: Path) -> None:
    script = _boot_script(synthesized)
    commands = [line.strip() for line in script.splitlines() if not line.lstrip().startswith("#")]
    for installer in INSTALLERS:
        assert not [c for c in commands if re.search(rf"(^|[ |;&/]){installer}\b", c)], installer
    ran = {call.split()[0] for call in (booted / "calls.log").read_text().splitlines()}
    assert ran == {"curl", "systemctl"}  # IMDS, the unit


def test_systemd_runs_the_agents_image_with_the_settings_it_wrote(booted: Path) -> None:
    unit = _unit(booted)
    run = shlex.split(unit["ExecStart"])
    assert run[:5] == ["/usr/bin/docker", "run", "--rm", "--init", "--name"]
    image = run[-1]
    # The image `cdk deploy` built and pushed to its assets repository, by content hash.
    assert re.fullmatch(r"\S+\.dkr\.ecr\.\S+/cdk-\S+-container-assets-\S+:\w{64}", image), image
    options = dict(itertools.pairwise(run))  # each option and the word after it
    assert options["--env-file"] == "/etc/spotgate/agent.env"
    assert (booted / "root" / options["--env-file"].lstrip("/")).is_file()
    assert options["--gpus"] == "all"
    assert options["--network"] == "host"  # the advertised private IP is the container's
    # Staged models go to instance storage, mounted where the agent's settings point.
    assert options["--volume"] == "/opt/dlami/nvme/spotgate:/var/cache/spotgate"
    assert _settings(booted)["SPOTGATE_AGENT_MODEL_CACHE_DIR"] == "/var/cache/spotgate"
    # Its log to CloudWatch Logs by Docker itself, under the instance's name.
    assert options["--log-driver"] == "awslogs"
    assert f"awslogs-stream={INSTANCE_ID}/agent" in run
    starts = [
        line.split("=", 1)[1] for line in _unit_lines(booted) if line.startswith("ExecStartPre=")
    ]
    assert any("aws ecr get-login-password" in line and "docker login" in line for line in starts)
    assert any(line == f"/usr/bin/docker pull {image}" for line in starts)
    # Made (the agent's uid its owner) on every start, before the container mounts it: a stop
    # wipes instance storage.
    assert "/usr/bin/install -d -o 10001 /opt/dlami/nvme/spotgate" in starts
    assert unit["Restart"] == "on-failure"
    calls = (booted / "calls.log").read_text().splitlines()
    assert "systemctl enable --now --no-block spotgate-agent.service" in calls
    assert calls.index("systemctl daemon-reload") < calls.index(
        "systemctl enable --now --no-block spotgate-agent.service"
    )


def test_without_instance_storage_models_go_to_the_root_volume(
    synthesized: Synthesized, tmp_path: Path
) -> None:
    sandbox = boot_in_sandbox(_boot_script(synthesized), tmp_path, nvme=False)
    run = shlex.split(_unit(sandbox)["ExecStart"])
    assert run[run.index("--volume") + 1] == "/var/cache/spotgate:/var/cache/spotgate"


def test_the_agent_gets_longer_than_its_drain_to_stop(booted: Path) -> None:
    unit = _unit(booted)
    drain = float(_settings(booted)["SPOTGATE_AGENT_DRAIN_GRACE_SECONDS"])
    assert drain >= DRAIN_GRACE_SECONDS == 90
    # `docker stop` sends SIGTERM (the agent drains), then waits before SIGKILL; systemd
    # waits longer still for `docker stop`.
    stop = shlex.split(unit["ExecStop"].removeprefix("-"))  # `-`: a container already gone
    assert stop[:3] == ["/usr/bin/docker", "stop", "--time"]
    assert drain < int(stop[3]) < int(unit["TimeoutStopSec"])


def _settings(booted: Path) -> dict[str, str]:
    path = booted / "root/etc/spotgate/agent.env"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if line)


def test_agent_accepts_the_settings_file(booted: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = _settings(booted)
    for name in list(os.environ):
        if name.startswith("SPOTGATE_"):
            monkeypatch.delenv(name)
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    agent = AgentSettings()
    assert agent.engine == "vllm"
    (model,) = DeployConfig().models
    assert (agent.model, agent.served_model_name) == (model.model, model.name)
    assert agent.vllm.revision == model.revision
    assert (agent.vllm.tool_call_parser, agent.vllm.reasoning_parser) == ("hermes", "qwen3")
    assert agent.host == "0.0.0.0"  # noqa: S104 — what the agent must bind
    assert advertised_url(agent) == f"http://{PRIVATE_IP}:8000"
    # The gateway's public keys come from its SSM parameter, never over the internet; tokens
    # are checked against the gateway's own URL, the issuer the gateway signs with.
    assert agent.jwks_url is None
    assert agent.jwks_parameter == "/spotgate/gateway-jwks"
    assert re.fullmatch(r"http://<Gateway\w+\.DNSName>", token_issuer(agent))
    assert agent.shared.tables.agents.startswith("<Ref:RegistryAgents")
    assert "SECRET" not in " ".join(settings)
