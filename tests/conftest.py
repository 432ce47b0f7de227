"""Fixtures shared by every suite: a real AWS emulator on loopback and a controllable clock."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from hypothesis import settings as hypothesis_settings

from spotgate.registry import Registry
from stack.emulator import AwsEmulator
from tests.support.agents import (  # fixtures for every suite  # noqa: F401
    imds,
    llama2_model_dir,
    reset_emulator,
    ring,
    start_agent,
    synthetic_engine,
    tiny_model_dir,
    token,
    vllm_engine,
    vllm_llama2_engine,
)
from tests.support.clocks import FakeClock

# Speed is for the benchmarks: a slow example on a busy machine is not a failure.
hypothesis_settings.register_profile("suite", deadline=None)
hypothesis_settings.load_profile("suite")

VLLM_ENGINE_FIXTURES = frozenset({"vllm_engine", "vllm_llama2_engine"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests on a vLLM engine share one worker (`make test` runs two): each engine starts once."""
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if item.get_closest_marker("vllm") or fixtures & VLLM_ENGINE_FIXTURES:
            item.add_marker(pytest.mark.xdist_group("vllm"))


@pytest.fixture(scope="session")
def aws_emulator() -> Iterator[AwsEmulator]:
    """One moto server (standalone, real HTTP) for the whole session."""
    emulator = AwsEmulator()
    emulator.start()
    yield emulator
    emulator.stop()


@pytest.fixture
def aws(aws_emulator: AwsEmulator) -> AwsEmulator:
    """The emulator, emptied of whatever an earlier test left."""
    reset_emulator(aws_emulator)
    return aws_emulator


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def registry(aws: AwsEmulator, clock: FakeClock) -> AsyncIterator[Registry]:
    """A registry on fresh tables, reading time from `clock`."""
    async with Registry.open(aws.settings(), clock=clock) as opened:
        await opened.create_tables()
        yield opened
