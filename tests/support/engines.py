"""The tests' vLLM engines, and the groups of tests that share a worker and its engines.

An engine starts when a worker's test first needs it (half a minute of two cores' time), serves
every later test of its group, and is closed as soon as the tests that come next on the worker
need it no more: a worker then holds only its current group's engines (each takes a gigabyte
or more), not every engine it ever started.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from pathlib import Path

import pytest

from gpu_agent.engine import Engine
from spotgate.settings import AgentSettings
from tests.support.agents import (
    LLAMA2_MODEL,
    LORA_MODEL,
    MAX_LORAS,
    REASONING_MODEL,
    TOOL_MODEL,
    vllm_settings,
)

FAILOVER = "tests/gateway/test_vllm_failover.py"
OPENAI = "tests/gateway/test_vllm_openai.py"
AGENT = "tests/gpu_agent/test_vllm_agent.py"
WORKER_GROUPS = {
    # The groups split the vLLM tests by engine and by file so that no one worker runs them
    # all; each starts the engines it uses (after a minute or two teaching the tool and
    # reasoning models their replies). The first prefix a test's node id starts with names
    # its group.
    f"{FAILOVER}::test_a_call_the_model_makes_of_its_own_accord": "vllm tools",
    f"{FAILOVER}::test_a_reasoning_models_thinking": "vllm reasoning",
    f"{FAILOVER}::test_a_stream_with_an_adapter": "vllm openai",
    FAILOVER: "vllm failover",
    f"{OPENAI}::test_a_tool_the_model_calls_of_its_own_accord": "vllm tools",
    f"{OPENAI}::test_langchain_binds_tools_and_the_model_picks_one": "vllm tools",
    f"{OPENAI}::test_the_responses_api_reports_a_call_the_model_chose": "vllm tools",
    f"{OPENAI}::test_vllms_own_": "vllm tools",
    f"{OPENAI}::test_a_completion_of_a_tool_calling_model": "vllm tools",
    f"{OPENAI}::test_a_completion_of_a_reasoning_model": "vllm reasoning",
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
"""The groups whose tests may use each engine fixture: a test on it in any other group would
start it once more."""


def worker_group(nodeid: str) -> str:
    """The unit of work a test belongs to: its group, or the test alone."""
    return next((group for path, group in WORKER_GROUPS.items() if nodeid.startswith(path)), nodeid)


def group_engines(nodeid: str) -> set[str]:
    """The engine fixtures the group of the test `nodeid` may use."""
    group = worker_group(nodeid)
    return {fixture for fixture, groups in ENGINE_GROUPS.items() if group in groups}


NEXT_TEST = pytest.StashKey["pytest.Item | None"]()
"""The test the worker runs after this one (None: this is its last), stashed on each test."""


class EngineShelf:
    """A worker's running engines, by fixture name."""

    def __init__(self) -> None:
        self._engines: dict[str, Engine] = {}

    async def lend(
        self, request: pytest.FixtureRequest, start: Callable[[], Awaitable[Engine]]
    ) -> Engine:
        """The engine of the fixture `request` runs, started if it is not running yet.

        Engines the requesting test's group does not use are closed first: their group ended
        with tests that used none, which `keep_only` after each test did not see. An engine
        that failed is started anew.
        """
        await self.keep_only(group_engines(request.node.nodeid))
        fixture = str(request.fixturename)
        running = self._engines.get(fixture)
        if running is not None and running.failure() is not None:
            # Dead (killed, say, when memory ran out): every later test of the group would
            # fail on it, each after waiting for its agent.
            await self._engines.pop(fixture).close()
        if fixture not in self._engines:
            self._engines[fixture] = await start()
        return self._engines[fixture]

    async def keep_only(self, fixtures: Collection[str]) -> None:
        """Close every running engine but those of `fixtures`."""
        for fixture in [name for name in self._engines if name not in fixtures]:
            await self._engines.pop(fixture).close()


@pytest.fixture(scope="session")
async def engine_shelf() -> AsyncIterator[EngineShelf]:
    shelf = EngineShelf()
    yield shelf
    await shelf.keep_only(())


@pytest.fixture
async def engines_for_the_next_test(
    request: pytest.FixtureRequest, engine_shelf: EngineShelf
) -> AsyncIterator[None]:
    """After the test: close the engines the worker's next test's group does not use.

    The vLLM test modules use it on every test (`pytestmark`), so it is set up before and torn
    down after whatever else the test holds, agents on an engine included.
    """
    yield
    following = request.node.stash.get(NEXT_TEST, None)
    await engine_shelf.keep_only(group_engines(following.nodeid) if following else ())


@pytest.fixture
async def vllm_engine(
    request: pytest.FixtureRequest, engine_shelf: EngineShelf, tiny_model_dir: Path
) -> Engine:
    return await engine_shelf.lend(request, lambda: _start(vllm_settings(tiny_model_dir)))


@pytest.fixture
async def vllm_llama2_engine(
    request: pytest.FixtureRequest, engine_shelf: EngineShelf, llama2_model_dir: Path
) -> Engine:
    settings = vllm_settings(llama2_model_dir, LLAMA2_MODEL)
    return await engine_shelf.lend(request, lambda: _start(settings))


@pytest.fixture
async def vllm_tool_engine(
    request: pytest.FixtureRequest, engine_shelf: EngineShelf, tool_model_dir: Path
) -> Engine:
    settings = vllm_settings(tool_model_dir, TOOL_MODEL, "hermes")
    return await engine_shelf.lend(request, lambda: _start(settings))


@pytest.fixture
async def vllm_reasoning_engine(
    request: pytest.FixtureRequest, engine_shelf: EngineShelf, reasoning_model_dir: Path
) -> Engine:
    settings = vllm_settings(reasoning_model_dir, REASONING_MODEL, "hermes", "qwen3")
    return await engine_shelf.lend(request, lambda: _start(settings))


@pytest.fixture
async def vllm_lora_engine(
    request: pytest.FixtureRequest,
    engine_shelf: EngineShelf,
    tiny_model_dir: Path,
    lora_adapter_dirs: dict[str, str],
) -> Engine:
    settings = vllm_settings(tiny_model_dir, LORA_MODEL)
    lora = {"lora_adapters": lora_adapter_dirs, "max_loras": MAX_LORAS}
    settings = settings.model_copy(update={"vllm": settings.vllm.model_copy(update=lora)})
    return await engine_shelf.lend(request, lambda: _start(settings))


async def _start(settings: AgentSettings) -> Engine:
    from gpu_agent.vllm_engine import VllmEngine  # vLLM loads only where an engine runs

    return await VllmEngine.start(settings)
