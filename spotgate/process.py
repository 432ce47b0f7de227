"""How the long-lived services run as processes, and how a parent runs them as children."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from spotgate.logging import get_logger

log = get_logger(__name__)


def free_port() -> int:
    """A free loopback TCP port (for local stacks, tests and benchmarks)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_service(main: Coroutine[Any, Any, None]) -> None:
    """Run a service's main coroutine on uvloop where it is installed, asyncio's loop otherwise."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
    else:
        uvloop.run(main)


def freeze_long_lived_objects() -> None:
    """Move everything alive now out of the garbage collector's reach; call once started.

    A service's start leaves ~100k long-lived objects (botocore's service models, pydantic
    schemas, vLLM's modules); every full collection walked them all, a pause of ~50 ms on
    the event loop that landed on whichever streams were starting. Frozen, they are never
    scanned again, and collections only see what serving allocates.
    """
    gc.freeze()
    log.info("startup objects frozen", frozen=gc.get_freeze_count())


class ChildExited(RuntimeError):
    """A child process that should be running has exited; the message names its log."""


@dataclass
class Child:
    """One child process and the file its output goes to."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def running(self) -> bool:
        """Whether it has not exited yet."""
        return self.process.poll() is None


class ChildProcesses:
    """Python modules run as child processes, each logging to its own file.

    Children get a session of their own, so a Ctrl-C reaches only the parent, which then
    stops them in the order it chooses (agents drain before the gateway goes).
    """

    def __init__(self, log_dir: Path) -> None:
        self._log_dir = log_dir
        self._log_dir.mkdir(parents=True, exist_ok=True)
        self.children: list[Child] = []
        self._handles: list[IO[bytes]] = []

    def start(self, name: str, args: list[str], env: dict[str, str]) -> Child:
        """Run `python -m ARGS` with `env` added to this process's environment."""
        log = self._log_dir / f"{name}.log"
        handle = log.open("wb")
        self._handles.append(handle)
        process = subprocess.Popen(  # noqa: S603 - our own interpreter and modules
            [sys.executable, "-m", *args],
            env={**os.environ, **env},
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        child = Child(name, process, log)
        self.children.append(child)
        return child

    def check(self) -> None:
        """Raise `ChildExited` if any child has exited."""
        for child in self.children:
            if not child.running:
                raise ChildExited(
                    f"{child.name} exited with {child.process.returncode}; see {child.log}"
                )

    async def stop(self, chosen: Callable[[Child], bool], timeout_seconds: float) -> None:
        """SIGTERM the chosen children, wait for them together, SIGKILL whoever outlasts it."""
        stopping = [child for child in self.children if chosen(child)]
        for child in stopping:
            if child.running:
                child.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_seconds
        for child in stopping:
            try:
                remaining = max(0.0, deadline - time.monotonic())
                await asyncio.to_thread(child.process.wait, remaining)
            except subprocess.TimeoutExpired:
                child.process.kill()
                await asyncio.to_thread(child.process.wait)

    def kill(self, child: Child) -> None:
        """SIGKILL one child now, as a machine that disappears would."""
        if child.running:
            child.process.kill()
            child.process.wait()

    def close(self) -> None:
        """Kill whatever still runs and close the log files."""
        for child in self.children:
            self.kill(child)
        for handle in self._handles:
            handle.close()
