"""Ending a service's tasks when it stops: within a bound, and saying where a stuck one waits.

A stop that awaits a task which never ends (one that swallows its cancellation, or waits on a
peer that stopped reading) hangs the whole service, and says nothing. Here every wait is
bounded; a task still running at the bound is logged with the chain of awaits it sits in,
then left behind, and the stop goes on.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable
from typing import Any

from spotgate.logging import get_logger

TASK_STOP_SECONDS = 10.0
"""How long a stop waits for its tasks to end once told to (cancelled, or ended otherwise)."""

log = get_logger(__name__)


def awaiting(task: asyncio.Task[Any]) -> str:
    """Where a task waits: its coroutines' functions, files and lines, outermost first."""
    places: list[str] = []
    awaited: Any = task.get_coro()
    while awaited is not None and len(places) < 32:
        frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "ag_frame", None)
        if frame is not None:
            code = frame.f_code
            places.append(f"{code.co_name}@{os.path.basename(code.co_filename)}:{frame.f_lineno}")
        awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "ag_await", None)
    return " > ".join(places) or repr(task.get_coro())


async def ended(
    tasks: Iterable[asyncio.Task[Any]],
    *,
    cancel: bool = True,
    within_seconds: float = TASK_STOP_SECONDS,
) -> list[asyncio.Task[Any]]:
    """Cancel `tasks` (unless `cancel`) and wait for them; return any still running after.

    Each still running after `within_seconds` is logged with where it waits. A task that
    failed is logged, not raised: one task's fault must not stop the rest of a shutdown.
    """
    running = [task for task in tasks if not task.done()]
    if cancel:
        for task in running:
            task.cancel()
    if running:
        await asyncio.wait(running, timeout=within_seconds)
    stuck = [task for task in running if not task.done()]
    for task in running:
        if task.done() and not task.cancelled() and task.exception() is not None:
            log.warning("task failed as it stopped", task=task.get_name(), error=task.exception())
    for task in stuck:
        log.error("task did not stop; left behind", task=task.get_name(), awaiting=awaiting(task))
    return stuck
