"""What the side-by-side benchmarks share: server processes, one SSE client, timed runs.

Every server under test speaks OpenAI's streamed chat completions, and every one is driven
by the same aiohttp client code, so differences come from the servers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from subprocess import STDOUT, Popen

import aiohttp

STARTUP_TIMEOUT_SECONDS = 300.0
CLOCK_TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    """A free loopback port."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    """A running OpenAI-compatible server under test."""

    name: str
    url: str
    headers: dict[str, str]
    process: Popen[bytes]
    model: str

    def cpu_seconds(self) -> float:
        """User plus system CPU time the server process has used so far."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS_PER_SECOND


def print_log_tails(logs: Path, lines: int = 30) -> None:
    """The last lines of every server log, to stderr (when a benchmark cannot start)."""
    for log in sorted(logs.glob("*.log")):
        tail = log.read_text(errors="replace").splitlines()[-lines:]
        print(f"--- {log.name} (last lines)", file=sys.stderr)
        print("\n".join(tail), file=sys.stderr)


def spawn(command: list[str], log: Path, env: dict[str, str] | None = None) -> Popen[bytes]:
    """Start a server process logging to `log`."""
    with log.open("wb") as out:
        return Popen(command, env=env, stdout=out, stderr=STDOUT)  # noqa: S603


@dataclass
class Sample:
    """One run of one server at one concurrency."""

    tokens_per_second: float = 0.0
    total_tokens: int = 0
    wall_seconds: float = 0.0
    server_cpu_seconds: float = 0.0
    ttfts_seconds: list[float] = field(default_factory=list)
    failures: int = 0


async def wait_ready(http: aiohttp.ClientSession, server: Server, path: str) -> None:
    """Poll `path` until it answers 200 (or the process dies)."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"{server.name} exited with {server.process.returncode}")
        with contextlib.suppress(aiohttp.ClientError):
            async with http.get(server.url + path) as response:
                if response.status == 200:
                    return
        await asyncio.sleep(0.5)
    raise TimeoutError(f"{server.name} did not become ready")


async def one_request(
    http: aiohttp.ClientSession, server: Server, prompt: str, max_tokens: int
) -> tuple[float, int]:
    """Stream one chat completion; return (TTFT seconds, completion tokens)."""
    body = {
        "model": server.model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    ttft = None
    tokens = 0
    async with http.post(
        f"{server.url}/v1/chat/completions", json=body, headers=server.headers
    ) as response:
        response.raise_for_status()
        async for line in response.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = int(chunk["usage"]["completion_tokens"])
            for choice in chunk.get("choices", []):
                if ttft is None and choice.get("delta", {}).get("content"):
                    ttft = time.perf_counter() - started
    return (ttft if ttft is not None else time.perf_counter() - started), tokens


async def timed_run(
    http: aiohttp.ClientSession, server: Server, concurrency: int, requests: int, max_tokens: int
) -> Sample:
    """`concurrency` clients each streaming `requests` completions, one after another."""
    sample = Sample()

    async def worker(worker_id: int) -> None:
        for index in range(requests):
            try:
                ttft, tokens = await one_request(
                    http, server, f"request {worker_id}-{index}: tell me about spot", max_tokens
                )
            except (aiohttp.ClientError, TimeoutError):
                sample.failures += 1
                continue
            sample.ttfts_seconds.append(ttft)
            sample.total_tokens += tokens

    cpu_before = server.cpu_seconds()
    started = time.perf_counter()
    await asyncio.gather(*(worker(n) for n in range(concurrency)))
    sample.wall_seconds = time.perf_counter() - started
    sample.server_cpu_seconds = server.cpu_seconds() - cpu_before
    sample.tokens_per_second = sample.total_tokens / sample.wall_seconds
    return sample


async def alternating_runs(
    http: aiohttp.ClientSession,
    servers: Sequence[Server],
    concurrencies: Sequence[int],
    runs: int,
    max_tokens: int,
    requests_per_client: Callable[[int], int],
) -> dict[tuple[str, int], list[Sample]]:
    """At each concurrency, `runs` rounds of one run per server, so drift hits all alike."""
    results: dict[tuple[str, int], list[Sample]] = {}
    for concurrency in concurrencies:
        requests = requests_per_client(concurrency)
        for _ in range(runs):
            for server in servers:
                sample = await timed_run(http, server, concurrency, requests, max_tokens)
                results.setdefault((server.name, concurrency), []).append(sample)
    return results
