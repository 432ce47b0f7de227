"""Debian's `redis-server` on loopback: the limit store of `spotgate up`, the tests and benchmarks.

Nothing is persisted (no RDB, no AOF). In cluster mode it is a one-node cluster holding every
slot, which speaks the protocol of a cluster-mode endpoint such as ElastiCache Serverless.
"""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import redis
from pydantic import SecretStr

from spotgate.process import die_with_parent, free_port, process_exited
from spotgate.settings import LimitStoreSettings

REDIS_SERVER = "redis-server"
"""Debian's package `redis-server` (the Makefile installs it)."""
START_TIMEOUT_SECONDS = 20.0
STOP_TIMEOUT_SECONDS = 10.0
CLUSTER_SLOTS = 16384
LOCAL_TIMEOUT_SECONDS = 2.0


class RedisServer:
    """A `redis-server` process on a loopback port, started and stopped on request.

    It is a `stack.supervision.Restartable`: a stack's supervisor starts it again, empty, on
    its port when it exits, as it does the stack's children.
    """

    name = "the limit store (redis-server)"

    def __init__(self, *, port: int = 0, cluster: bool = False, log: Path | None = None) -> None:
        self._port = port
        self._cluster = cluster
        self._log = log
        self._directory: tempfile.TemporaryDirectory[str] | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self) -> str:
        """Start serving (again on the same port after `stop`); return its `redis://` URL."""
        executable = shutil.which(REDIS_SERVER)
        if executable is None:
            raise RuntimeError(f"{REDIS_SERVER} is not installed (apt-get install redis-server)")
        self._port = self._port or free_port()
        self._directory = tempfile.TemporaryDirectory(prefix="spotgate-redis-")
        args = [
            executable,
            *("--bind", "127.0.0.1", "--port", str(self._port)),
            *("--save", "", "--appendonly", "no", "--dir", self._directory.name),
        ]
        if self._cluster:
            args += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
            # Its bus port defaults to port + 10000, past 65535 for a high free port.
            args += ["--cluster-port", str(free_port())]
        output = self._log.open("ab") if self._log is not None else subprocess.DEVNULL
        try:
            self._process = subprocess.Popen(  # noqa: S603 - a fixed program, our arguments
                args,
                stdout=output,
                stderr=subprocess.STDOUT,
                # It goes with the process that started it, however that one ends.
                preexec_fn=functools.partial(die_with_parent, os.getpid(), signal.SIGKILL),
            )
        finally:
            if self._log is not None and not isinstance(output, int):
                output.close()
        self.url = f"redis://127.0.0.1:{self._port}/0"
        self._wait_ready()
        return self.url

    def _client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self._port, socket_timeout=1.0)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        with self._client() as client:
            while True:
                if self._process is not None and self._process.poll() is not None:
                    raise RuntimeError(f"{REDIS_SERVER} exited with {self._process.returncode}")
                try:
                    client.ping()
                    if not self._cluster:
                        return
                    info = client.execute_command("CLUSTER INFO")
                    if info.get("cluster_state") == "ok":
                        return
                    if info.get("cluster_slots_assigned") == "0":
                        client.execute_command("CLUSTER ADDSLOTSRANGE", 0, CLUSTER_SLOTS - 1)
                except redis.RedisError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{REDIS_SERVER} did not answer on port {self._port}")
                time.sleep(0.05)  # a process starting up: polled, nothing to wait on

    async def exited(self) -> int:
        """Wait until the server exits (woken by the kernel); its exit status."""
        if self._process is None:
            raise RuntimeError(f"{REDIS_SERVER} was not started")
        return await process_exited(self._process)

    @property
    def log(self) -> Path | None:
        """The file its output goes to, if it was given one."""
        return self._log

    def log_tail(self, max_lines: int) -> str:
        """The last lines of its log ("" without one)."""
        try:
            lines = self._log.read_text(errors="replace").splitlines() if self._log else []
        except OSError:
            return ""
        return "\n".join(lines[-max_lines:])

    async def restart(self) -> None:
        """Start it again, empty, on its port (RuntimeError: it could not be)."""
        self.stop()
        await asyncio.to_thread(self.start)

    def flush(self) -> None:
        """Forget every key (what an earlier test left)."""
        with self._client() as client:
            client.flushall()

    def pause(self) -> None:
        """Stop the process (SIGSTOP): connections hang, as to a store that stopped answering."""
        if self._process is not None:
            self._process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Let a paused process go on (SIGCONT)."""
        if self._process is not None:
            self._process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        """Stop the process; its keys are gone (nothing is persisted)."""
        if self._process is not None:
            self.resume()
            self._process.terminate()
            try:
                self._process.wait(STOP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None
        if self._directory is not None:
            self._directory.cleanup()
            self._directory = None

    def settings(self, **overrides: object) -> LimitStoreSettings:
        """Limit store settings that reach this server.

        A call may take up to `LOCAL_TIMEOUT_SECONDS`: on one machine that also runs the
        agents and the tests, a busy moment is no outage.
        """
        fields: dict[str, object] = {
            "url": SecretStr(self.url),
            "cluster": self._cluster,
            "timeout_seconds": LOCAL_TIMEOUT_SECONDS,
        }
        return LimitStoreSettings.model_validate({**fields, **overrides})
