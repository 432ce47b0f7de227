"""What the agent's EC2 boot runs on here: images built with Docker, a registry, IMDS.

Each piece is the real one where this machine has it (Debian from `debootstrap`, Docker, the
Docker registry Debian packages, systemd) and a stand-in, named where it is made, where it
has not (a GPU, ECR's login, CloudWatch Logs).
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from stacks.source import AGENT_DOCKERFILE, LOCKS, PACKAGES, REPO_ROOT

BOOT_DIR = REPO_ROOT / "infra" / "boot"
CACHE_DIR = REPO_ROOT / ".cache" / "boot"
DEBIAN_IMAGE = "spotgate-boot/debian:bookworm"
PYTHON_IMAGE = "spotgate-boot/python:3.11"
AGENT_IMAGE = "spotgate-boot/agent:cpu"
INSTANCE_IMAGE = "spotgate-boot/instance:bookworm"
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
IMDS_ADDRESS = "169.254.169.254"
AGENT_SOURCES = ("pyproject.toml", "README.md", *PACKAGES)
CPU_TORCH_EXTRAS = "torchvision torchaudio torchcodec"
"""Installed by the CPU lock, removed after: their PyPI builds do not load against CPU torch."""
SERVER_START_SECONDS = 30.0


def docker(*args: str) -> str:
    """Run Docker's client; its output, or an error naming the command and what it said."""
    result = subprocess.run(["docker", *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args)}: {result.stderr.strip()[-2000:]}")
    return result.stdout.strip()


def has_image(tag: str) -> bool:
    """Whether Docker holds an image tagged `tag`."""
    return bool(docker("images", "--quiet", tag))


def debian_image() -> None:
    """Debian bookworm as a base image: `debootstrap`'s root file system, imported once."""
    if has_image(DEBIAN_IMAGE):
        return
    rootfs = CACHE_DIR / "rootfs"
    shutil.rmtree(rootfs, ignore_errors=True)
    rootfs.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["debootstrap", "--variant=minbase", "bookworm", str(rootfs)],
        check=True,
        capture_output=True,
    )
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    subprocess.run(["docker", "import", "-", DEBIAN_IMAGE], stdin=tar.stdout, check=True)
    tar.wait()
    shutil.rmtree(rootfs)


def build(tag: str, dockerfile: str, files: Mapping[str, Path], **build_args: str) -> None:
    """Build `tag` from a context of exactly `files` (name in the context: path here)."""
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, path in files.items():
            tar.add(path, arcname=name, filter=_without_caches)
    arguments = [f"--build-arg={name}={value}" for name, value in build_args.items()]
    result = subprocess.run(
        ["docker", "build", "--quiet", "--tag", tag, "--file", dockerfile, *arguments, "-"],
        input=context.getvalue(),
        capture_output=True,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"building {tag}: {result.stderr.decode()[-4000:]}")


def _without_caches(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """The entry as Docker's build cache should see it: the same files, the same entry."""
    if "__pycache__" in info.name.split("/"):
        return None
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    return info


def cpu_torch_wheels() -> dict[str, Path]:
    """The CPU torch wheel the CPU lock pins, from pip's find-links (it is not on PyPI)."""
    wheels = {
        f"{LOCKS}/wheels/{wheel.name}": wheel
        for links in os.environ.get("PIP_FIND_LINKS", "").split()
        for wheel in Path(links).glob("torch-*+cpu-*.whl")
    }
    if not wheels:
        raise RuntimeError("no CPU torch wheel in PIP_FIND_LINKS: the CPU lock cannot install")
    return wheels


def build_images() -> None:
    """Every image the boot runs: Debian, its Python, the agent's CPU variant, the instance."""
    debian_image()
    build(
        PYTHON_IMAGE,
        "Dockerfile",
        {"Dockerfile": BOOT_DIR / "python.Dockerfile", "ca-certificates.crt": HOST_CA_BUNDLE},
        DEBIAN=DEBIAN_IMAGE,
    )
    sources = {name: REPO_ROOT / name for name in AGENT_SOURCES}
    locks = {f"{LOCKS}/{lock.name}": lock for lock in (REPO_ROOT / LOCKS).glob("*.lock")}
    build(
        AGENT_IMAGE,
        AGENT_DOCKERFILE,
        {
            **sources,
            **locks,
            **cpu_torch_wheels(),
            AGENT_DOCKERFILE: REPO_ROOT / AGENT_DOCKERFILE,
        },
        BASE=PYTHON_IMAGE,
        LOCK="agent-cpu.lock",
        EXTRA="cpu",
        REMOVE=CPU_TORCH_EXTRAS,
        SYSTEM_PACKAGES="libnuma1",
    )
    instance = BOOT_DIR / "instance"
    build(
        INSTANCE_IMAGE,
        "Dockerfile",
        {
            "Dockerfile": BOOT_DIR / "instance.Dockerfile",
            **{path.name: path for path in instance.iterdir()},
        },
        DEBIAN=DEBIAN_IMAGE,
    )


@contextmanager
def registry(directory: Path, port: int) -> Iterator[str]:
    """Docker's registry (Debian's `docker-registry`) on 127.0.0.1: the host of ECR's part.

    What is pushed to it is kept in the cache: a push sends only the layers it lacks (the
    first push of the agent's CPU image compresses 4 GB).
    """
    config = directory / "registry.yml"
    config.write_text(
        "version: 0.1\n"
        f"storage:\n  filesystem:\n    rootdirectory: {CACHE_DIR / 'registry'}\n"
        f"http:\n  addr: 127.0.0.1:{port}\n"
    )
    log = (directory / "registry.log").open("w")
    process = subprocess.Popen(
        ["docker-registry", "serve", str(config)], stdout=log, stderr=subprocess.STDOUT
    )
    host = f"127.0.0.1:{port}"
    try:
        _wait_for_http(f"http://{host}/v2/", process)
        yield host
    finally:
        process.terminate()
        process.wait()
        log.close()


@contextmanager
def imds_on_link_local(directory: Path, instance_id: str, zone: str) -> Iterator[str]:
    """The IMDS emulator where an instance finds IMDS: 169.254.169.254, port 80.

    The address is added to loopback for the while (which needs root), so the boot script's
    curl and the agent's container (host network) reach it as they would on EC2.
    """
    address = f"{IMDS_ADDRESS}/32"
    present = (
        IMDS_ADDRESS
        in subprocess.run(
            ["ip", "-brief", "address", "show", "dev", "lo"], capture_output=True, text=True
        ).stdout
    )
    if not present:
        subprocess.run(["ip", "address", "add", address, "dev", "lo"], check=True)
    log = (directory / "imds.log").open("w")
    arguments = ["--host", IMDS_ADDRESS, "--port", "80", "--instance-id", instance_id]
    process = subprocess.Popen(
        [sys.executable, "-m", "gpu_agent.imds_emulator", *arguments, "--zone", zone],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://{IMDS_ADDRESS}"
    try:
        _wait_for_http(f"{url}/latest/api/token", process, method="PUT")
        yield url
    finally:
        process.terminate()
        process.wait()
        log.close()
        if not present:
            subprocess.run(["ip", "address", "del", address, "dev", "lo"], check=False)


def _wait_for_http(url: str, process: subprocess.Popen[bytes], method: str = "GET") -> None:
    deadline = time.monotonic() + SERVER_START_SECONDS
    headers = {"X-aws-ec2-metadata-token-ttl-seconds": "60"}
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args} exited with {process.returncode}")
        try:
            with urllib.request.urlopen(
                urllib.request.Request(url, method=method, headers=headers)
            ):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)  # polling: a server's start has no event here
