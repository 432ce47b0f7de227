"""A stack's processes kept running, as ECS keeps a service's tasks: restarted when they exit.

The decision is a pure function of a process's runs (`restart_decision`): restart after a
backoff that doubles while it keeps exiting soon after its start and starts over once it has
run a while, or give up when it has exited too often in a window. `Supervisor` carries it
out for every restartable process of a stack alike, its children and its limit store: it
waits on each one's exit, restarts it (a child on the sockets it was handed, a gateway on its
port again; the store empty on its port), and returns the one it gave up on, for its parent
to stop everything.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from spotgate.logging import get_logger
from spotgate.process import Child, ChildProcesses

log = get_logger(__name__)

FIRST_BACKOFF_SECONDS = 1.0
MAX_BACKOFF_SECONDS = 30.0
HEALTHY_AFTER_SECONDS = 60.0
MAX_FAILURES = 5
FAILURE_WINDOW_SECONDS = 300.0
LOG_TAIL_LINES = 20


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """When a child that exited is started again, and when its parent gives up on it."""

    first_backoff_seconds: float = FIRST_BACKOFF_SECONDS
    max_backoff_seconds: float = MAX_BACKOFF_SECONDS
    # A run this long was healthy: the next exit waits `first_backoff_seconds` again.
    healthy_after_seconds: float = HEALTHY_AFTER_SECONDS
    # This many exits within the window (the last included): the child keeps failing.
    max_failures: int = MAX_FAILURES
    failure_window_seconds: float = FAILURE_WINDOW_SECONDS


@dataclass(frozen=True, slots=True)
class Run:
    """One run of a child: when it started and exited (the supervisor's clock), and how."""

    started_at: float
    exited_at: float
    returncode: int


@dataclass(frozen=True, slots=True)
class Restart:
    """Start the child again in `after_seconds`."""

    after_seconds: float


@dataclass(frozen=True, slots=True)
class GiveUp:
    """The child keeps failing: stop everything; `reason` says how."""

    reason: str


def describe_exit(returncode: int) -> str:
    """`exit 3`, or `SIGKILL` for a child a signal ended."""
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit {returncode}"


def restart_decision(runs: Sequence[Run], policy: RestartPolicy) -> Restart | GiveUp:
    """What to do about a child whose runs (oldest first, the last just ended) are `runs`."""
    last = runs[-1]
    window_start = last.exited_at - policy.failure_window_seconds
    recent = sum(1 for run in runs if run.exited_at >= window_start)
    if recent >= policy.max_failures:
        return GiveUp(
            f"exited {recent} times in {policy.failure_window_seconds:.0f} s, "
            f"the last with {describe_exit(last.returncode)}"
        )
    short_runs = 0
    for run in reversed(runs):
        if run.exited_at - run.started_at >= policy.healthy_after_seconds:
            break
        short_runs += 1
    backoff = policy.first_backoff_seconds * 2 ** max(0, short_runs - 1)
    return Restart(min(policy.max_backoff_seconds, backoff))


class Restartable(Protocol):
    """A process a supervisor keeps running: a child, or the limit store."""

    @property
    def name(self) -> str:
        """What it is called in logs and in what its parent tells the user."""
        ...

    @property
    def log(self) -> Path | None:
        """The file its output goes to, if any."""
        ...

    async def exited(self) -> int:
        """Wait until it has exited; its exit status."""
        ...

    async def restart(self) -> None:
        """Start it again as it was; OSError or RuntimeError when it cannot come back."""
        ...

    def log_tail(self, max_lines: int) -> str:
        """The last lines it wrote."""
        ...


class SupervisedChild:
    """A child of `processes` as a supervisor restarts it: on the sockets it was handed."""

    def __init__(
        self, processes: ChildProcesses, child: Child, stop_timeout_seconds: float
    ) -> None:
        self._processes = processes
        self.child = child  # the process now: a restart replaces it
        self._stop_timeout_seconds = stop_timeout_seconds

    @property
    def name(self) -> str:
        """The child's name."""
        return self.child.name

    @property
    def log(self) -> Path:
        """The child's log, which goes on over its runs."""
        return self.child.log

    async def exited(self) -> int:
        """Wait until the current process has exited; its exit status."""
        return await self.child.exited()

    async def restart(self) -> None:
        """Run it again as it was first run (arguments, settings, handed-down sockets)."""
        self.child = await self._processes.restart(self.child, self._stop_timeout_seconds)

    def log_tail(self, max_lines: int) -> str:
        """The last lines of its log."""
        return self.child.log_tail(max_lines)


@dataclass(frozen=True, slots=True)
class GaveUp:
    """The process a supervisor gave up on, why, and the end of its log."""

    child: Restartable
    reason: str
    log_tail: str

    def message(self) -> str:
        """One line for whoever ran the stack: which process, why, and where its log is."""
        return f"{self.child.name} {self.reason}; see {self.child.log}"


class Supervisor:
    """Restarts the children of `processes` that `supervised` picks, and `others`, on exit.

    A child is restarted as it was first run (arguments, settings, handed-down sockets);
    `run` returns when one keeps failing. Cancel `run` before stopping the children on
    purpose, or they come back.
    """

    def __init__(
        self,
        processes: ChildProcesses,
        supervised: Callable[[Child], bool],
        *,
        others: Sequence[Restartable] = (),
        policy: RestartPolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
        stop_timeout_seconds: float = 30.0,
    ) -> None:
        self._processes = processes
        self._supervised = supervised
        self._others = tuple(others)
        self._policy = policy or RestartPolicy()
        self._clock = clock
        self._stop_timeout_seconds = stop_timeout_seconds
        self.restarted: dict[str, int] = {}  # process name → times restarted
        self.restarts = asyncio.Condition()  # notified after each restart

    async def run(self) -> GaveUp:
        """Keep the supervised processes running until one keeps failing; return it."""
        children: list[Restartable] = [
            SupervisedChild(self._processes, child, self._stop_timeout_seconds)
            for child in self._processes.children
            if self._supervised(child)
        ]
        watched = [*children, *self._others]
        watchers = [asyncio.create_task(self._keep_running(each)) for each in watched]
        try:
            done, _ = await asyncio.wait(watchers, return_when=asyncio.FIRST_COMPLETED)
            return done.pop().result()
        finally:
            for watcher in watchers:
                watcher.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)

    async def _keep_running(self, child: Restartable) -> GaveUp:
        runs: list[Run] = []
        while True:
            started_at = self._clock()
            returncode = await child.exited()
            runs.append(Run(started_at, self._clock(), returncode))
            decision = restart_decision(runs, self._policy)
            if isinstance(decision, GiveUp):
                return self._give_up(child, decision.reason)
            log.warning(
                "child exited; restarting it",
                child=child.name,
                exit=describe_exit(returncode),
                in_seconds=decision.after_seconds,
                log=str(child.log),
            )
            await asyncio.sleep(decision.after_seconds)
            try:
                await child.restart()
            except (OSError, RuntimeError) as err:  # its port taken meanwhile, say
                return self._give_up(child, f"could not be started again ({err})")
            self.restarted[child.name] = self.restarted.get(child.name, 0) + 1
            async with self.restarts:
                self.restarts.notify_all()

    def _give_up(self, child: Restartable, reason: str) -> GaveUp:
        tail = child.log_tail(LOG_TAIL_LINES)
        log.error(
            "child keeps failing; stopping the stack",
            child=child.name,
            reason=reason,
            log=str(child.log),
            log_tail=tail,
        )
        return GaveUp(child, reason, tail)
