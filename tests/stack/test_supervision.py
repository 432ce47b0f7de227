from __future__ import annotations

import platform
import signal
import socket
from pathlib import Path

import pytest

from spotgate.process import ChildProcesses, loopback_socket
from stack.supervision import (
    GiveUp,
    Restart,
    RestartPolicy,
    Run,
    Supervisor,
    restart_decision,
)

POLICY = RestartPolicy(
    first_backoff_seconds=1.0,
    max_backoff_seconds=30.0,
    healthy_after_seconds=60.0,
    max_failures=5,
    failure_window_seconds=300.0,
)


def runs(*spans: tuple[float, float], returncode: int = 1) -> list[Run]:
    """Runs from (started, exited) pairs."""
    return [Run(started, exited, returncode) for started, exited in spans]


@pytest.mark.parametrize(
    ("history", "decision"),
    [
        # a healthy run that ends: restarted after the first backoff
        (runs((0, 3600)), Restart(1.0)),
        # one that exits at once: the same, then doubling while it keeps exiting soon after
        (runs((0, 1)), Restart(1.0)),
        (runs((0, 1), (2, 3)), Restart(2.0)),
        (runs((0, 1), (2, 3), (5, 6)), Restart(4.0)),
        (runs((0, 1), (2, 3), (5, 6), (10, 11)), Restart(8.0)),
        # capped at the maximum (exits spread wider than the window count once each)
        (runs(*((n * 400.0, n * 400.0 + 1) for n in range(7))), Restart(30.0)),
        # a run longer than `healthy_after_seconds` starts the backoff over
        (runs((0, 1), (2, 3), (5, 6), (10, 100)), Restart(1.0)),
        (runs((0, 1), (2, 3), (5, 100), (101, 102)), Restart(1.0)),
        (runs((0, 1), (5, 100), (101, 102), (103, 104)), Restart(2.0)),
        # the fifth exit within 300 s: it keeps failing
        (
            runs((0, 1), (2, 3), (5, 6), (10, 11), (19, 20)),
            GiveUp("exited 5 times in 300 s, the last with exit 1"),
        ),
        # five exits, but the first fell out of the window: the fifth short run in a row
        (runs((0, 1), (200, 201), (203, 204), (207, 208), (315, 316)), Restart(16.0)),
        # how it ended is said: a signal by name
        (
            runs(*((n, n + 0.5) for n in range(5)), returncode=-signal.SIGKILL),
            GiveUp("exited 5 times in 300 s, the last with SIGKILL"),
        ),
    ],
)
def test_restart_decision(history: list[Run], decision: Restart | GiveUp) -> None:
    assert restart_decision(history, POLICY) == decision


async def test_a_child_that_keeps_exiting_is_restarted_then_given_up_with_its_log_tail(
    tmp_path: Path,
) -> None:
    processes = ChildProcesses(tmp_path)
    steady = processes.start("steady", ["http.server", "--bind", "127.0.0.1", "0"], {})
    processes.start("flaky", ["platform"], {})  # prints a line and exits 0
    clock_readings: list[float] = []

    def clock() -> float:
        clock_readings.append(float(len(clock_readings)))
        return clock_readings[-1]

    policy = RestartPolicy(first_backoff_seconds=0.01, max_failures=3, failure_window_seconds=60)
    supervisor = Supervisor(
        processes, lambda child: child.name == "flaky", policy=policy, clock=clock
    )
    try:
        gave_up = await supervisor.run()
    finally:
        processes.close()
    assert gave_up.child.name == "flaky"
    assert gave_up.reason == "exited 3 times in 60 s, the last with exit 0"
    assert supervisor.restarted == {"flaky": 2}
    # the log goes on over its runs: the tail holds every one
    assert gave_up.log_tail.splitlines() == [platform.platform()] * 3
    assert gave_up.message().endswith(f"; see {tmp_path / 'flaky.log'}")
    assert steady.process.returncode == -signal.SIGKILL  # only closing stopped it


async def test_a_child_whose_port_was_taken_meanwhile_is_given_up_on(tmp_path: Path) -> None:
    processes = ChildProcesses(tmp_path)
    sock = loopback_socket()
    processes.start("gateway", ["platform"], {}, (sock,))  # exits at once
    sock.shutdown(socket.SHUT_RD)  # as a gateway's drain leaves it: to be bound afresh
    with socket.socket() as thief:
        thief.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        thief.bind(sock.getsockname())
        thief.listen()
        policy = RestartPolicy(first_backoff_seconds=0.01)
        try:
            gave_up = await Supervisor(processes, lambda _child: True, policy=policy).run()
        finally:
            processes.close()
            sock.close()
    assert gave_up.child.name == "gateway"
    assert gave_up.reason.startswith("could not be started again ("), gave_up.reason
