"""LoRA adapters on an agent: which to give up for a new one, and staged ones fetched."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from gpu_agent.adapters import Adapters, AdaptersBusy, AdapterUnknown, Unload, adapter_to_unload
from gpu_agent.tiny_model import write_tiny_adapter
from spotgate.model_store import fetch_model, stage_model
from spotgate.registry import aws_session
from stack.emulator import AwsEmulator

UNLOAD_CASES = {
    "room left": (["a"], {}, 2, None),
    "full: the least lately used idle one goes": (["a", "b"], {"a": 1}, 2, Unload("b")),
    "full: the oldest when none is in use": (["a", "b"], {}, 2, Unload("a")),
}


@pytest.mark.parametrize(
    ("loaded", "in_use", "most", "decision"), UNLOAD_CASES.values(), ids=UNLOAD_CASES
)
def test_a_new_adapter_takes_the_place_of_an_idle_one(
    loaded: list[str], in_use: dict[str, int], most: int, decision: Unload | None
) -> None:
    assert adapter_to_unload(loaded, in_use, most) == decision


def test_with_every_slot_in_use_the_stream_is_refused_for_capacity() -> None:
    with pytest.raises(AdaptersBusy, match="all 2 adapter slots are in use"):
        adapter_to_unload(["a", "b"], {"a": 1, "b": 2}, 2)


async def test_an_agents_adapters_load_on_demand_and_give_way_when_idle(tmp_path: Path) -> None:
    async def never(_uri: str) -> Path:
        raise AssertionError("a local adapter is not fetched")

    adapters = Adapters({"a": "/a", "b": "/b", "c": "/c"}, max_loaded=2, fetch=never)
    assert adapters.to_unload("a") is None
    adapters.acquired("a", await adapters.path("a"))
    adapters.acquired("b", await adapters.path("b"))
    assert adapters.to_unload("a") is None  # loaded already
    adapters.released("b")
    assert adapters.to_unload("c") == Unload("b")  # "a" still runs a stream
    with pytest.raises(
        AdapterUnknown, match="no adapter 'z' here; the adapters served are: a, b, c"
    ):
        adapters.to_unload("z")
    assert [adapters.id_of(name) for name in "abc"] == [1, 2, 3]


async def test_a_staged_adapter_is_fetched_from_s3_on_first_use(
    aws: AwsEmulator, tiny_model_dir: Path, tmp_path: Path
) -> None:
    settings = aws.settings().aws
    async with aws_session(settings).client("s3", endpoint_url=settings.endpoint_url) as s3:
        await s3.create_bucket(Bucket="adapters")
    written = write_tiny_adapter(tmp_path / "written", tiny_model_dir, seed=1)
    await stage_model(written, "s3://adapters/tiny/a1", settings)
    fetch = functools.partial(fetch_model, cache=tmp_path / "cache", aws=settings)
    adapters = Adapters({"a1": "s3://adapters/tiny/a1"}, max_loaded=1, fetch=fetch)

    local = await adapters.path("a1")

    assert local != written
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        assert (local / name).read_bytes() == (written / name).read_bytes()


async def test_a_loaded_staged_adapter_is_not_fetched_again(tmp_path: Path) -> None:
    fetched: list[str] = []

    async def fetch(uri: str) -> Path:
        fetched.append(uri)
        return tmp_path / "a1"

    adapters = Adapters({"a1": "s3://adapters/tiny/a1"}, max_loaded=1, fetch=fetch)
    adapters.acquired("a1", await adapters.path("a1"))
    adapters.released("a1")
    assert await adapters.path("a1") == tmp_path / "a1"
    assert fetched == ["s3://adapters/tiny/a1"]  # once, for its load
