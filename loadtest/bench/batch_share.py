"""Batches on the capacity interactive traffic leaves, and fair shares when the pool is full.

    python -m loadtest.bench.batch_share [--runs 3] [--window 30] [--write docs/benchmarks.md]

Synthetic agents (fixed time to first token and tokens/s per stream, a few streams each)
behind one gateway, so the pool fills at a rate the machine can drive. Two comparisons, each
mode run in turn, `--runs` times:

- *Interactive with and without a batch*: interactive streamed chat completions arrive at
  random (Poisson) at half the pool's streams for `--window` seconds; in the second mode a
  5,000-request batch was created just before (cancelled after the window). Reported: the
  interactive streams' TTFT p50/p99 both ways, and the batch's share of the stream-time the
  interactive ones left (its tokens over the agents' rate, against the pool's streams × the
  window less the interactive streams' own time).
- *Fair shares*: one tenant sends 1,000 streams at once; ten light tenants then send a few
  each, a second apart. Reported: the light tenants' TTFT (their wait in the queue included)
  under the gateway's fair queue, against first come, first served (the same light keys
  named into the heavy key's tenant, whose streams the queue takes in arrival order); then
  on two replicas, the heavy tenant on one and the light ones on the other, with and
  without a limit store through which they take turns.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import random
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from subprocess import Popen

import aiohttp
from pydantic import SecretStr

from loadtest.bench.harness import Server, bench_spec, metric_value, metrics_text, stream_chat
from loadtest.bench.report import machine_facts, median, percentile, publish
from loadtest.bench.workdir import add_logs_option, logs_dir
from spotgate.process import loopback_socket
from spotgate.settings import (
    AgentSettings,
    BatchSettings,
    GatewaySettings,
    QueueSettings,
    SyntheticSettings,
    TokenSettings,
)
from spotgate.tokens import SigningKey
from stack.builder import AgentProcess, ApiKeySpec, GatewayReplica, LocalStack
from stack.children import GatewaySockets

MODEL = "synth"
AGENTS = 4
STREAMS_PER_AGENT = 8
TOKENS_PER_SECOND = 100.0
TTFT_SECONDS = 0.05
INTERACTIVE_TOKENS = 50
BATCH_REQUESTS = 5_000
BATCH_TOKENS = 32
HEAVY_STREAMS = 1_000
LIGHT_TENANTS = 10
LIGHT_STREAMS = 3
FAIR_TOKENS = 32
SETTLE_SECONDS = 2.0
COMMAND = "python -m loadtest.bench.batch_share --write docs/benchmarks.md"
SECTION = "batch-share"
TOKENS_METRIC = "spotgate_gateway_relayed_tokens_total"
STREAMS_METRIC = "spotgate_gateway_usage_streams_total"


@dataclass(frozen=True)
class Replica:
    """A gateway replica: where clients and operators reach it, and its process."""

    url: str
    operations_url: str
    process: Popen[bytes]


@dataclass(frozen=True)
class Stack:
    """The gateway replicas and each key's text."""

    replicas: list[Replica]
    keys: dict[str, str]

    def server(self, key: str, replica: int = 0) -> Server:
        """A replica as the key's client sees it."""
        auth = {"Authorization": f"Bearer {self.keys[key]}"}
        at = self.replicas[replica]
        return Server(key, at.url, auth, at.process, MODEL, ops_url=at.operations_url)


def _keys() -> list[ApiKeySpec]:
    """Interactive, batch and heavy keys; light ones of their own, and light ones in heavy's."""
    keys = [ApiKeySpec("interactive"), ApiKeySpec("batch"), ApiKeySpec("heavy", tenant="heavy")]
    for n in range(LIGHT_TENANTS):
        keys += [ApiKeySpec(f"light-{n}"), ApiKeySpec(f"fifo-light-{n}", tenant="heavy")]
    return keys


@contextlib.asynccontextmanager
async def share_stack(
    logs: Path, replicas: int = 1, limit_store: bool = False
) -> AsyncIterator[Stack]:
    """The emulator, `AGENTS` synthetic agents and the gateway replicas, all as processes.

    `limit_store`: the replicas share one (their limits, and their tenants' turns).
    """
    key = SigningKey.generate()
    bound = [GatewaySockets.bind() for _ in range(replicas)]
    sockets = bound[0]
    engine = SyntheticSettings(
        tokens_per_second=TOKENS_PER_SECOND, ttft_seconds=TTFT_SECONDS, capacity=STREAMS_PER_AGENT
    )
    agents = []
    for n in range(AGENTS):
        settings = AgentSettings(
            engine="synthetic",
            served_model_name=MODEL,
            agent_id=f"bench-agent-{n}",
            pinned_public_key=key.verify_key.to_pem(),
            token_issuer=sockets.url,
            imds_url="http://127.0.0.1:9",
            synthetic=engine,
        )
        agents.append(AgentProcess(f"agent-{n}", settings, loopback_socket(), STREAMS_PER_AGENT))
    gateway = GatewaySettings(
        public_url=sockets.url,
        token=TokenSettings(signing_key_pem=SecretStr(key.to_pem())),
        queue=QueueSettings(max_pending_per_model=4 * HEAVY_STREAMS, deadline_seconds=600.0),
        max_streams_per_key=2 * HEAVY_STREAMS,
        batch=BatchSettings(poll_seconds=0.5, streams_per_gateway=AGENTS * STREAMS_PER_AGENT),
    )
    gateways = [
        GatewayReplica(
            f"gateway-{n}",
            gateway.model_copy(update={"public_url": at.url, "token_issuer": sockets.url}),
            at,
        )
        for n, at in enumerate(bound)
    ]
    spec = replace(bench_spec(logs, gateways, agents, _keys()), limit_store=limit_store)
    async with LocalStack(spec) as stack:
        running = []
        for replica in gateways:
            child = stack.child(replica.name)
            if child is None:
                raise RuntimeError(f"the stack's {replica.name} is not running")
            at = replica.sockets
            running.append(Replica(at.url, at.ops_url, child.process))
        keys = {name: created.api_key for name, created in stack.keys.items()}
        yield Stack(running, keys)


def progress(message: str) -> None:
    """A line on stderr while the benchmark runs."""
    print(message, file=sys.stderr, flush=True)


async def _relayed(http: aiohttp.ClientSession, stack: Stack) -> tuple[float, float]:
    """The gateway's finished streams' completion tokens, and those streams, so far."""
    text = await metrics_text(http, stack.replicas[0].operations_url)
    return metric_value(text, TOKENS_METRIC), metric_value(text, STREAMS_METRIC)


async def _create_batch(http: aiohttp.ClientSession, stack: Stack) -> str:
    """A `BATCH_REQUESTS`-request batch of the `batch` key, created now; its id."""
    lines = io.BytesIO()
    for n in range(BATCH_REQUESTS):
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": f"batch {n}"}],
            "max_tokens": BATCH_TOKENS,
        }
        request = {"custom_id": f"b{n}", "method": "POST", "url": "/v1/chat/completions"}
        lines.write(json.dumps({**request, "body": body}).encode() + b"\n")
    headers = {"Authorization": f"Bearer {stack.keys['batch']}"}
    form = aiohttp.FormData()
    form.add_field("purpose", "batch")
    form.add_field("file", lines.getvalue(), filename="batch.jsonl")
    async with http.post(
        f"{stack.replicas[0].url}/v1/files", data=form, headers=headers
    ) as response:
        response.raise_for_status()
        file_id = (await response.json())["id"]
    create = {"input_file_id": file_id, "endpoint": "/v1/chat/completions"}
    async with http.post(
        f"{stack.replicas[0].url}/v1/batches",
        json={**create, "completion_window": "24h"},
        headers=headers,
    ) as response:
        response.raise_for_status()
        return str((await response.json())["id"])


async def _cancel_batch(http: aiohttp.ClientSession, stack: Stack, batch_id: str) -> None:
    """Cancel the batch and wait until it ended (its requests left the agents)."""
    headers = {"Authorization": f"Bearer {stack.keys['batch']}"}
    url = f"{stack.replicas[0].url}/v1/batches/{batch_id}"
    async with http.post(f"{url}/cancel", headers=headers) as response:
        response.raise_for_status()
    while True:
        async with http.get(url, headers=headers) as response:
            if (await response.json())["status"] in {"cancelled", "completed", "failed"}:
                return
        await asyncio.sleep(0.5)


@dataclass(frozen=True)
class WindowSample:
    """One window of interactive load: its TTFTs, and the batch's share of what it left."""

    ttfts_seconds: list[float]
    batch_share: float | None  # None: no batch ran


async def interactive_window(
    http: aiohttp.ClientSession, stack: Stack, window_seconds: float, with_batch: bool, seed: int
) -> WindowSample:
    """Poisson arrivals at half the pool's streams for the window, a batch running or not."""
    batch_id = await _create_batch(http, stack) if with_batch else None
    if batch_id is not None:
        await asyncio.sleep(SETTLE_SECONDS * 2)  # the batch fills the agents first
    service_seconds = TTFT_SECONDS + INTERACTIVE_TOKENS / TOKENS_PER_SECOND
    rate = AGENTS * STREAMS_PER_AGENT / 2 / service_seconds
    rng = random.Random(seed)
    server = stack.server("interactive")
    tokens_before, streams_before = await _relayed(http, stack)
    started = time.monotonic()
    tasks: list[asyncio.Task[tuple[float, float, int]]] = []

    async def one(n: int) -> tuple[float, float, int]:
        began = time.monotonic()
        messages = [{"role": "user", "content": f"interactive {seed} {n}"}]
        reply = await stream_chat(http, server, messages, INTERACTIVE_TOKENS)
        return reply.ttft_seconds, time.monotonic() - began, reply.completion_tokens

    while time.monotonic() - started < window_seconds:
        tasks.append(asyncio.create_task(one(len(tasks))))
        await asyncio.sleep(rng.expovariate(rate))
    replies = await asyncio.gather(*tasks)
    elapsed = time.monotonic() - started
    tokens_after, streams_after = await _relayed(http, stack)
    share = None
    if batch_id is not None:  # a batch request's time on an agent: its first token, then each
        batch_tokens = tokens_after - tokens_before - sum(tokens for _, _, tokens in replies)
        batch_streams = streams_after - streams_before - len(replies)
        used = batch_streams * TTFT_SECONDS + batch_tokens / TOKENS_PER_SECOND
        left = AGENTS * STREAMS_PER_AGENT * elapsed - sum(busy for _, busy, _ in replies)
        share = used / left
        await _cancel_batch(http, stack, batch_id)
    return WindowSample([ttft for ttft, _, _ in replies], share)


async def fair_share_run(
    http: aiohttp.ClientSession, stack: Stack, fifo: bool, light_replica: int = 0
) -> list[float]:
    """The light tenants' TTFTs while the heavy tenant's 1,000 streams wait.

    The heavy tenant's go to the first replica, the light tenants' to `light_replica`.
    """
    heavy = stack.server("heavy")
    backlog = [
        asyncio.create_task(
            stream_chat(http, heavy, [{"role": "user", "content": f"heavy {n}"}], FAIR_TOKENS)
        )
        for n in range(HEAVY_STREAMS)
    ]
    await asyncio.sleep(SETTLE_SECONDS)  # the backlog queued

    async def light_ttft(key: str, prompt: str) -> float:
        messages = [{"role": "user", "content": prompt}]
        server = stack.server(key, light_replica)
        return (await stream_chat(http, server, messages, FAIR_TOKENS)).ttft_seconds

    light: list[asyncio.Task[float]] = []
    for round_ in range(LIGHT_STREAMS):
        for n in range(LIGHT_TENANTS):
            key = f"{'fifo-' if fifo else ''}light-{n}"
            light.append(asyncio.create_task(light_ttft(key, f"light {n} {round_}")))
        await asyncio.sleep(1.0)
    ttfts = await asyncio.gather(*light)
    await asyncio.gather(*backlog)
    return list(ttfts)


def _row(name: str, samples: Sequence[Sequence[float]]) -> str:
    """A table row: p50 and p99 of each run, median and worst across runs (ms)."""
    p50s = [percentile(run, 0.50) * 1000 for run in samples]
    p99s = [percentile(run, 0.99) * 1000 for run in samples]
    return (
        f"| {name} | {median(p50s):,.0f} / {max(p50s):,.0f} | "
        f"{median(p99s):,.0f} / {max(p99s):,.0f} | {sum(len(run) for run in samples):,} |"
    )


def _table(first: str, rows: dict[str, Sequence[Sequence[float]]]) -> list[str]:
    """A TTFT table: its header, then one row per mode."""
    header = [f"| {first} | TTFT p50 | TTFT p99 | streams |", "|---|---|---|---|"]
    return header + [_row(name, samples) for name, samples in rows.items()]


def render(
    windows: dict[bool, list[WindowSample]],
    fair: dict[bool, list[list[float]]],
    across: dict[bool, list[list[float]]],
    window_seconds: float,
    runs: int,
) -> str:
    """The Markdown section for `docs/benchmarks.md`."""
    without = [sample.ttfts_seconds for sample in windows[False]]
    with_batch = [sample.ttfts_seconds for sample in windows[True]]
    shares = [sample.batch_share for sample in windows[True] if sample.batch_share is not None]
    p99_ratio = [
        percentile(b, 0.99) / percentile(a, 0.99) for a, b in zip(without, with_batch, strict=True)
    ]
    light = {fifo: [percentile(run, 0.99) for run in runs_] for fifo, runs_ in fair.items()}
    lines = [
        "## Batches on spare capacity, and fair shares (synthetic engine)",
        "",
        f"Command: `{COMMAND}`. {AGENTS} synthetic agents of {STREAMS_PER_AGENT} streams each "
        f"({TOKENS_PER_SECOND:g} tokens/s a stream, {TTFT_SECONDS * 1000:g} ms to the first "
        f"token) behind one gateway, all processes on this machine; {runs} runs of each mode "
        f"in turn. Machine: {machine_facts(['aiohttp'])}.",
        "",
        f"**Interactive streams with and without a batch.** Streamed chat completions of "
        f"{INTERACTIVE_TOKENS} tokens arrive at random (Poisson) at half the pool's "
        f"{AGENTS * STREAMS_PER_AGENT} streams for {window_seconds:g} s; with a batch, a "
        f"{BATCH_REQUESTS:,}-request batch ({BATCH_TOKENS} tokens each) was created first and "
        "fills what they leave (its requests run in the flex tier and give their place to an "
        "interactive stream that would wait). TTFT in ms, median / worst of the runs:",
        "",
        *_table("mode", {"interactive alone": without, "interactive beside the batch": with_batch}),
        "",
        f"- TTFT p99 beside the batch against alone: median {median(p99_ratio):.2f}×, "
        f"worst {max(p99_ratio):.2f}× (goal ≤ 1.2×).",
        f"- The batch's share of the stream-time the interactive streams left: median "
        f"{median(shares):.0%}, worst {min(shares):.0%} (goal ≥ 90 %): the batch requests "
        "finished in the window, each its first token and its tokens at the agents' pace, "
        "against the pool's streams × the window less the interactive streams' own time.",
        "",
        f"**Fair shares.** One tenant sends {HEAVY_STREAMS:,} streams of {FAIR_TOKENS} tokens "
        f"at once; {LIGHT_TENANTS} light tenants then send {LIGHT_STREAMS} each, one per "
        "tenant a second apart. First come, first served: the same light keys named into the "
        "heavy key's tenant, whose streams the queue takes in arrival order. The light "
        "tenants' TTFT (their wait in the queue included), ms, median / worst of the runs:",
        "",
        *_table(
            "queue",
            {"fair (tenants by tokens)": fair[False], "first come, first served": fair[True]},
        ),
        "",
        f"- Light tenants' TTFT p99, fair against first come: median "
        f"{median(light[False]) / median(light[True]):.2f}× "
        f"({median(light[False]) * 1000:,.0f} against {median(light[True]) * 1000:,.0f} ms).",
        "",
        "**Fair shares across two replicas.** The same, on two gateway replicas: the heavy "
        "tenant's streams all on the first (as one websocket carries them), the light "
        "tenants' on the second. With a limit store the replicas share their tenants' "
        "streams and a replica lets a freed slot go while a tenant running fewer waits on "
        "the other (`gateway.fair_share`); without one each replica's queue is fair on its "
        "own. Light tenants' TTFT, ms, median / worst of the runs:",
        "",
        *_table(
            "replicas",
            {
                "two, turns shared through the limit store": across[True],
                "two, each alone (no limit store)": across[False],
                "one (above)": fair[False],
            },
        ),
    ]
    return "\n".join(lines)


async def every_agent_routed(http: aiohttp.ClientSession, stack: Stack) -> None:
    """Wait until each replica routes to every agent (its view refreshes after they start)."""
    ready = 'spotgate_gateway_agents{state="ready"}'
    for replica in stack.replicas:
        while metric_value(await metrics_text(http, replica.operations_url), ready) < AGENTS:  # noqa: ASYNC110 - metrics are polled
            await asyncio.sleep(0.2)


async def across_replicas(logs: Path, runs: int, limit_store: bool) -> list[list[float]]:
    """Light tenants' TTFTs on a second replica while the heavy backlog waits on the first."""
    async with share_stack(logs, replicas=2, limit_store=limit_store) as stack:
        timeout = aiohttp.ClientTimeout(total=900)
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
            await every_agent_routed(http, stack)
            samples = []
            for n in range(runs):
                samples.append(await fair_share_run(http, stack, False, light_replica=1))
                p99 = percentile(samples[-1], 0.99)
                progress(f"run {n + 1} two replicas, store={limit_store}: p99 {p99:.2f} s")
                await asyncio.sleep(SETTLE_SECONDS)
    return samples


async def run(runs: int, window_seconds: float, kept_logs: Path | None = None) -> str:
    """Every mode `runs` times, in turn, on one stack (its logs kept in `kept_logs` if given)."""
    with logs_dir(kept_logs) as logs:
        async with share_stack(logs) as stack:
            timeout = aiohttp.ClientTimeout(total=900)
            connector = aiohttp.TCPConnector(limit=0)
            async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
                await every_agent_routed(http, stack)
                windows: dict[bool, list[WindowSample]] = {False: [], True: []}
                fair: dict[bool, list[list[float]]] = {False: [], True: []}
                for n in range(runs):
                    for with_batch in (n % 2 == 1, n % 2 == 0):
                        sample = await interactive_window(
                            http, stack, window_seconds, with_batch, seed=2 * n + with_batch
                        )
                        windows[with_batch].append(sample)
                        progress(f"run {n + 1} batch={with_batch}: {len(sample.ttfts_seconds)}")
                        await asyncio.sleep(SETTLE_SECONDS)
                    for fifo in (n % 2 == 1, n % 2 == 0):
                        fair[fifo].append(await fair_share_run(http, stack, fifo))
                        progress(
                            f"run {n + 1} fifo={fifo}: p99 {percentile(fair[fifo][-1], 0.99):.2f} s"
                        )
                        await asyncio.sleep(SETTLE_SECONDS)
        across = {store: await across_replicas(logs, runs, store) for store in (True, False)}
    return render(windows, fair, across, window_seconds, runs)


def main(argv: Sequence[str] | None = None) -> None:
    """Run the comparisons and print (or write) the section."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--window", type=float, default=30.0, help="seconds of interactive load")
    parser.add_argument("--write", type=Path, default=None, help="the report to update")
    add_logs_option(parser)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    section = asyncio.run(run(args.runs, args.window, args.logs))
    publish(section, SECTION, args.write, started)


if __name__ == "__main__":
    main()
