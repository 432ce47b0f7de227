"""What the side-by-side benchmarks share: server processes, one SSE client, timed runs.

Every server under test speaks OpenAI's streamed chat completions, and every one is driven
by the same aiohttp client code, so differences come from the servers.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import json
import os
import signal
import sys
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from subprocess import STDOUT, Popen, TimeoutExpired
from typing import Any, Literal

import aiohttp

from spotgate.settings import LogLevel, SharedSettings
from stack.builder import AgentProcess, ApiKeySpec, GatewayReplica, StackSpec

STARTUP_TIMEOUT_SECONDS = 300.0
CLIENT_KEEPALIVE_SECONDS = 4.0
"""How long clients keep an idle connection: less than any server under test (uvicorn, LiteLLM's,
closes one after 5 s), so none is reused as its server closes it (the request is reset)."""
BENCH_KEY = "bench"
"""The API key the benchmarks' clients use."""
BENCH_LOG_LEVEL: LogLevel = "warning"
"""What the services under test log: warnings and errors only, no line per request."""
CLOCK_TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")


@dataclass
class Server:
    """A running server under test, and how the clients talk to it.

    `sse`: OpenAI streamed chat completions, one HTTP request per stream. `ws`: the wire
    protocol (ARCHITECTURE.md), every client's streams multiplexed on one websocket.
    """

    name: str
    url: str
    headers: dict[str, str]
    process: Popen[bytes]
    model: str
    transport: Literal["sse", "ws"] = "sse"
    # A Prometheus histogram of the server's own added TTFT, read before and after each run.
    added_ttft_histogram: str | None = None
    # Where its readiness and metrics are, when not at `url` (a gateway's operations port).
    ops_url: str | None = None
    # `ws`: each client on a websocket of its own, not every stream on one shared socket.
    ws_socket_per_client: bool = False

    @property
    def operations_url(self) -> str:
        """The base of its `/readyz` (or other health path) and `/metrics`."""
        return self.ops_url or self.url

    def cpu_seconds(self) -> tuple[float, float]:
        """User and system (the kernel's, for it) CPU time the server process has used so far."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) / CLOCK_TICKS_PER_SECOND, int(fields[12]) / CLOCK_TICKS_PER_SECOND


SERVER_STOP_SECONDS = 30.0


def stop_servers(servers: Iterable[Server]) -> None:
    """Ask every server to stop, then wait for each (killing one that outlasts the grace)."""
    servers = list(servers)
    for server in servers:
        server.process.terminate()
    for server in servers:
        try:
            server.process.wait(timeout=SERVER_STOP_SECONDS)
        except TimeoutExpired:
            server.process.kill()


def spawn(
    command: list[str],
    log: Path,
    env: dict[str, str] | None = None,
    cpus: set[int] | None = None,
) -> Popen[bytes]:
    """Start a server process logging to `log`, pinned to `cpus` when given."""
    with log.open("wb") as out:
        process = Popen(command, env=env, stdout=out, stderr=STDOUT)  # noqa: S603
    if cpus is not None:
        os.sched_setaffinity(process.pid, cpus)
    return process


def bench_spec(
    logs: Path,
    gateways: Iterable[GatewayReplica],
    agents: Iterable[AgentProcess] = (),
    keys: Sequence[str | ApiKeySpec] = (BENCH_KEY,),
) -> StackSpec:
    """A benchmark's stack: the emulator in a process of its own, quiet services, its keys."""
    return StackSpec(
        log_dir=logs,
        shared=SharedSettings(log_level=BENCH_LOG_LEVEL),
        emulator_process=True,
        keys=tuple(key if isinstance(key, ApiKeySpec) else ApiKeySpec(key) for key in keys),
        gateways=tuple(gateways),
        agents=tuple(agents),
    )


def split_cpus() -> tuple[set[int], set[int]]:
    """(client side, relay side): the machine's CPUs in two halves, as even as possible.

    The relay under test gets its own CPUs, as it has in a deployment, so the latency it adds
    is its own and not its fight with the load generator for a core. On one CPU both halves
    are that CPU.
    """
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return set(cpus), set(cpus)
    half = len(cpus) // 2
    return set(cpus[:half]), set(cpus[half:])


@dataclass
class Sample:
    """One run of one server at one concurrency."""

    tokens_per_second: float = 0.0
    total_tokens: int = 0
    wall_seconds: float = 0.0
    server_cpu_seconds: float = 0.0  # user plus system
    server_system_cpu_seconds: float = 0.0  # of which the kernel's: system calls, its sockets
    ttfts_seconds: list[float] = field(default_factory=list)
    failures: int = 0
    failure_kinds: Counter[str] = field(default_factory=Counter)  # `failure_kind`s, counted
    chunks: int = 0  # the messages (SSE chunks, websocket frames) that carried text
    # Observations of the server's added-TTFT histogram during the run: {upper bound: count}.
    added_ttft_buckets: dict[float, float] = field(default_factory=dict)


async def metrics_text(http: aiohttp.ClientSession, url: str) -> str:
    """The Prometheus exposition a server publishes at `url`/metrics."""
    async with http.get(f"{url}/metrics") as response:
        response.raise_for_status()
        return await response.text()


def metric_value(text: str, sample: str) -> float:
    """The value of `sample` in a Prometheus exposition, summed over its labels; 0 if absent.

    `sample` is a metric name (every labelled series of it counts) or a name with its labels
    as exposed (`spotgate_gateway_agents{state="ready"}`). Absent reads as 0, as a counter
    that has not been created yet is 0.
    """
    total = 0.0
    for line in text.splitlines():
        series, _, value = line.rpartition(" ")
        if series == sample or ("{" not in sample and series.startswith(f"{sample}{{")):
            total += float(value)
    return total


async def histogram_buckets(http: aiohttp.ClientSession, url: str, name: str) -> dict[float, float]:
    """Cumulative bucket counts of a Prometheus histogram, by upper bound (seconds)."""
    text = await metrics_text(http, url)
    buckets: dict[float, float] = {}
    prefix = f'{name}_bucket{{le="'
    for line in text.splitlines():
        if line.startswith(prefix):
            bound, count = line[len(prefix) :].split('"}', 1)
            buckets[float(bound)] = float(count)
    return buckets


def bucket_quantile(buckets: dict[float, float], q: float) -> float:
    """The upper bound of the bucket holding quantile `q` (cumulative counts, as Prometheus)."""
    total = max(buckets.values(), default=0.0)
    for bound in sorted(buckets):
        if total and buckets[bound] >= q * total:
            return bound
    return float("nan")


async def wait_ready(http: aiohttp.ClientSession, server: Server, path: str) -> None:
    """Poll `path` on its operations URL until it answers 200 (or the process dies)."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"{server.name} exited with {server.process.returncode}")
        with contextlib.suppress(aiohttp.ClientError):
            async with http.get(server.operations_url + path) as response:
                if response.status == 200:
                    return
        await asyncio.sleep(0.5)
    raise TimeoutError(f"{server.name} did not become ready")


async def warmed(http: aiohttp.ClientSession, server: Server) -> None:
    """Until a small run on `server` streams without a failure (a refusal counts as one).

    Its links and pools are then open and, behind a gateway, its agent's model routed.
    """
    deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
    while True:
        with contextlib.suppress(aiohttp.ClientError):
            if not (await timed_run(http, server, 2, 1, 4)).failures:
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{server.name} served no stream in time")
        await asyncio.sleep(0.5)


def failure_kind(err: aiohttp.ClientError | TimeoutError) -> str:
    """What ended a failed request, in a word: its HTTP status, a timeout, or the error's kind."""
    if isinstance(err, aiohttp.ClientResponseError):
        return f"HTTP {err.status}"
    if isinstance(err, TimeoutError):
        return "timeout"
    if type(err) is aiohttp.ClientError:  # an `error` frame: its code
        return str(err).partition(":")[0]
    if isinstance(err, OSError) and err.errno:  # a connection reset, refused, …
        return f"{type(err).__name__} ({errno.errorcode.get(err.errno, err.errno)})"
    return type(err).__name__


@dataclass(frozen=True)
class ChatReply:
    """What one streamed chat completion gave the client."""

    ttft_seconds: float
    completion_tokens: int
    prompt_tokens: int
    text: str
    chunks: int = 0  # the SSE chunks that carried text


async def stream_chat(
    http: aiohttp.ClientSession,
    server: Server,
    messages: Sequence[dict[str, str]],
    max_tokens: int,
    user: str | None = None,
) -> ChatReply:
    """Stream one greedy chat completion of `messages`, as `user` (OpenAI's field) when given."""
    body: dict[str, Any] = {
        "model": server.model,
        "messages": list(messages),
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if user is not None:
        body["user"] = user
    started = time.perf_counter()
    ttft = None
    completion_tokens = prompt_tokens = 0
    text: list[str] = []
    chunks = 0
    async with http.post(
        f"{server.url}/v1/chat/completions", json=body, headers=server.headers
    ) as response:
        response.raise_for_status()
        async for line in response.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                completion_tokens = int(chunk["usage"]["completion_tokens"])
                prompt_tokens = int(chunk["usage"]["prompt_tokens"])
            for choice in chunk.get("choices", []):
                content = choice.get("delta", {}).get("content")
                if content:
                    chunks += 1
                    text.append(content)
                    if ttft is None:
                        ttft = time.perf_counter() - started
    return ChatReply(
        ttft if ttft is not None else time.perf_counter() - started,
        completion_tokens,
        prompt_tokens,
        "".join(text),
        chunks,
    )


async def one_request(
    http: aiohttp.ClientSession, server: Server, prompt: str, max_tokens: int
) -> tuple[float, int, int]:
    """Stream one chat completion; return (TTFT seconds, completion tokens, text chunks)."""
    reply = await stream_chat(http, server, [{"role": "user", "content": prompt}], max_tokens)
    return reply.ttft_seconds, reply.completion_tokens, reply.chunks


class StreamSocket:
    """One websocket carrying many streams; frames are sorted to their stream by id."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self._streams: dict[str, asyncio.Queue[dict[str, Any]]] = {}
        self._reader = asyncio.create_task(self._read())

    async def one_request(self, model: str, prompt: str, max_tokens: int) -> tuple[float, int, int]:
        """Stream one chat generation; return (TTFT seconds, completion tokens, text frames)."""
        stream_id = uuid.uuid4().hex
        frames: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._streams[stream_id] = frames
        started = time.perf_counter()
        ttft = None
        chunks = 0
        try:
            await self._ws.send_json(
                {
                    "type": "generate",
                    "id": stream_id,
                    "model": model,
                    "messages": [{"role": "user", "content": prompt}],
                    "max_tokens": max_tokens,
                    "temperature": 0,
                }
            )
            while True:
                frame = await frames.get()
                if frame["type"] == "delta" and frame["text"]:
                    chunks += 1
                    if ttft is None:
                        ttft = time.perf_counter() - started
                elif frame["type"] == "done":
                    tokens = int(frame["usage"]["completion_tokens"])
                    ttft = ttft if ttft is not None else time.perf_counter() - started
                    return ttft, tokens, chunks
                elif frame["type"] == "error":
                    raise aiohttp.ClientError(f"{frame['code']}: {frame['message']}")
        finally:
            del self._streams[stream_id]

    async def close(self) -> None:
        """Close the socket."""
        await self._ws.close()
        self._reader.cancel()

    async def _read(self) -> None:
        async for message in self._ws:
            frame = json.loads(message.data)
            queue = self._streams.get(frame.get("id", ""))
            if queue is not None:
                queue.put_nowait(frame)


async def stream_socket(http: aiohttp.ClientSession, server: Server) -> StreamSocket:
    """A websocket to the server's wire protocol, for streams of one client or of all."""
    ws = await http.ws_connect(
        f"{server.url}/v1/ws", headers=server.headers, max_msg_size=16 * 1024 * 1024
    )
    return StreamSocket(ws)


async def timed_run(
    http: aiohttp.ClientSession,
    server: Server,
    concurrency: int,
    requests: int,
    max_tokens: int,
    stagger_seconds: float = 0.0,
) -> Sample:
    """`concurrency` clients each streaming `requests` completions, one after another.

    Client n starts `n * stagger_seconds / concurrency` after the first, so with a stagger of
    about one stream's length the streams are in steady state at `concurrency` rather than
    arriving as one burst.
    """
    sample = Sample()
    shared: StreamSocket | None = None
    if server.transport == "ws" and not server.ws_socket_per_client:
        shared = await stream_socket(http, server)

    async def worker(worker_id: int) -> None:
        await asyncio.sleep(worker_id * stagger_seconds / concurrency)  # arrival shaping
        own = await stream_socket(http, server) if server.ws_socket_per_client else None
        sockets = own or shared
        try:
            for index in range(requests):
                prompt = f"request {worker_id}-{index}: tell me about spot"
                try:
                    if sockets is not None:
                        reply = await sockets.one_request(server.model, prompt, max_tokens)
                    else:
                        reply = await one_request(http, server, prompt, max_tokens)
                except (aiohttp.ClientError, TimeoutError) as err:
                    sample.failures += 1
                    sample.failure_kinds[failure_kind(err)] += 1
                    continue
                ttft, tokens, chunks = reply
                sample.ttfts_seconds.append(ttft)
                sample.total_tokens += tokens
                sample.chunks += chunks
        finally:
            if own is not None:
                await own.close()

    histogram = server.added_ttft_histogram
    before = await histogram_buckets(http, server.operations_url, histogram) if histogram else {}
    user_before, system_before = server.cpu_seconds()
    started = time.perf_counter()
    try:
        await asyncio.gather(*(worker(n) for n in range(concurrency)))
    finally:
        if shared is not None:
            await shared.close()
    sample.wall_seconds = time.perf_counter() - started
    user, system = server.cpu_seconds()
    sample.server_system_cpu_seconds = system - system_before
    sample.server_cpu_seconds = user - user_before + sample.server_system_cpu_seconds
    if histogram:
        after = await histogram_buckets(http, server.operations_url, histogram)
        sample.added_ttft_buckets = {le: after[le] - before.get(le, 0.0) for le in after}
    sample.tokens_per_second = sample.total_tokens / sample.wall_seconds
    return sample


async def alternating_runs(
    http: aiohttp.ClientSession,
    servers: Sequence[Server],
    concurrencies: Sequence[int],
    runs: int,
    max_tokens: int,
    requests_per_client: Callable[[int], int],
    stagger_seconds: float = 0.0,
    before_run: Callable[[Server], Awaitable[Server]] | None = None,
) -> dict[tuple[str, int], list[Sample]]:
    """At each concurrency, `runs` rounds of one run per server, so drift hits all alike.

    `before_run` gives the server each run is timed on (one restarted with fresh credentials).
    """
    results: dict[tuple[str, int], list[Sample]] = {}
    for concurrency in concurrencies:
        requests = requests_per_client(concurrency)
        for _ in range(runs):
            for named in servers:
                server = named if before_run is None else await before_run(named)
                sample = await timed_run(
                    http, server, concurrency, requests, max_tokens, stagger_seconds
                )
                results.setdefault((server.name, concurrency), []).append(sample)
    return results


PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In a child, before it runs: the kernel kills it when its parent dies (Linux)."""
    libc = ctypes.CDLL(None)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


@contextlib.contextmanager
def cpu_burners(count: int) -> Iterator[None]:
    """`count` processes that each keep a CPU busy (unpinned, as any other tenant's work)."""
    # Killed with the bench, however it ends (a SIGTERM skips the `finally` below).
    burners = [
        Popen([sys.executable, "-c", "while True: pass"], preexec_fn=_die_with_parent)
        for _ in range(count)
    ]
    try:
        yield
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
