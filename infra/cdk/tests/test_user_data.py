"""The agents' boot script, taken from the synthesized launch template: valid bash, and run in
a sandbox with stand-in commands it installs spotgate[gpu], writes settings the agent accepts,
and starts `spotgate agent` under systemd with exactly that settings file."""

from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path

import pytest
from conftest import Synthesized, render
from stacks.source import LOCKS, REPO_ROOT

from gpu_agent.server import advertised_url, token_issuer
from spotgate.settings import AgentSettings

LOCK_DIR = REPO_ROOT / LOCKS
PRIVATE_IP = "10.0.1.7"
DRAIN_GRACE_SECONDS = AgentSettings.model_fields["drain_grace_seconds"].default

# Stand-ins for what the script calls on an instance; each appends its arguments to calls.log.
STUBS = {
    "apt-get": "",
    "dpkg": "",
    "useradd": "",
    "chown": "",
    "systemctl": "",
    "id": "exit 1",
    "curl": f"""case "$*" in
  *api/token*) echo token ;;
  *local-ipv4*) echo {PRIVATE_IP} ;;
  *-o*) exit 0 ;;
esac""",
    "python3": """if [ "$1" = -m ] && [ "$2" = venv ]; then
  mkdir -p "$3/bin"
  for tool in pip python; do
    printf '#!/bin/sh\\necho "%s $*" >> "$STUB_LOG"\\ncat > /dev/null\\n' "$3/bin/$tool" \\
      > "$3/bin/$tool"
    chmod +x "$3/bin/$tool"
  done
fi""",
}


def _boot_script(synthesized: Synthesized) -> str:
    _id, template = synthesized.one("AWS::EC2::LaunchTemplate")
    return render(template["Properties"]["LaunchTemplateData"]["UserData"])


@pytest.fixture(scope="module")
def booted(synthesized: Synthesized, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sandbox root the boot script ran in, with `calls.log` of the commands it ran."""
    sandbox = tmp_path_factory.mktemp("boot")
    root, bin_dir = sandbox / "root", sandbox / "bin"
    root.mkdir()
    bin_dir.mkdir()
    log = sandbox / "calls.log"
    for name, body in STUBS.items():
        stub = bin_dir / name
        stub.write_text(f'#!/bin/bash\necho "{name} $*" >> "$STUB_LOG"\n{body}\n')
        stub.chmod(stub.stat().st_mode | stat.S_IXUSR)
    script = sandbox / "boot.sh"
    script.write_text(_boot_script(synthesized))
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


def _unit(booted: Path) -> dict[str, str]:
    text = (booted / "root/etc/systemd/system/spotgate-agent.service").read_text()
    return dict(
        line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#")
    )


def test_boot_script_is_valid_bash(synthesized: Synthesized, tmp_path: Path) -> None:
    script = tmp_path / "boot.sh"
    script.write_text(_boot_script(synthesized))
    result = subprocess.run(
        ["/bin/bash", "-n", str(script)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert script.read_text().startswith("#!/bin/bash\n")


def test_boot_installs_spotgate_with_the_gpu_extra(booted: Path) -> None:
    calls = (booted / "calls.log").read_text().splitlines()
    installs = [
        call
        for call in calls
        if call.startswith(f"{booted}/root/opt/spotgate/venv/bin/pip install")
    ]
    assert any(call.endswith("/opt/spotgate/src[gpu]") for call in installs), installs


def test_boot_installs_only_what_the_locks_pin(booted: Path) -> None:
    calls = (booted / "calls.log").read_text().splitlines()
    installs = [call.split(" install ", 1)[1] for call in calls if "/venv/bin/pip install" in call]
    assert installs, calls
    for arguments in installs:  # every requirement by hash, or spotgate alone with none
        assert "--require-hashes" in arguments or "--no-deps" in arguments, arguments
    assert any(a.endswith("/opt/spotgate/src/requirements/agent-gpu.lock") for a in installs)
    written = (booted / "root/opt/spotgate/boot.lock").read_text().strip()
    assert written == (LOCK_DIR / "boot.lock").read_text().strip()


def test_the_cloudwatch_agent_is_a_pinned_version_checked_by_hash(booted: Path) -> None:
    calls = (booted / "calls.log").read_text().splitlines()
    [download] = [call for call in calls if "amazon-cloudwatch-agent.deb" in call]
    assert "/ubuntu/amd64/1.300072.0b1766/" in download
    # The stand-in download is empty, so its hash is wrong: nothing is installed from it.
    assert not any(call.startswith("dpkg") for call in calls)


def test_boot_starts_the_agent_with_the_settings_it_wrote(booted: Path) -> None:
    unit = _unit(booted)
    assert unit["ExecStart"] == "/opt/spotgate/venv/bin/spotgate agent"
    assert unit["EnvironmentFile"] == "/etc/spotgate/agent.env"
    assert (booted / "root" / unit["EnvironmentFile"].lstrip("/")).is_file()
    assert unit["Restart"] == "on-failure"
    assert unit["User"] == "spotgate"
    calls = (booted / "calls.log").read_text().splitlines()
    assert "systemctl enable --now spotgate-agent.service" in calls
    assert calls.index("systemctl daemon-reload") < calls.index(
        "systemctl enable --now spotgate-agent.service"
    )


def test_systemd_waits_longer_than_the_agents_drain(booted: Path) -> None:
    unit = _unit(booted)
    settings = _settings(booted)
    assert unit["KillSignal"] == "SIGTERM"
    drain = float(settings["SPOTGATE_AGENT_DRAIN_GRACE_SECONDS"])
    assert drain >= DRAIN_GRACE_SECONDS == 90
    assert int(unit["TimeoutStopSec"]) > drain


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
    assert agent.model == "Qwen/Qwen2.5-1.5B-Instruct"
    assert agent.host == "0.0.0.0"  # noqa: S104 — what the agent must bind
    assert advertised_url(agent) == f"http://{PRIVATE_IP}:8000"
    # The gateway's public keys come from its SSM parameter, never over the internet; tokens
    # are checked against the gateway's own URL, the issuer the gateway signs with.
    assert agent.jwks_url is None
    assert agent.jwks_parameter == "/spotgate/gateway-jwks"
    assert re.fullmatch(r"http://<Gateway\w+\.DNSName>", token_issuer(agent))
    assert agent.shared.tables.agents.startswith("<Ref:RegistryAgents")
    assert "SECRET" not in " ".join(settings)
