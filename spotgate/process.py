"""How the long-lived services run as processes, and how a parent runs them as children."""

from __future__ import annotations

import asyncio
import ctypes
import functools
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
from typing import Any, Literal, TypeVar

from aiohttp import web
from pydantic import ValidationError

from spotgate.logging import configure_logging, get_logger
from spotgate.settings import (
    AgentSettings,
    GatewaySettings,
    PoolSettings,
    describe_validation_error,
)

log = get_logger(__name__)


def free_port() -> int:
    """A free loopback TCP port, for a child process that binds it itself.

    Between this call and the child's bind another process may take it; a server in this
    process binds port 0 instead (`loopback_socket`).
    """
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


LISTEN_BACKLOG = 128
"""Connections a socket holds before its server accepts them (asyncio's default too)."""


def loopback_socket(port: int = 0) -> socket.socket:
    """A listening TCP socket on loopback, on `port` (0: one the kernel picks, ours to keep).

    Its port is known (`socket_port`) before the server on it starts, for the URLs a
    server's settings name (a gateway's public URL, an agent's advertised one). It listens
    at once, so a client that connects before the server runs waits in the backlog instead
    of being refused (an agent asking its IMDS emulator for its identity, say).
    """
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        sock.close()
        raise
    sock.listen(LISTEN_BACKLOG)
    return sock


def socket_port(sock: socket.socket) -> int:
    """The port a bound socket holds."""
    return int(sock.getsockname()[1])


class HandedDownSite(web.SockSite):
    """A site on a listening socket the service's parent bound and handed down."""

    def __init__(self, runner: web.AppRunner, sock: socket.socket) -> None:
        super().__init__(runner, sock)
        self.listening_socket = sock

    def refuse_new_connections(self) -> None:
        """New connections are refused from now on, though the parent holds the socket too.

        Closing this process's copy is not enough: the parent's keeps the port listening, and
        connections would wait in its backlog for an answer that never comes. A listening
        socket shut down for reading stops listening for every process that holds it; a
        parent that starts the service again binds the port afresh.
        """
        with suppress(OSError):
            self.listening_socket.shutdown(socket.SHUT_RD)


def listening_site(
    runner: web.AppRunner, host: str, port: int, listen_fd: int | None
) -> web.BaseSite:
    """Where a service serves: a socket its parent bound and handed down, else `host:port`."""
    if listen_fd is not None:
        return HandedDownSite(runner, socket.socket(fileno=listen_fd))
    return web.TCPSite(runner, host, port)


async def stop_listening(site: web.BaseSite) -> None:
    """Take no new connections, refusing them at once; open ones are still served."""
    if isinstance(site, HandedDownSite):
        site.refuse_new_connections()
    await site.stop()


@asynccontextmanager
async def serving_on_loopback(
    app: web.Application, sock: socket.socket | None = None
) -> AsyncIterator[str]:
    """Serve `app` on a loopback socket (a fresh one on port 0 unless given); yield its URL."""
    sock = sock or loopback_socket()
    runner = web.AppRunner(app)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    try:
        yield f"http://127.0.0.1:{socket_port(sock)}"
    finally:
        await runner.cleanup()
        sock.close()


def run_service(main: Coroutine[Any, Any, None]) -> None:
    """Run a service's main coroutine on uvloop where it is installed, asyncio's loop otherwise."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
    else:
        uvloop.run(main)


EXIT_BAD_INPUT = 2
"""A service or command that cannot start with what it was given exits with this status."""

ServiceSettings = TypeVar("ServiceSettings", GatewaySettings, AgentSettings, PoolSettings)


def service_main(
    name: str,
    read_settings: Callable[[], ServiceSettings],
    serve: Callable[[ServiceSettings], Coroutine[Any, Any, None]],
    config_errors: tuple[type[Exception], ...] = (),
) -> int:
    """Run a service from its environment; a setting it cannot run with is one line, exit 2."""
    try:
        settings = read_settings()
    except ValidationError as err:
        print(f"spotgate {name}: {describe_validation_error(err)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    configure_logging(settings.shared.log_level, settings.shared.log_format)
    take_process_group_along_with_parent()
    try:
        run_service(serve(settings))
    except config_errors as err:
        print(f"spotgate {name}: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return 0


GC_YOUNG_OBJECTS = 100_000
"""Objects allocated, and still alive, between collections of the youngest generation (Python's
own: 700). What a service allocates per token dies by reference counting; what lives is a
stream's state, so a collection's pause is about the live streams' objects. A gateway relaying
1,000 streams spent 7.5 % of its CPU in collections at 700; at 20,000, 1.3 %, but 44 young
and 10 middle collections over a run still paused it up to 31 and 39 ms, first tokens
waiting behind them; at 100,000, 2 and 3 (the longest middle one 1.4 ms). Cyclic garbage
waits longer: at most this many objects, some megabytes."""


def settle_garbage_collector() -> None:
    """Move everything alive now out of the garbage collector's reach, then collect seldom.

    Call once started. A service's start leaves ~100k long-lived objects (botocore's service
    models, pydantic schemas, vLLM's modules); every full collection walked them all, a pause
    of ~50 ms on the event loop that landed on whichever streams were starting. Frozen, they
    are never scanned again, and collections only see what serving allocates.
    """
    gc.freeze()
    gc.set_threshold(GC_YOUNG_OBJECTS, *gc.get_threshold()[1:])
    log.info("startup objects frozen", frozen=gc.get_freeze_count())


async def process_exited(process: subprocess.Popen[bytes]) -> int:
    """Wait until `process` has exited (woken by the kernel, not polled); its exit status."""
    try:
        descriptor = os.pidfd_open(process.pid)
    except ProcessLookupError:  # exited and reaped already
        return process.wait()
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    loop.add_reader(descriptor, done.set)
    try:
        if process.poll() is None:
            await done.wait()
    finally:
        loop.remove_reader(descriptor)
        os.close(descriptor)
    return process.wait()


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
    sockets: tuple[socket.socket, ...] = ()  # handed down: the child serves on them

    @property
    def running(self) -> bool:
        """Whether it has not exited yet."""
        return self.process.poll() is None

    async def exited(self) -> int:
        """Wait until it has exited (woken by the kernel, not polled); its exit status."""
        return await process_exited(self.process)

    def log_tail(self, max_lines: int = 20) -> str:
        """The last lines it wrote, to say why it exited."""
        try:
            lines = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-max_lines:])


def listen_again(sock: socket.socket) -> None:
    """Make a handed-down socket listen again on its port, if its last child shut it.

    A gateway shuts its listening socket at a drain's start, so new connections are refused
    at once though this parent holds a copy (`HandedDownSite`); a shut socket cannot listen
    again, so a fresh one takes the port and its descriptor number, which the next child's
    settings name.
    """
    if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        return
    fresh = socket.socket(sock.family, sock.type)
    try:
        fresh.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        fresh.bind(sock.getsockname())
        fresh.listen(LISTEN_BACKLOG)
        os.dup2(fresh.fileno(), sock.fileno())
    finally:
        fresh.close()


PR_SET_PDEATHSIG = 1
PR_GET_PDEATHSIG = 2
PARENT_DEATH_SIGNAL = signal.SIGUSR2
"""What a child of `ChildProcesses` is sent when its parent dies, however it died.

Its default action ends the process; a service (`service_main`) ends its whole process
group on it instead (`take_process_group_along_with_parent`), whatever it started too.
"""
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None


def die_with_parent(parent_pid: int, signum: int = PARENT_DEATH_SIGNAL) -> None:
    """In a forked child before exec: be sent `signum` when the parent dies (Linux).

    The kernel sends it when the thread that forked the child ends, so a parent starts its
    children from its main thread (an event loop's). A parent already gone before this ran
    leaves the child to init: it ends itself at once.
    """
    if _LIBC is None:
        return
    _LIBC.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), signum)


def take_process_group_along_with_parent() -> None:
    """When the parent that started this process dies, kill its process group, this included.

    Only in a child `ChildProcesses` started (its own process group, `PARENT_DEATH_SIGNAL`
    asked for): the group holds what the service started itself (vLLM's engine processes),
    which the kernel's parent-death signal would not reach.
    """
    if _LIBC is None or os.getpgrp() != os.getpid():
        return
    asked = ctypes.c_int(0)
    _LIBC.prctl(PR_GET_PDEATHSIG, ctypes.byref(asked), 0, 0, 0)
    if asked.value != PARENT_DEATH_SIGNAL:
        return
    signal.signal(PARENT_DEATH_SIGNAL, lambda _signum, _frame: os.killpg(0, signal.SIGKILL))


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
    when a machine disappears. No child outlives its parent: one that dies, even by SIGKILL,
    takes its children along (`die_with_parent`), and they their process groups.
    """

    def __init__(self, log_dir: Path) -> None:
        self._log_dir = log_dir
        self._log_dir.mkdir(parents=True, exist_ok=True)
        self.children: list[Child] = []

    def start(
        self,
        name: str,
        args: list[str],
        env: dict[str, str],
        sockets: tuple[socket.socket, ...] = (),
    ) -> Child:
        """Run `python -m ARGS` with `env` added to this process's environment.

        `sockets` are handed down under the same descriptor numbers (the child's settings name
        them): the parent bound them, to port 0, so their ports are known before the child
        starts and no other process can take them. A parent that keeps its copy open restarts
        the child on the same port (`restart` hands them down again); one that closes it
        leaves the port to the child alone.
        """
        return self._spawn(name, args, env, sockets, log_mode="wb")

    async def restart(self, child: Child, timeout_seconds: float) -> Child:
        """Stop one child as `stop` does, then run it again as it was; its log goes on."""
        await self.stop(lambda running: running is child, timeout_seconds)
        self.children.remove(child)
        return self._spawn(child.name, child.args, child.env, child.sockets, log_mode="ab")

    def _spawn(
        self,
        name: str,
        args: list[str],
        env: dict[str, str],
        sockets: tuple[socket.socket, ...],
        log_mode: Literal["wb", "ab"],
    ) -> Child:
        for sock in sockets:
            listen_again(sock)
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
                pass_fds=[sock.fileno() for sock in sockets],
                # Syscalls only between fork and exec: no lock another of our threads may hold.
                preexec_fn=functools.partial(die_with_parent, os.getpid()),
            )
        child = Child(name, process, log, args, env, sockets)
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
