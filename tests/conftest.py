"""Fixtures shared by every suite: AWS emulator and Redis on loopback, a controllable clock."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from hypothesis import settings as hypothesis_settings
from xdist.remote import Producer
from xdist.scheduler import LoadScopeScheduling

from spotgate.registry import Registry
from spotgate.settings import LimitStoreSettings
from stack.emulator import AwsEmulator
from stack.redis_server import RedisServer
from tests.support.agents import (  # fixtures for every suite  # noqa: F401
    ensure_tables,
    imds,
    llama2_model_dir,
    lora_adapter_dirs,
    reasoning_model_dir,
    reset_emulator,
    ring,
    start_agent,
    synthetic_engine,
    tiny_model_dir,
    token,
    tool_model_dir,
    vllm_engine,
    vllm_llama2_engine,
    vllm_lora_engine,
    vllm_reasoning_engine,
    vllm_tool_engine,
)
from tests.support.clocks import FakeClock

# Speed is for the benchmarks: a slow example on a busy machine is not a failure.
hypothesis_settings.register_profile("suite", deadline=None)
hypothesis_settings.load_profile("suite")

WORKER_GROUPS = {
    # Each starts the session's vLLM engines (a minute or two on two cores): once, on one worker.
    "tests/gpu_agent/test_vllm_agent.py": "vllm",
    "tests/gateway/test_vllm_failover.py": "vllm",
    "tests/gateway/test_vllm_openai.py": "vllm",
    # One synthesis serves every test of the CDK app.
    "infra/cdk/tests/": "cdk",
    # One `spotgate up` serves the module.
    "tests/loadtest/test_runner.py": "local stack",
    "tests/docs/test_runnable_commands.py": "docs stack",
}
"""Tests that must share a worker when `make test` runs the suite on several (pytest-xdist);
every other test goes to whichever worker is free."""
VLLM_ENGINE_FIXTURES = frozenset(
    {
        "vllm_engine",
        "vllm_llama2_engine",
        "vllm_tool_engine",
        "vllm_reasoning_engine",
        "vllm_lora_engine",
    }
)


def worker_group(nodeid: str) -> str:
    """The unit of work a test belongs to: its group, or the test alone."""
    return next((group for path, group in WORKER_GROUPS.items() if nodeid.startswith(path)), nodeid)


class GroupedScheduling(LoadScopeScheduling):
    """pytest-xdist's scheduling by scope, with `worker_group` as the scope.

    xdist's own `loadgroup` marks a test's group in its node id, which pytest 9 no longer lets
    a plugin change: grouping here needs only the node id.
    """

    def _split_scope(self, nodeid: str) -> str:
        return worker_group(nodeid)


@pytest.hookimpl(optionalhook=True)  # defined by pytest-xdist, absent without it
def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> GroupedScheduling:
    """Run the suite's workers with `GroupedScheduling`."""
    return GroupedScheduling(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Refuse a test on a vLLM engine outside the vLLM group: it would start engines again."""
    strays = [
        item.nodeid
        for item in items
        if VLLM_ENGINE_FIXTURES & set(getattr(item, "fixturenames", ()))
        and worker_group(item.nodeid) != "vllm"
    ]
    if strays:
        raise pytest.UsageError(f"add their files to WORKER_GROUPS as 'vllm': {strays}")


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


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One Debian `redis-server` for the session: the gateways' limit store."""
    server = RedisServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def limit_store(redis_server: RedisServer) -> LimitStoreSettings:
    """Settings of the session's limit store, emptied of whatever an earlier test left."""
    redis_server.flush()
    return redis_server.settings()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def registry(aws: AwsEmulator, clock: FakeClock) -> AsyncIterator[Registry]:
    """A registry on fresh tables, reading time from `clock`."""
    await ensure_tables(aws)
    async with Registry.open(aws.settings(), clock=clock) as opened:
        yield opened
