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

FAILOVER = "tests/gateway/test_vllm_failover.py"
OPENAI = "tests/gateway/test_vllm_openai.py"
AGENT = "tests/gpu_agent/test_vllm_agent.py"
WORKER_GROUPS = {
    # A vLLM engine starts once in each group whose tests use it (half a minute on two cores,
    # after a minute or two teaching the tool and reasoning models their replies); the groups
    # split the vLLM tests by engine and by file so that no one worker runs them all. The
    # first prefix a test's node id starts with names its group.
    f"{FAILOVER}::test_a_call_the_model_makes_of_its_own_accord": "vllm tools",
    f"{FAILOVER}::test_a_reasoning_models_thinking": "vllm reasoning",
    f"{FAILOVER}::test_a_stream_with_an_adapter": "vllm openai",
    FAILOVER: "vllm failover",
    f"{OPENAI}::test_a_tool_the_model_calls_of_its_own_accord": "vllm tools",
    f"{OPENAI}::test_langchain_binds_tools_and_the_model_picks_one": "vllm tools",
    f"{OPENAI}::test_the_responses_api_reports_a_call_the_model_chose": "vllm tools",
    f"{OPENAI}::test_vllms_own_": "vllm tools",
    f"{OPENAI}::test_a_reasoning_models_thinking": "vllm reasoning",
    f"{OPENAI}::test_thinking_turned_off": "vllm reasoning",
    f"{OPENAI}::test_a_turns_thinking": "vllm reasoning",
    f"{OPENAI}::test_the_responses_api_gives_the_thinking": "vllm reasoning",
    OPENAI: "vllm openai",
    f"{AGENT}::test_a_maximal_tools_payload": "vllm tools",
    f"{AGENT}::test_a_dead_engine_core": f"{AGENT}::test_a_dead_engine_core",  # its own engine
    AGENT: "vllm agent",
    # One synthesis serves every test of the CDK app.
    "infra/cdk/tests/": "cdk",
    # One `spotgate up` serves the module.
    "tests/loadtest/test_runner.py": "local stack",
    "tests/docs/test_runnable_commands.py": "docs stack",
}
"""Tests that must share a worker when `make test` runs the suite on several (pytest-xdist);
every other test goes to whichever worker is free."""
ENGINE_GROUPS = {
    "vllm_engine": {"vllm failover", "vllm openai", "vllm agent"},
    "vllm_llama2_engine": {"vllm failover", "vllm agent"},
    "vllm_tool_engine": {"vllm tools"},
    "vllm_reasoning_engine": {"vllm reasoning"},
    "vllm_lora_engine": {"vllm openai"},
}
"""The groups that may start each session-scoped vLLM engine: a test on it in any other group
would start it once more."""


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


WHOLE_STACK_TESTS = (
    "tests/stack/test_local.py",
    "tests/cli/test_cli.py",
    "tests/loadtest/test_chaos.py",
    "tests/loadtest/test_soak.py",
    "tests/loadtest/test_hostile.py",
)
"""Tests that run a whole local stack, most for a minute or more: the workers take them first
(after the groups, which go largest first), so that none starts last and runs on alone."""


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
