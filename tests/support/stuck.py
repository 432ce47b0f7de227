"""Where a test that runs into its timeout waits, told at the end of the run.

pytest-timeout prints the other threads' stacks amid the test's report, far above the end of
a long run's output; a test stuck on an await shows there only an event loop waiting. Shortly
before the timeout a watchdog notes the main thread's innermost frames and every pending
task of each running loop with its chain of awaits; the summary at the end of the run (the
part a CI log keeps) shows them for each test that failed or erred.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import sys
import threading
import traceback

import pytest

from spotgate.tasks import awaiting

NOTED_BEFORE_TIMEOUT_SECONDS = 20.0
MAIN_THREAD_FRAMES = 6
TASKS_SHOWN = 20

WAITS = pytest.StashKey[list[str]]()
"""What the watchdog noted for a test that ran this close to its timeout."""


def _running_loops() -> list[asyncio.AbstractEventLoop]:
    loops = []
    for candidate in gc.get_objects():
        with contextlib.suppress(Exception):  # gc also holds dead weak proxies
            if isinstance(candidate, asyncio.AbstractEventLoop) and candidate.is_running():
                loops.append(candidate)
    return loops


def _waits(main_thread_id: int) -> list[str]:
    """The main thread's innermost frames and each running loop's pending tasks."""
    lines = []
    frame = sys._current_frames().get(main_thread_id)
    if frame is not None:
        stack = traceback.extract_stack(frame)[-MAIN_THREAD_FRAMES:]
        lines.append("main thread: " + " > ".join(f"{f.name}:{f.lineno}" for f in stack))
    for loop in _running_loops():
        with contextlib.suppress(RuntimeError):  # the loop's thread changed its task set
            tasks = [task for task in asyncio.all_tasks(loop) if not task.done()]
            lines.append(f"{len(tasks)} pending tasks:")
            lines += [f"  {task.get_name()}: {awaiting(task)}" for task in tasks[:TASKS_SHOWN]]
    return lines


def watch(item: pytest.Item) -> threading.Timer | None:
    """Note where `item` waits if it is still running just before its timeout."""
    timeout = float(item.config.getini("timeout") or 0)
    marker = item.get_closest_marker("timeout")
    if marker is not None and marker.args:
        timeout = float(marker.args[0])
    if timeout <= NOTED_BEFORE_TIMEOUT_SECONDS:
        return None
    main_thread_id = threading.get_ident()

    def note() -> None:
        item.stash[WAITS] = _waits(main_thread_id)

    timer = threading.Timer(timeout - NOTED_BEFORE_TIMEOUT_SECONDS, note)
    timer.daemon = True
    timer.start()
    return timer


def add_waits(item: pytest.Item, report: pytest.TestReport) -> None:
    """Carry what the watchdog noted in a failed report (xdist sends sections along)."""
    waits = item.stash.get(WAITS, None)
    if waits and report.failed:
        report.sections.append(("stuck", "\n".join(waits)))


def summary(terminal: pytest.TerminalReporter) -> None:
    """Show, at the end of the run, where each test that ran into its timeout waited."""
    reports = terminal.stats.get("error", []) + terminal.stats.get("failed", [])
    stuck = [(r.nodeid, text) for r in reports for name, text in r.sections if name == "stuck"]
    if not stuck:
        return
    terminal.write_sep("=", "where tests that ran into their timeout waited")
    for nodeid, text in stuck:
        terminal.write_line(f"{nodeid}:")
        terminal.write_line(text)
