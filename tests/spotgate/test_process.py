"""Child processes: a restart runs the same thing again, and no descriptor outlives a start."""

from __future__ import annotations

from pathlib import Path

import psutil

from spotgate.process import ChildProcesses

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
    before = psutil.Process().num_fds()
    for number in range(5):
        child = processes.start(f"zen-{number}", ["this"], {})
        child.process.wait()
        processes.forget(child)

    assert psutil.Process().num_fds() == before
    assert processes.children == []
