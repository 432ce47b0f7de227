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
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from aiohttp import web

from spotgate.logging import get_logger

log = get_logger(__name__)


def free_port() -> int:
    """A free loopback TCP port (for local stacks, tests and benchmarks)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@asynccontextmanager
async def serving_on_loopback(app: web.Application, port: int | None = None) -> AsyncIterator[str]:
    """Serve `app` on a loopback port (a free one unless given) and yield its base URL."""
    runner = web.AppRunner(app)
    await runner.setup()
    port = port or free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


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
    args: list[str]
    env: dict[str, str] = field(repr=False)  # may hold secrets (a signing key)

    @property
    def running(self) -> bool:
        """Whether it has not exited yet."""
        return self.process.poll() is None


def _kill_group(child: Child) -> None:
    """SIGKILL every process left in the child's process group (its own session)."""
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(child.process.pid, signal.SIGKILL)


class ChildProcesses:
    """Python modules run as child processes, each logging to its own file.

    Children get a session of their own, so a Ctrl-C reaches only the parent, which then
    stops them in the order it chooses (agents drain before the gateway goes). A child's
    process group goes with it: whatever it started and left behind (an agent killed with
    SIGKILL leaves vLLM's engine processes running) is killed once the child is gone, as
    when a machine disappears.
    """

    def __init__(self, log_dir: Path) -> None:
        self._log_dir = log_dir
        self._log_dir.mkdir(parents=True, exist_ok=True)
        self.children: list[Child] = []

    def start(self, name: str, args: list[str], env: dict[str, str]) -> Child:
        """Run `python -m ARGS` with `env` added to this process's environment."""
        return self._spawn(name, args, env, log_mode="wb")

    async def restart(self, child: Child, timeout_seconds: float) -> Child:
        """Stop one child as `stop` does, then run it again as it was; its log goes on."""
        await self.stop(lambda running: running is child, timeout_seconds)
        self.children.remove(child)
        return self._spawn(child.name, child.args, child.env, log_mode="ab")

    def _spawn(
        self, name: str, args: list[str], env: dict[str, str], log_mode: Literal["wb", "ab"]
    ) -> Child:
        log = self._log_dir / f"{name}.log"
        # The child writes through its own copy of the descriptor: a long-lived parent that
        # kept each one open would leak a descriptor per child it ever ran.
        with log.open(log_mode) as handle:
            process = subprocess.Popen(  # noqa: S603 - our own interpreter and modules
                [sys.executable, "-m", *args],
                env={**os.environ, **env},
                stdout=handle,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        child = Child(name, process, log, args, env)
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
            _kill_group(child)

    def kill(self, child: Child) -> None:
        """SIGKILL one child and its process group now, as a machine that disappears would."""
        _kill_group(child)
        if child.running:
            child.process.kill()
            child.process.wait()

    def forget(self, child: Child) -> None:
        """Stop tracking a child that has exited (a long-lived parent runs many).

        What it left running in its process group is killed.
        """
        if not child.running:
            _kill_group(child)
            self.children.remove(child)

    def close(self) -> None:
        """Kill whatever still runs."""
        for child in self.children:
            self.kill(child)
