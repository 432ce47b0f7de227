"""What ships is enough: the image and the agents' bundle hold every package the services import."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from stacks.source import AGENT_DOCKERFILE, DOCKERFILE, LOCKS, PACKAGES, REPO_ROOT

SERVICE_ENTRY_POINTS = ("cli.main", "gateway.service", "gpu_agent.service", "pool_manager.service")
"""`spotgate gateway|agent|pool run` (the image's and the agents' commands) and what they run."""
OURS = ("spotgate", "gateway", "gpu_agent", "pool_manager", "stack", "loadtest", "cli")


def test_the_shipped_packages_hold_every_module_the_services_import(tmp_path: Path) -> None:
    for package in PACKAGES:
        (tmp_path / package).symlink_to(REPO_ROOT / package)
    imports = "; ".join(f"import {module}" for module in SERVICE_ENTRY_POINTS)
    report = (
        "import json, sys; "
        f"print(json.dumps(sorted(m.__file__ for n, m in list(sys.modules.items()) "
        f"if n.split('.')[0] in {OURS!r} and getattr(m, '__file__', None))))"
    )
    # Shipped packages first on the path: a module found elsewhere is one the bundle lacks.
    result = subprocess.run(
        [sys.executable, "-c", f"{imports}; {report}"],
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout)
    assert loaded
    assert [path for path in loaded if not path.startswith(str(tmp_path))] == []


def test_the_image_copies_exactly_the_shipped_packages() -> None:
    lines = (REPO_ROOT / DOCKERFILE).read_text().splitlines()
    copied = [line.split()[1] for line in lines if line.startswith("COPY ")]
    assert copied == ["pyproject.toml", f"{LOCKS}/service.lock", *PACKAGES]


def _default_build(dockerfile: str) -> str:
    """The Dockerfile as its build arguments' defaults make it: the GPU image."""
    defaults = dict(re.findall(r"^ARG (\w+)=(.*)$", dockerfile, re.M))
    return re.sub(r"\$\{(\w+)\}", lambda name: defaults[name[1]], dockerfile)


def test_the_agent_image_is_the_locked_vllm_and_the_shipped_packages() -> None:
    dockerfile = _default_build((REPO_ROOT / AGENT_DOCKERFILE).read_text())
    copied = [line.split()[1:-1] for line in dockerfile.splitlines() if line.startswith("COPY ")]
    # The lock, and the wheels a CPU build's context brings (none in the GPU image's).
    assert copied[0] == [f"{LOCKS}/agent-gpu.lock", f"{LOCKS}/wheel[s]"]
    assert [sources[0] for sources in copied[1:]] == ["pyproject.toml", *PACKAGES]
    # The Python the lock is resolved for (`make lock`), by digest.
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert re.search(r"--extra gpu --python-version 3\.12 ", makefile)
    assert re.search(r"^FROM python:3\.12-slim@sha256:[0-9a-f]{64}$", dockerfile, re.M)
    assert f"pip install --require-hashes --find-links {LOCKS} -r {LOCKS}/agent-gpu.lock" in (
        dockerfile
    )
    assert 'pip install --no-deps --no-build-isolation ".[gpu]"' in dockerfile
    assert 'ENTRYPOINT ["spotgate", "agent"]' in dockerfile
