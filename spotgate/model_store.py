"""Models staged in S3: copied once by `spotgate model stage`, fetched by every agent at boot.

A staged model is a prefix holding the model directory's files as they were (weights,
config, tokenizer, chat template) and, written last, `spotgate-model.json`: each file's
path, size and SHA-256. A prefix without it was never staged completely and is refused.
Agents fetch with many ranged GETs at once (S3 serves each connection at a fraction of an
instance's bandwidth), check every file against the manifest, and keep what they fetched:
a restarted agent fetches nothing again.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import aiohttp
from boto3.exceptions import S3UploadFailedError
from botocore.exceptions import BotoCoreError, ClientError

from spotgate.registry.aws import aws_session
from spotgate.settings import AwsSettings

MANIFEST_NAME = "spotgate-model.json"
S3_SCHEME = "s3://"
PART_BYTES = 64 * 1024 * 1024
"""One ranged GET: large enough to keep a connection busy, small enough to spread a file."""
TRANSFER_CONCURRENCY = 16
"""GETs (or PUTs) in flight at once, over all of a model's files."""
HASH_CHUNK_BYTES = 8 * 1024 * 1024
PART_ATTEMPTS = 4
"""Tries of one ranged GET before the fetch fails: a dropped connection is not a failure."""
PART_RETRY_SECONDS = 0.5
TRANSFER_ERRORS = (
    ClientError,
    BotoCoreError,
    S3UploadFailedError,
    aiohttp.ClientError,
    TimeoutError,
)
"""What a transfer to or from S3 fails with: refused, or cut off on the way."""


class ModelStoreError(Exception):
    """A model could not be staged or fetched; the message says which and why."""


@dataclass(frozen=True, slots=True)
class StagedFile:
    """One file of a staged model."""

    path: str  # relative to the model's directory, `/`-separated
    size: int
    sha256: str


@dataclass(frozen=True, slots=True)
class ModelManifest:
    """What a staged model holds, written after everything else."""

    files: tuple[StagedFile, ...]
    source: str  # what was staged (a directory's name)
    staged_at: float

    def to_json(self) -> str:
        """The manifest as stored."""
        return json.dumps(
            {"source": self.source, "staged_at": self.staged_at,
             "files": [asdict(file) for file in self.files]},
            indent=2,
        )  # fmt: skip

    @classmethod
    def from_json(cls, text: str | bytes) -> ModelManifest:
        """A stored manifest; `ModelStoreError` when it is not one."""
        try:
            document: dict[str, Any] = json.loads(text)
            files = tuple(
                StagedFile(_safe_path(str(f["path"])), int(f["size"]), str(f["sha256"]))
                for f in document["files"]
            )
            manifest = cls(files, str(document["source"]), float(document["staged_at"]))
        except (ValueError, KeyError, TypeError) as err:
            raise ModelStoreError(f"{MANIFEST_NAME} is not a model manifest: {err}") from err
        if len({file.path for file in files}) != len(files):
            raise ModelStoreError(f"{MANIFEST_NAME} names a file twice")
        return manifest

    @property
    def total_bytes(self) -> int:
        """The model's size."""
        return sum(file.size for file in self.files)


def _safe_path(path: str) -> str:
    """A manifest's file path, refused unless it stays inside the model's directory.

    Whoever can write the bucket must not be able to make an agent write elsewhere (its
    home, its packages): no absolute paths, no `..`, no empty or `.` parts, no backslashes.
    """
    parts = path.split("/")
    if not path or "\\" in path or any(part in ("", ".", "..") for part in parts):
        raise ValueError(f"unsafe file path {path!r}")
    return path


def is_s3_uri(model: str) -> bool:
    """Whether a model setting names a staged model (`s3://bucket/prefix`)."""
    return model.startswith(S3_SCHEME)


def split_s3_uri(uri: str) -> tuple[str, str]:
    """`s3://bucket/some/prefix` as (bucket, `some/prefix`)."""
    if not is_s3_uri(uri):
        raise ModelStoreError(f"{uri} is not an s3:// URI")
    bucket, _, prefix = uri[len(S3_SCHEME) :].partition("/")
    if not bucket:
        raise ModelStoreError(f"{uri} names no bucket")
    return bucket, prefix.strip("/")


def _key(prefix: str, path: str) -> str:
    return f"{prefix}/{path}" if prefix else path


def sha256_of(path: Path) -> str:
    """A file's SHA-256, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(HASH_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def _model_files(directory: Path) -> Iterator[Path]:
    for path in sorted(directory.rglob("*")):
        relative = path.relative_to(directory)
        if path.is_file() and not any(part.startswith(".") for part in relative.parts):
            yield path


STAGEABLE_CONFIGS = ("config.json", "adapter_config.json")
"""What a directory to stage holds: a model's config, or a LoRA adapter's."""


async def stage_model(directory: Path, uri: str, aws: AwsSettings) -> ModelManifest:
    """Copy a model (or adapter) directory to `uri`, every file then the manifest."""
    bucket, prefix = split_s3_uri(uri)
    if not prefix:  # staging clears what else is under its prefix: never a whole bucket
        raise ModelStoreError(f"{uri} names no prefix: stage to s3://{bucket}/<model>")
    files = list(_model_files(directory))
    if not any((directory / name).is_file() for name in STAGEABLE_CONFIGS):
        raise ModelStoreError(
            f"{directory} holds no config.json (a model) or adapter_config.json (a LoRA "
            "adapter): nothing to stage"
        )
    hashes = await asyncio.gather(*(asyncio.to_thread(sha256_of, path) for path in files))
    manifest = ModelManifest(
        files=tuple(
            StagedFile(path.relative_to(directory).as_posix(), path.stat().st_size, digest)
            for path, digest in zip(files, hashes, strict=True)
        ),
        source=directory.name,
        staged_at=time.time(),
    )
    session = aws_session(aws)
    gate = asyncio.Semaphore(TRANSFER_CONCURRENCY)
    async with session.client("s3", endpoint_url=aws.endpoint_url) as s3:
        try:
            # A manifest left from an earlier staging would vouch for files being replaced.
            await s3.delete_object(Bucket=bucket, Key=_key(prefix, MANIFEST_NAME))

            async def upload(path: Path, staged: StagedFile) -> None:
                async with gate:
                    await s3.upload_file(str(path), bucket, _key(prefix, staged.path))

            async with asyncio.TaskGroup() as uploads:
                for path, staged in zip(files, manifest.files, strict=True):
                    uploads.create_task(upload(path, staged))
            # Files of an earlier model under the prefix would be read with this one's (a
            # loader takes every shard it lists): only the manifest's files stay.
            kept = {_key(prefix, file.path) for file in manifest.files}
            paginator = s3.get_paginator("list_objects_v2")
            async for page in paginator.paginate(Bucket=bucket, Prefix=_key(prefix, "")):
                for stale in [o["Key"] for o in page.get("Contents", []) if o["Key"] not in kept]:
                    await s3.delete_object(Bucket=bucket, Key=stale)
            await s3.put_object(
                Bucket=bucket,
                Key=_key(prefix, MANIFEST_NAME),
                Body=manifest.to_json().encode(),
                ContentType="application/json",
            )
        except* TRANSFER_ERRORS as group:
            raise ModelStoreError(f"staging to {uri} failed: {_first(group)}") from group
    return manifest


def cache_directory(cache: Path, uri: str) -> Path:
    """Where an agent keeps the files of the staged model at `uri` (`~` is the home)."""
    bucket, prefix = split_s3_uri(uri)
    return cache.expanduser() / bucket / PurePosixPath(prefix or "_")


async def fetch_model(
    uri: str, cache: Path, aws: AwsSettings, *, part_bytes: int = PART_BYTES
) -> Path:
    """Fetch the staged model at `uri` into the cache (what is there and checks out is kept).

    Returns the local model directory. Every file is checked against the manifest's size
    and SHA-256 before the directory is returned.
    """
    bucket, prefix = split_s3_uri(uri)
    into = cache_directory(cache, uri)
    session = aws_session(aws)
    async with session.client("s3", endpoint_url=aws.endpoint_url) as s3:
        manifest = await _read_manifest(s3, uri)
        whole = await asyncio.gather(
            *(asyncio.to_thread(_is_whole, into / f.path, f) for f in manifest.files)
        )
        missing = [f for f, ok in zip(manifest.files, whole, strict=True) if not ok]
        gate = asyncio.Semaphore(TRANSFER_CONCURRENCY)

        async def part(staged: StagedFile, target: Path, start: int) -> None:
            end = min(start + part_bytes, staged.size) - 1
            # Held through the write: at most this many parts are in memory at once.
            async with gate:
                for attempt in range(PART_ATTEMPTS):
                    try:
                        response = await s3.get_object(
                            Bucket=bucket,
                            Key=_key(prefix, staged.path),
                            Range=f"bytes={start}-{end}",
                        )
                        # Released however the read ends: a part cancelled mid-read (a
                        # sibling failed) must not leave its connection to the GC.
                        async with response["Body"] as body:
                            data = await body.read()
                        break
                    except TRANSFER_ERRORS as err:
                        if attempt + 1 == PART_ATTEMPTS:
                            raise ModelStoreError(
                                f"fetching {staged.path} of {uri}: {err}"
                            ) from err
                        await asyncio.sleep(PART_RETRY_SECONDS * (attempt + 1))
                if len(data) != end - start + 1:
                    raise ModelStoreError(
                        f"{staged.path} of {uri} is shorter than its manifest says"
                    )
                await asyncio.to_thread(_write_at, target, start, data)

        async def fetch(staged: StagedFile) -> None:
            final = into / staged.path
            if not final.resolve().is_relative_to(into.resolve()):  # a link planted on disk
                raise ModelStoreError(f"{staged.path} of {uri} leads outside {into}")
            final.parent.mkdir(parents=True, exist_ok=True)
            partial = final.with_name(f".{final.name}.partial")
            with partial.open("wb") as handle:
                handle.truncate(staged.size)
            async with asyncio.TaskGroup() as parts:
                for start in range(0, staged.size, part_bytes):
                    parts.create_task(part(staged, partial, start))
            if await asyncio.to_thread(sha256_of, partial) != staged.sha256:
                partial.unlink()
                raise ModelStoreError(f"{staged.path} of {uri} does not match its manifest")
            partial.replace(final)

        try:
            async with asyncio.TaskGroup() as files:
                for staged in missing:
                    files.create_task(fetch(staged))
        except* ModelStoreError as group:  # the first failure, whole: the rest were cancelled
            raise _first(group) from None
    return into


async def read_manifest(uri: str, aws: AwsSettings) -> ModelManifest:
    """The manifest of the staged model at `uri`: `ModelStoreError` if it was never staged."""
    async with aws_session(aws).client("s3", endpoint_url=aws.endpoint_url) as s3:
        return await _read_manifest(s3, uri)


async def _read_manifest(s3: Any, uri: str) -> ModelManifest:
    bucket, prefix = split_s3_uri(uri)
    try:
        response = await s3.get_object(Bucket=bucket, Key=_key(prefix, MANIFEST_NAME))
        async with response["Body"] as body:
            return ModelManifest.from_json(await body.read())
    except ClientError as err:
        code = err.response.get("Error", {}).get("Code", "")
        if code in ("NoSuchKey", "404", "NoSuchBucket"):
            raise ModelStoreError(
                f"{uri} is not a staged model (no {MANIFEST_NAME}; "
                "stage it with `spotgate model stage`)"
            ) from err
        raise ModelStoreError(f"reading {uri}: {err}") from err


def _first(group: BaseExceptionGroup[Exception]) -> Exception:
    """The first error in a (nested) group: what a task group's failure was about."""
    first = group.exceptions[0]
    return _first(first) if isinstance(first, BaseExceptionGroup) else first


def _is_whole(path: Path, staged: StagedFile) -> bool:
    """Whether a file fetched earlier is there whole (same size and SHA-256)."""
    if not path.is_file() or path.stat().st_size != staged.size:
        return False
    return sha256_of(path) == staged.sha256


def _write_at(path: Path, offset: int, data: bytes) -> None:
    descriptor = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(descriptor, data, offset)
    finally:
        os.close(descriptor)
