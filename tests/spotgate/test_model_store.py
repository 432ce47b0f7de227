"""Staging a model in S3 and fetching it back, against the emulator's S3 (moto, real HTTP)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from spotgate.model_store import (
    MANIFEST_NAME,
    ModelManifest,
    ModelStoreError,
    StagedFile,
    cache_directory,
    fetch_model,
    split_s3_uri,
    stage_model,
)
from spotgate.registry import aws_session
from stack.emulator import AwsEmulator

BUCKET = "models"
URI = f"s3://{BUCKET}/tiny/v1"


@pytest.fixture
async def bucket(aws: AwsEmulator) -> str:
    settings = aws.settings().aws
    async with aws_session(settings).client("s3", endpoint_url=settings.endpoint_url) as s3:
        await s3.create_bucket(Bucket=BUCKET)
    return BUCKET


@pytest.fixture
def model(tmp_path: Path) -> Path:
    """A model directory of kB-sized files: the store copies files as they are, whatever they
    hold, and parts of 1 kB below split each into a few ranged GETs, not thousands."""
    directory = tmp_path / "tiny"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 512}))
    (directory / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {"a": 0, "b": 1}}}))
    (directory / "model.safetensors").write_bytes(os.urandom(25_500))
    (directory / "nested").mkdir()
    (directory / "nested" / "weights.bin").write_bytes(os.urandom(10_000))
    (directory / ".cache").mkdir()
    (directory / ".cache" / "lock").write_text("not part of the model")
    return directory


def same_files(a: Path, b: Path) -> bool:
    listed = [sorted(p.relative_to(d) for p in d.rglob("*") if p.is_file()) for d in (a, b)]
    return listed[0] == listed[1] and all(
        (a / name).read_bytes() == (b / name).read_bytes() for name in listed[0]
    )


@pytest.mark.parametrize(
    ("uri", "parts"),
    [("s3://b/p/q", ("b", "p/q")), ("s3://b", ("b", "")), ("s3://b/p/", ("b", "p"))],
)
def test_s3_uris_split_into_bucket_and_prefix(uri: str, parts: tuple[str, str]) -> None:
    assert split_s3_uri(uri) == parts


async def test_a_staged_model_is_fetched_whole_and_checked_in_ranged_parts(
    aws: AwsEmulator, bucket: str, model: Path, tmp_path: Path
) -> None:
    settings = aws.settings().aws
    manifest = await stage_model(model, URI, settings)
    assert "nested/weights.bin" in {f.path for f in manifest.files}
    assert not any(f.path.startswith(".") for f in manifest.files)  # hidden files stay behind
    shutil.rmtree(model / ".cache")

    cache = tmp_path / "cache"
    fetched = await fetch_model(URI, cache, settings, part_bytes=1_000)
    assert fetched == cache_directory(cache, URI)
    assert same_files(fetched, model)

    # Fetched again (an agent restarted): what is there and checks out is kept, not fetched.
    weights = fetched / "nested" / "weights.bin"
    before = weights.stat().st_mtime_ns
    assert await fetch_model(URI, cache, settings) == fetched
    assert weights.stat().st_mtime_ns == before
    # A damaged local copy is fetched again.
    weights.write_bytes(b"x" * 10_000)
    await fetch_model(URI, cache, settings)
    assert same_files(fetched, model)


async def test_a_prefix_never_staged_whole_is_refused_by_name(
    aws: AwsEmulator, bucket: str, model: Path, tmp_path: Path
) -> None:
    settings = aws.settings().aws
    async with aws_session(settings).client("s3", endpoint_url=settings.endpoint_url) as s3:
        await s3.put_object(Bucket=bucket, Key="half/config.json", Body=b"{}")  # no manifest
    with pytest.raises(ModelStoreError, match="not a staged model"):
        await fetch_model(f"s3://{bucket}/half", tmp_path, settings)
    with pytest.raises(ModelStoreError, match="names no prefix"):  # it would clear the bucket
        await stage_model(model, f"s3://{bucket}", settings)
    with pytest.raises(ModelStoreError, match=r"no config\.json"):
        await stage_model(model / "nested", f"s3://{bucket}/empty", settings)


async def test_an_object_changed_after_staging_fails_the_fetch(
    aws: AwsEmulator, bucket: str, model: Path, tmp_path: Path
) -> None:
    settings = aws.settings().aws
    await stage_model(model, URI, settings)
    async with aws_session(settings).client("s3", endpoint_url=settings.endpoint_url) as s3:
        await s3.put_object(Bucket=bucket, Key="tiny/v1/config.json", Body=b"{" + b" " * 10)
        stored = await s3.get_object(Bucket=bucket, Key=f"tiny/v1/{MANIFEST_NAME}")
        manifest = ModelManifest.from_json(await stored["Body"].read())
    size = next(f.size for f in manifest.files if f.path == "config.json")
    with pytest.raises(ModelStoreError, match=r"config.json of .* (shorter|does not match)"):
        await fetch_model(URI, tmp_path, settings)
    assert size > 0
    assert not (cache_directory(tmp_path, URI) / "config.json").exists()  # nothing half-kept


async def test_restaging_replaces_the_manifest_and_leaves_no_file_of_the_old_model(
    aws: AwsEmulator, bucket: str, model: Path, tmp_path: Path
) -> None:
    settings = aws.settings().aws
    first = await stage_model(model, URI, settings)
    (model / "nested" / "weights.bin").write_bytes(os.urandom(20_000))
    (model / "config.json").rename(model / "nested" / "config.json")  # a shard that goes
    (model / "config.json").write_text("{}")
    second = await stage_model(model, URI, settings)
    assert second != first
    async with aws_session(settings).client("s3", endpoint_url=settings.endpoint_url) as s3:
        listed = await s3.list_objects_v2(Bucket=bucket, Prefix="tiny/v1/")
    keys = {item["Key"].removeprefix("tiny/v1/") for item in listed["Contents"]}
    assert keys == {f.path for f in second.files} | {MANIFEST_NAME}
    fetched = await fetch_model(URI, tmp_path, settings)
    assert (fetched / "nested" / "weights.bin").stat().st_size == 20_000


@pytest.mark.parametrize(
    "path", ["../outside", "/etc/passwd", "a/../../b", "a//b", "./a", "a\\..\\b", ""]
)
async def test_a_manifest_naming_a_file_outside_the_model_is_refused(
    aws: AwsEmulator, bucket: str, tmp_path: Path, path: str
) -> None:
    settings = aws.settings().aws
    hostile = ModelManifest((StagedFile(path, 1, "0" * 64),), "x", 0.0)
    async with aws_session(settings).client("s3", endpoint_url=settings.endpoint_url) as s3:
        await s3.put_object(
            Bucket=bucket, Key=f"evil/{MANIFEST_NAME}", Body=hostile.to_json().encode()
        )
    with pytest.raises(ModelStoreError, match="not a model manifest"):
        await fetch_model(f"s3://{bucket}/evil", tmp_path / "cache", settings)
    assert not (tmp_path / "cache").exists()
