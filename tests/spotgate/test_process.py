"""Child processes: a restart runs the same thing again, no descriptor outlives a start, and
nothing a child started outlives it."""

from __future__ import annotations

import asyncio
import gc
import json
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from spotgate.process import (
    GC_YOUNG_OBJECTS,
    ChildProcesses,
    listen_again,
    loopback_socket,
    settle_garbage_collector,
)

ZEN_FIRST_LINE = "The Zen of Python, by Tim Peters"


async def test_restart_runs_the_child_again_with_its_log_going_on(tmp_path: Path) -> None:
    processes = ChildProcesses(tmp_path)
    first = processes.start("zen", ["this"], {"SPOTGATE_TEST": "1"})
    first.process.wait()
    second = await processes.restart(first, timeout_seconds=10)
    second.process.wait()

    assert (second.name, second.args, second.env) == ("zen", ["this"], {"SPOTGATE_TEST": "1"})
    assert processes.children == [second]
    assert second.log.read_text().count(ZEN_FIRST_LINE) == 2
    processes.close()


async def test_the_parent_keeps_no_descriptor_or_entry_per_child(tmp_path: Path) -> None:
    processes = ChildProcesses(tmp_path)
    for number in range(5):
        child = processes.start(f"zen-{number}", ["this"], {})
        assert child.log.parent == tmp_path
        child.process.wait()
        processes.forget(child)

    # Only this test's descriptors count: other tests' servers in this process open and close
    # theirs meanwhile.
    held = [f.path for f in psutil.Process().open_files() if Path(f.path).is_relative_to(tmp_path)]
    assert held == []
    assert processes.children == []


def leaves_a_grandchild(then: str) -> list[str]:
    """`python -m` arguments: start a sleeping grandchild, print its pid, then run `then`."""
    spawn = (
        "import subprocess, sys; "
        "grandchild = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
        "print(grandchild.pid, flush=True)"
    )
    return ["timeit", "-n", "1", "-r", "1", "-s", spawn, then]


async def grandchild_of(log: Path) -> psutil.Process:
    """The grandchild whose pid the child printed first."""
    while not (text := log.read_text()).strip():  # noqa: ASYNC110, ASYNC240 - tiny, local
        await asyncio.sleep(0.05)
    return psutil.Process(int(text.split()[0]))


@pytest.mark.parametrize(
    ("then", "end"),
    [("pass", "forget"), ("import time; time.sleep(600)", "kill"), ("pass", "close")],
)
async def test_what_a_child_started_dies_with_it(tmp_path: Path, then: str, end: str) -> None:
    processes = ChildProcesses(tmp_path)
    child = processes.start("parent", leaves_a_grandchild(then), {})
    grandchild = await grandchild_of(child.log)
    if end == "forget":
        child.process.wait()  # exited on its own, like an agent killed with SIGKILL
        assert grandchild.is_running()
        processes.forget(child)
    elif end == "kill":
        processes.kill(child)
    else:
        processes.close()

    gone, _ = psutil.wait_procs([grandchild], timeout=10)
    assert gone == [grandchild]


@pytest.mark.parametrize("shut", [True, False])
def test_a_socket_a_drained_child_shut_listens_again_on_its_port_and_descriptor(
    shut: bool,
) -> None:
    sock = loopback_socket()
    address, descriptor = sock.getsockname(), sock.fileno()
    if shut:  # what a gateway does at its drain's start
        sock.shutdown(socket.SHUT_RD)
    listen_again(sock)
    assert (sock.getsockname(), sock.fileno()) == (address, descriptor)
    assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
    with socket.create_connection(address, timeout=5):
        pass
    sock.close()


async def test_a_child_and_its_process_group_die_with_a_parent_killed_with_sigkill(
    tmp_path: Path,
) -> None:
    # The child, a service (`service_main` takes its group along), starts a grandchild in its
    # process group, as an agent starts vLLM's engine processes.
    service = "from spotgate.process import take_process_group_along_with_parent as take; take()"
    child_args = leaves_a_grandchild("import time; time.sleep(600)")
    child_args[child_args.index("-s") + 1] = f"{service}; {child_args[child_args.index('-s') + 1]}"
    parent_script = (
        "import json, sys, time; from pathlib import Path; "
        "from spotgate.process import ChildProcesses; "
        "child = ChildProcesses(Path(sys.argv[1])).start('child', json.loads(sys.argv[2]), {}); "
        "print(child.process.pid, flush=True); time.sleep(600)"
    )
    parent = subprocess.Popen(  # noqa: ASYNC220 - started, then only read
        [sys.executable, "-c", parent_script, str(tmp_path), json.dumps(child_args)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdout is not None
    child = psutil.Process(int(parent.stdout.readline()))
    grandchild = await grandchild_of(tmp_path / "child.log")

    parent.kill()
    parent.wait()
    parent.stdout.close()
    gone, _ = psutil.wait_procs([child, grandchild], timeout=10)
    assert set(gone) == {child, grandchild}


def test_a_started_service_freezes_what_it_holds_and_collects_its_young_objects_seldom() -> None:
    threshold = gc.get_threshold()
    try:
        settle_garbage_collector()
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (GC_YOUNG_OBJECTS, *threshold[1:])
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)
