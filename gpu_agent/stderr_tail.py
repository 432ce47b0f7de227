"""The agent's standard error, kept in view: where a vLLM engine core says why it failed.

vLLM's engine core runs in a process of its own, which writes its failure (too little memory
for the KV cache, a kernel it cannot run) to the standard error it inherited and tells the
agent only "Engine core initialization failed. See root cause above." The agent's standard
error goes through a pipe that a thread copies on to where it went before, keeping the last
lines, so the agent can name the root cause in the one line its registry entry and `/healthz`
carry. Installed by the agent process alone (`gpu_agent.service`), never in a test runner.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import sys
import threading
from collections import deque

STDERR_FD = 2
TAIL_LINES = 200
EXIT_DRAIN_SECONDS = 1.0
EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception)): (.+)$")
"""A traceback's last line, as Python prints it: `ValueError: No available memory …`."""

_installed: StderrTail | None = None


class StderrTail:
    """The last lines written to this process's standard error, its children's included."""

    def __init__(self) -> None:
        self._lines: deque[str] = deque(maxlen=TAIL_LINES)
        self._written = 0  # lines seen so far, to tell those after a mark
        self._mark = 0
        self._lock = threading.Lock()

    def copy(self, read_fd: int, onward_fd: int) -> None:
        """Copy the pipe on to `onward_fd`, keeping its lines (runs on a thread of its own)."""
        pending = b""
        while chunk := os.read(read_fd, 65536):
            view = memoryview(chunk)
            with contextlib.suppress(OSError):  # its reader gone: kept here, nothing blocks
                while view:
                    view = view[os.write(onward_fd, view) :]
            *complete, pending = (pending + chunk).split(b"\n")
            with self._lock:
                for line in complete:
                    self._lines.append(line.decode("utf-8", "replace").rstrip("\r"))
                    self._written += 1

    def mark(self) -> None:
        """From now on: `last_error` looks only at lines written after this."""
        with self._lock:
            self._mark = self._written

    def last_error(self) -> str | None:
        """The last exception line written since the mark (`ValueError: …`), if any."""
        with self._lock:
            fresh = list(self._lines)[max(0, len(self._lines) - (self._written - self._mark)) :]
        return next((line for line in reversed(fresh) if EXCEPTION_LINE.match(line)), None)


def install() -> StderrTail:
    """Send this process's standard error (fd 2, which children inherit) through a tail."""
    global _installed  # one per process, as fd 2 is
    if _installed is None:
        tail = StderrTail()
        read_fd, write_fd = os.pipe()
        onward_fd = os.dup(STDERR_FD)
        os.dup2(write_fd, STDERR_FD)
        os.close(write_fd)
        copier = threading.Thread(
            target=tail.copy, args=(read_fd, onward_fd), name="stderr-tail", daemon=True
        )
        copier.start()
        atexit.register(_flush, copier, onward_fd)
        _installed = tail
    return _installed


def _flush(copier: threading.Thread, onward_fd: int) -> None:
    """At exit: what is still in the pipe (the last line, often) reaches the real stderr."""
    sys.stderr.flush()
    os.dup2(onward_fd, STDERR_FD)  # this process's end of the pipe closed: the copier drains it
    copier.join(EXIT_DRAIN_SECONDS)  # until EOF, or a child still holding the pipe


def installed() -> StderrTail | None:
    """The process's tail, where the agent process installed one."""
    return _installed
