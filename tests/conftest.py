"""Fixtures shared by every suite: AWS emulator and Redis on loopback, a controllable clock."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from typing import Any

import openai
import pytest
from hypothesis import settings as hypothesis_settings
from xdist.remote import Producer
from xdist.scheduler import LoadScopeScheduling

from spotgate.registry import Registry
from spotgate.settings import LimitStoreSettings
from stack.emulator import AwsEmulator
from stack.local import OMP_THREADS_ENV, OMP_WAIT_POLICY_ENV
from stack.redis_server import RedisServer
from tests.support import stuck
from tests.support.agents import (  # fixtures for every suite  # noqa: F401
    ensure_tables,
    imds,
    llama2_model_dir,
    lora_adapter_dirs,
    reasoning_model_dir,
    ring,
    start_agent,
    synthetic_engine,
    tiny_model_dir,
    token,
    tool_model_dir,
)
from tests.support.clocks import FakeClock
from tests.support.engines import (  # noqa: F401
    ENGINE_GROUPS,
    NEXT_TEST,
    engine_shelf,
    engines_for_the_next_test,
    vllm_engine,
    vllm_llama2_engine,
    vllm_lora_engine,
    vllm_reasoning_engine,
    vllm_tool_engine,
    worker_group,
)

# The suite runs more processes than the machine has cores (workers, engines, whole stacks):
# OpenMP threads that spin while they wait take the time their peers need (teaching the tool
# model its reply under load: 84 s of CPU, 41 s with passive waits). torch is not loaded yet:
# its OpenMP reads this when it loads, in this process and in every child.
os.environ.setdefault(OMP_WAIT_POLICY_ENV, "PASSIVE")
# One OpenMP thread per process: a tiny model's matrices gain nothing from a second, and the
# suite's many processes keep both cores busy already.
os.environ.setdefault(OMP_THREADS_ENV, "1")

# Speed is for the benchmarks: a slow example on a busy machine is not a failure.
hypothesis_settings.register_profile("suite", deadline=None)
hypothesis_settings.load_profile("suite")


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


WHOLE_STACK_TESTS = (
    "tests/stack/test_local.py",
    "tests/cli/test_cli.py",
    "tests/loadtest/test_chaos.py",
    "tests/loadtest/test_soak.py",
    "tests/loadtest/test_hostile.py",
)
"""Tests that run a whole local stack, most for a minute or more: the workers take them first
(after the groups, which go largest first), so that none starts last and runs on alone."""


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, object, object]:
    """Stash on each test the one the worker runs next (`engines_for_the_next_test` reads it);
    watch it for its timeout (`tests.support.stuck`)."""
    item.stash[NEXT_TEST] = nextitem
    watchdog = stuck.watch(item)
    try:
        return (yield)
    finally:
        if watchdog is not None:
            watchdog.cancel()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A report of a test stuck near its timeout carries where it waited."""
    report = yield
    stuck.add_waits(item, report)
    return report


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """End the run saying where tests that ran into their timeout waited."""
    stuck.summary(terminalreporter)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Order whole-stack tests first; refuse a test on an engine outside its engine's groups."""
    items.sort(key=lambda item: not item.nodeid.startswith(WHOLE_STACK_TESTS))
    strays = [
        f"{item.nodeid} ({fixture})"
        for item in items
        for fixture in ENGINE_GROUPS.keys() & set(getattr(item, "fixturenames", ()))
        if worker_group(item.nodeid) not in ENGINE_GROUPS[fixture]
    ]
    if strays:
        raise pytest.UsageError(f"put them in a group of their engine in WORKER_GROUPS: {strays}")


@pytest.fixture(scope="session")
def aws_emulator() -> Iterator[AwsEmulator]:
    """One moto server (standalone, real HTTP) for the whole session."""
    emulator = AwsEmulator()
    emulator.start()
    yield emulator
    emulator.stop()


@pytest.fixture
def aws(aws_emulator: AwsEmulator) -> AwsEmulator:
    """The emulator, emptied of whatever an earlier test left (the registry's tables, if an
    earlier test made them, stay: empty)."""
    aws_emulator.empty()
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


@pytest.fixture
async def openai_client() -> AsyncIterator[Callable[..., openai.AsyncOpenAI]]:
    """`openai.AsyncOpenAI(**arguments)`, closed after the test: an SDK client left open holds
    its sockets until the garbage collector finds them, inside whichever test runs then."""
    clients: list[openai.AsyncOpenAI] = []

    def open_client(**arguments: Any) -> openai.AsyncOpenAI:
        clients.append(openai.AsyncOpenAI(**arguments))
        return clients[-1]

    yield open_client
    for client in clients:
        await client.close()
