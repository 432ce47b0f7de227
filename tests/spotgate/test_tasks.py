"""A stop's tasks end within a bound; a stuck one is named with where it waits, and left."""

from __future__ import annotations

import asyncio

from structlog.testing import capture_logs

from spotgate.tasks import awaiting, ended


async def _waits_forever(never: asyncio.Event) -> None:
    await never.wait()


async def _refuses_to_stop(released: asyncio.Event) -> None:
    while not released.is_set():
        try:
            await _waits_forever(released)
        except asyncio.CancelledError:
            continue  # what a stop must not wait on forever


async def _fails_when_cancelled(never: asyncio.Event) -> None:
    try:
        await never.wait()
    except asyncio.CancelledError:
        raise RuntimeError("failed while stopping") from None


async def test_cancelled_tasks_end_and_a_failure_is_logged_not_raised() -> None:
    never = asyncio.Event()
    obedient = asyncio.create_task(_waits_forever(never))
    failing = asyncio.create_task(_fails_when_cancelled(never))
    await asyncio.sleep(0)  # both start waiting

    with capture_logs() as logs:
        assert await ended([obedient, failing]) == []

    assert obedient.cancelled()
    assert isinstance(failing.exception(), RuntimeError)
    [failure] = logs
    assert failure["event"] == "task failed as it stopped"


async def test_a_task_that_will_not_stop_is_left_behind_and_says_where_it_waits() -> None:
    released = asyncio.Event()
    stubborn = asyncio.create_task(_refuses_to_stop(released), name="stubborn")
    await asyncio.sleep(0)

    with capture_logs() as logs:
        assert await ended([stubborn], within_seconds=0.01) == [stubborn]

    assert not stubborn.done()
    [stuck] = logs
    assert stuck["task"] == "stubborn"
    assert stuck["awaiting"].startswith("_refuses_to_stop@test_tasks.py:")
    assert "> _waits_forever@test_tasks.py:" in stuck["awaiting"]
    assert awaiting(stubborn) == stuck["awaiting"]
    released.set()
    await stubborn


async def test_without_cancel_it_waits_for_tasks_ending_of_their_own() -> None:
    finished = asyncio.Event()
    task = asyncio.create_task(_waits_forever(finished))
    await asyncio.sleep(0)
    asyncio.get_running_loop().call_soon(finished.set)

    assert await ended([task], cancel=False) == []
    assert task.done()
    assert not task.cancelled()
