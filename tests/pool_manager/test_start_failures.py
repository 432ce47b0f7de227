"""A model whose agents keep failing to start: its launches are held, not repeated in a loop."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pool_manager.controller import PassReport, PoolController
from pool_manager.pool_view import Launch
from pool_manager.provider import Instance
from pool_manager.start_failures import (
    LAUNCH_HOLD_SECONDS,
    StartFailures,
    note_starts,
)
from spotgate.registry import AgentRecord, AgentState, Registry
from tests.pool_manager.test_controller import MODEL, SETTINGS, MemoryProvider, register_ready
from tests.support.clocks import FakeClock

BAD_FLAG = "SPOTGATE_AGENT_VLLM__ENGINE_ARGS: --x 1: not an engine argument of vLLM's"
NO_MODEL = "OSError: /models/m: no config.json"


def failed(agent_id: str, at: float, failure: str = BAD_FLAG) -> AgentRecord:
    return AgentRecord(agent_id, "", MODEL, AgentState.GONE, 0, changed_at=at, failure=failure)


def ready(agent_id: str, at: float) -> AgentRecord:
    return AgentRecord(agent_id, "", MODEL, AgentState.READY, 8, ready_at=at, changed_at=at)


@pytest.mark.parametrize(
    ("passes", "in_a_row", "held_until"),
    [
        ([[failed("a", 10)]], 1, None),
        ([[failed("a", 10)], [failed("a", 10), failed("b", 20)]], 2, 20 + LAUNCH_HOLD_SECONDS[0]),
        ([[failed("a", 10), failed("b", 20)]], 2, 20 + LAUNCH_HOLD_SECONDS[0]),
        # Each entry counts once, however many passes read it.
        ([[failed("a", 10)], [failed("a", 10)], [failed("a", 10)]], 1, None),
        # Longer each time.
        ([[failed("a", 1), failed("b", 2), failed("c", 3)]], 3, 3 + LAUNCH_HOLD_SECONDS[1]),
        (
            [[failed(agent, at) for at, agent in enumerate("abcdefg", start=1)]],
            7,
            7 + LAUNCH_HOLD_SECONDS[-1],
        ),
        # Another reason starts a new row.
        ([[failed("a", 10), failed("b", 20, NO_MODEL)]], 1, None),
        # An agent ready since the last failure ends the row; one ready before it does not.
        ([[failed("a", 10)], [ready("r", 5), failed("a", 10), failed("b", 20)]], 2, 320.0),
        ([[failed("a", 10), failed("b", 20)], [ready("r", 30)]], 0, None),
    ],
    ids=[
        "one failure",
        "two in a row",
        "two read at once",
        "counted once",
        "three",
        "seven",
        "another reason",
        "ready before",
        "ready after",
    ],
)
def test_two_failures_in_a_row_with_one_reason_hold_launches_longer_each_time(
    passes: list[list[AgentRecord]], in_a_row: int, held_until: float | None
) -> None:
    failures = StartFailures()
    for records in passes:
        failures = note_starts(failures, records)
    assert failures.in_a_row == in_a_row
    assert failures.held_until() == held_until


async def test_the_pool_stops_relaunching_an_agent_that_fails_the_same_way(
    registry: Registry, clock: FakeClock
) -> None:
    provider = MemoryProvider(clock)
    controller = PoolController(
        registry=registry, provider=provider, settings=SETTINGS, models=(MODEL,), clock=clock
    )
    await registry.set_pool_target(MODEL, 1)

    async def fail(instance: Instance) -> None:
        record = failed(instance.agent_id, clock.now)
        await registry.register_failed(replace(record, url=f"http://{instance.agent_id}"))

    for rogue in ("i-rogue-1", "i-rogue-2"):  # rows of instances the pool never launched
        await registry.register_failed(failed(rogue, clock.now))
    first = await controller.reconcile()
    await fail(only(provider))
    second = await controller.reconcile()  # one failure: replaced
    await fail(only(provider))
    clock.advance(1)
    third = await controller.reconcile()  # the same again: held
    clock.advance(LAUNCH_HOLD_SECONDS[0])
    fourth = await controller.reconcile()  # tried once more
    await register_ready(registry, replace(only(provider), launched_at=clock.now))
    clock.advance(1)
    fifth = await controller.reconcile()

    assert [launches(report) for report in (first, second, third, fourth)] == [1, 1, 0, 1]
    assert first.held == second.held == {}
    assert third.held == {MODEL: BAD_FLAG}
    assert controller.start_failures[MODEL].in_a_row == 0  # a ready agent ended the row
    assert fifth.held == {}


def launches(report: PassReport) -> int:
    return sum(isinstance(action, Launch) for action in report.actions)


def only(provider: MemoryProvider) -> Instance:
    (instance,) = provider.running.values()
    return instance
