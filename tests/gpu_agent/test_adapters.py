"""LoRA adapters on an agent: which to give up for a new one, and staged ones fetched."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from gpu_agent.adapters import (
    Adapters,
    AdaptersBusy,
    AdapterUnknown,
    Loaded,
    Unload,
    adapter_to_unload,
)
from gpu_agent.tiny_model import write_tiny_adapter
from spotgate.model_store import fetch_model, stage_model
from spotgate.registry import aws_session
from stack.emulator import AwsEmulator


def slots(*held: str) -> list[Loaded]:
    """Loaded adapters, least lately used first, each `name/tenant`."""
    return [Loaded(*adapter.split("/")) for adapter in held]


UNLOAD_CASES = {
    "room left": (slots("a/k"), {}, 2, "k", None),
    "full: the least lately used idle one goes": (slots("a/k", "b/k"), {"a": 1}, 2, "k", "b"),
    "full: the oldest when none is in use": (slots("a/k", "b/k"), {}, 2, "k", "a"),
    # Two keys share four slots, two each: one at its share gives up only its own.
    "at its share: its own, though another's is older": (
        slots("x1/other", "x2/other", "m1/k", "m2/k"),
        {},
        4,
        "k",
        "m1",
    ),
    "below its share: an idle one of a key above its share": (
        slots("x1/other", "x2/other", "x3/other", "m1/k"),
        {"x1": 1},
        4,
        "k",
        "x2",
    ),
    "a newcomer takes from the key above its share, not from one at it": (
        slots("a1/a", "b1/b", "b2/b", "b3/b"),
        {},
        4,
        "c",
        "b1",
    ),
    "a newcomer's share is at least one slot": (slots("a1/a", "b1/b"), {}, 2, "c", "a1"),
}


@pytest.mark.parametrize(
    ("loaded", "in_use", "most", "tenant", "unloaded"), UNLOAD_CASES.values(), ids=UNLOAD_CASES
)
def test_a_new_adapter_takes_the_place_of_an_idle_one_within_its_keys_share(
    loaded: list[Loaded], in_use: dict[str, int], most: int, tenant: str, unloaded: str | None
) -> None:
    decision = adapter_to_unload(loaded, in_use, most, tenant)
    assert decision == (Unload(unloaded) if unloaded else None)


@pytest.mark.parametrize(
    ("loaded", "in_use", "tenant"),
    [
        (slots("a/k", "b/k"), {"a": 1, "b": 2}, "k"),  # every slot in use
        # One key cycling through adapters at its share cannot evict the other's idle ones.
        (slots("x1/other", "x2/other", "m1/k", "m2/k"), {"m1": 1, "m2": 1}, "k"),
    ],
)
def test_a_key_that_can_free_no_slot_is_refused_for_capacity(
    loaded: list[Loaded], in_use: dict[str, int], tenant: str
) -> None:
    with pytest.raises(AdaptersBusy, match="no adapter slot can be freed for this key here"):
        adapter_to_unload(loaded, in_use, len(loaded), tenant)


async def test_an_agents_adapters_load_on_demand_and_give_way_when_idle(tmp_path: Path) -> None:
    async def never(_uri: str) -> Path:
        raise AssertionError("a local adapter is not fetched")

    adapters = Adapters({"a": "/a", "b": "/b", "c": "/c"}, max_loaded=2, fetch=never)
    assert adapters.to_unload("a", "k") is None
    adapters.acquired("a", await adapters.path("a"), "k")
    adapters.acquired("b", await adapters.path("b"), "other")
    assert adapters.to_unload("a", "k") is None  # loaded already
    adapters.released("b")
    assert adapters.to_unload("c", "other") == Unload("b")  # "a" still runs a stream
    # "k" holds its share (one of two slots): the other key's idle "b" is not its to give up.
    with pytest.raises(AdaptersBusy):
        adapters.to_unload("c", "k")
    adapters.acquired("b", await adapters.path("b"), "k")  # used by "k" too: still "other"'s
    adapters.released("b")
    with pytest.raises(AdaptersBusy):
        adapters.to_unload("c", "k")
    with pytest.raises(
        AdapterUnknown, match="no adapter 'z' here; the adapters served are: a, b, c"
    ):
        adapters.to_unload("z", "k")
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
    adapters.acquired("a1", await adapters.path("a1"), "k")
    adapters.released("a1")
    assert await adapters.path("a1") == tmp_path / "a1"
    assert fetched == ["s3://adapters/tiny/a1"]  # once, for its load
