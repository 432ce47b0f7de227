"""The agent names the root cause its engine core's process wrote to the stderr it inherited."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from gpu_agent.stderr_tail import StderrTail

AGENT = textwrap.dedent(
    """
    import subprocess, sys
    from gpu_agent import stderr_tail

    tail = stderr_tail.install()
    subprocess.run([sys.executable, "-c", "raise KeyError('before the mark')"])
    tail.mark()
    core = "raise ValueError('No available memory for the cache blocks.')"
    subprocess.run([sys.executable, "-c", core])  # a child: its traceback on our fd 2
    print(tail.last_error(), flush=True)
    print("spotgate agent: the engine could not start", file=sys.stderr)  # its last words
    """
)


def test_a_childs_last_exception_line_is_kept_and_stderr_still_reaches_its_reader() -> None:
    agent = subprocess.run(
        [sys.executable, "-c", AGENT], capture_output=True, text=True, timeout=60, check=True
    )

    assert agent.stdout == "ValueError: No available memory for the cache blocks.\n"
    lines = agent.stderr.splitlines()
    assert "Traceback (most recent call last):" in lines  # copied on, as written
    assert lines[-1] == "spotgate agent: the engine could not start"  # drained at exit


def test_only_lines_after_the_mark_count() -> None:
    tail = StderrTail()
    read_fd, write_fd = os.pipe()
    os.write(write_fd, b"KeyError: old\nsome line\n")
    os.close(write_fd)
    onward = os.open(os.devnull, os.O_WRONLY)
    try:
        tail.copy(read_fd, onward)  # to the pipe's end
    finally:
        os.close(read_fd)
        os.close(onward)
    assert tail.last_error() == "KeyError: old"
    tail.mark()
    assert tail.last_error() is None
