"""Where the gateway's CPU goes at 1,000 streams: its samples by stage, taken by py-spy.

    python -m loadtest.bench.gateway_profile [--concurrency 1000] [--seconds 20]
                                             [--transport ws sse] [--write FILE]

The gateway relay benchmark's stack (loadtest/bench/relay_stack.py: one agent with the
**synthetic engine**, the gateway on its own CPUs); clients stream 32-token replies back to
back while py-spy samples the gateway's Python stacks (250 a second, without pausing it) for
`--seconds`, once per transport. Not paused: a sample py-spy takes by stopping the process
lands on its system calls, which then looked many times costlier than they are (a `getpid`
of 0.1 µs three times a stream drew 6 % of the samples, an SSE chunk's `write` 40 %).
Reported: the share of the samples spent within each stage of a stream's way through the
gateway (a sample inside a stage nested in another counts for both), and the functions that
most samples were in themselves. Native code (uvloop's socket work, pydantic's validation)
counts for the Python function that called it; the event loop's own work is the samples with
no Python frame but its `run`.

Before sampling, the gateway's CPU is split into a cost per stream and one per token: runs of
32-token and of 256-token replies, alternating (`--cost-rounds`), each pair fitted as
`CPU = stream cost × streams + token cost × tokens`. A stream's fixed cost (its request,
placing, `start` and `done`, its task) against its tokens' (each delta read, held and sent)
says which of the two a relay's goal in tokens per CPU-second at 32-token replies rests on.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from loadtest.bench.gateway_relay import (
    TOKENS_PER_CPU_SECOND_GOAL,
    requests_per_client,
    stream_seconds,
)
from loadtest.bench.harness import (
    Sample,
    Server,
    split_cpus,
    timed_run,
    wait_ready,
    warmed,
)
from loadtest.bench.relay_stack import relay_stack
from loadtest.bench.report import machine_facts, publish
from loadtest.bench.workdir import add_logs_option, logs_dir, print_log_tails

MAX_TOKENS = 32
COST_REPLY_TOKENS = (MAX_TOKENS, 256)  # the two reply lengths the cost split is fitted on
SAMPLES_PER_SECOND = 250
TOP_FUNCTIONS = 12
STAGES = (
    ("agent frames read (the link's reader)", "AgentLink._read "),
    ("· parsed (parse_frame)", "parse_frame "),
    ("· sent to the client at once (take_now)", "_Relay._take_now "),
    ("streams' relays (their tasks)", "start_stream.<locals>.run "),
    ("· placing a stream (dispatcher, agent)", "_Relay.place "),
    ("· deltas through the relay", "_Relay._delta "),
    ("SSE streams (their handlers)", "_openai "),
    ("client frames read (the socket's loop)", "serve_websocket "),
    ("event loop and sockets (no Python frame)", None),
)


def py_spy() -> Path:
    """The py-spy beside this Python (the dev install puts it there)."""
    binary = Path(sys.executable).with_name("py-spy")
    if not binary.exists():
        raise SystemExit(f"py-spy is not installed at {binary}: make install")
    return binary


@dataclass(frozen=True)
class StreamCost:
    """The gateway's CPU as a cost per stream plus one per relayed token, in microseconds.

    `*_system_us`: the part of each that is the kernel's (system calls: its socket writes).
    """

    stream_us: float
    token_us: float
    stream_system_us: float = 0.0
    token_system_us: float = 0.0

    def tokens_per_cpu_second(self, reply_tokens: int) -> float:
        """Relayed tokens per gateway CPU-second at replies of `reply_tokens`."""
        return reply_tokens / ((self.stream_us + reply_tokens * self.token_us) / 1e6)


def stream_cost(samples: Sequence[Sample]) -> StreamCost:
    """The least-squares split of the runs' gateway CPU into per-stream and per-token costs."""
    streams = [float(len(sample.ttfts_seconds)) for sample in samples]
    tokens = [float(sample.total_tokens) for sample in samples]
    stream_us, token_us = _fit(streams, tokens, [s.server_cpu_seconds * 1e6 for s in samples])
    system = [sample.server_system_cpu_seconds * 1e6 for sample in samples]
    return StreamCost(stream_us, token_us, *_fit(streams, tokens, system))


def _fit(
    streams: Sequence[float], tokens: Sequence[float], cpu: Sequence[float]
) -> tuple[float, float]:
    """`cpu` ≈ a × streams + b × tokens, least squares: (a, b)."""
    ss = sum(n * n for n in streams)
    st = sum(n * t for n, t in zip(streams, tokens, strict=True))
    tt = sum(t * t for t in tokens)
    sc = sum(n * c for n, c in zip(streams, cpu, strict=True))
    tc = sum(t * c for t, c in zip(tokens, cpu, strict=True))
    determinant = ss * tt - st * st
    if determinant <= 0:
        raise ValueError("the runs do not tell streams from tokens: two reply lengths are needed")
    return (sc * tt - tc * st) / determinant, (tc * ss - sc * st) / determinant


async def cost_rounds(server: Server, concurrency: int, rounds: int) -> list[StreamCost]:
    """One `StreamCost` per round of runs at each of `COST_REPLY_TOKENS`, alternating."""
    timeout = aiohttp.ClientTimeout(total=600)
    connector = aiohttp.TCPConnector(limit=0)
    costs: list[StreamCost] = []
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        await ready_to_stream(http, server)
        for round_index in range(rounds):
            lengths = COST_REPLY_TOKENS if round_index % 2 == 0 else COST_REPLY_TOKENS[::-1]
            samples = []
            for reply_tokens in lengths:
                sample = await timed_run(
                    http,
                    server,
                    concurrency,
                    requests_per_client(concurrency),
                    reply_tokens,
                    stream_seconds(reply_tokens),
                )
                if sample.failures:
                    raise RuntimeError(f"{sample.failures} streams failed in a cost run")
                samples.append(sample)
            costs.append(stream_cost(samples))
    return costs


async def ready_to_stream(http: aiohttp.ClientSession, server: Server) -> None:
    """Wait until `server` serves streams: the gateway up and its agent's model routed."""
    await wait_ready(http, server, "/readyz")
    await warmed(http, server)


async def profile(server: Server, concurrency: int, seconds: float, out: Path) -> None:
    """Sample the gateway while `concurrency` clients stream back to back on `server`."""
    timeout = aiohttp.ClientTimeout(total=600)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        await ready_to_stream(http, server)
        sampler = await asyncio.create_subprocess_exec(
            str(py_spy()),
            "record",
            "--nonblocking",  # see the module's docstring
            "--pid",
            str(server.process.pid),
            "--rate",
            str(SAMPLES_PER_SECOND),
            "--duration",
            str(round(seconds)),
            "--format",
            "raw",
            "--output",
            str(out),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        sampling = asyncio.create_task(sampler.wait())
        while not sampling.done():
            await timed_run(
                http,
                server,
                concurrency,
                requests_per_client(concurrency),
                MAX_TOKENS,
                stream_seconds(MAX_TOKENS),
            )
        if await sampling != 0:
            raise RuntimeError(f"py-spy failed ({sampler.returncode}); it needs ptrace rights")


def stage_shares(raw: str) -> tuple[int, dict[str, float], list[tuple[str, float]]]:
    """Samples, each stage's share of them, and the functions most samples were in."""
    total = 0
    within: Counter[str] = Counter()
    own: Counter[str] = Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        samples = int(count)
        total += samples
        frames = stack.split(";")
        own[frames[-1]] += samples
        loop_only = frames[-1].startswith(("Runner.run ", "run (uvloop"))
        for label, marker in STAGES:
            if loop_only if marker is None else any(f.startswith(marker) for f in frames):
                within[label] += samples
    shares = {label: 100 * within[label] / max(1, total) for label, _ in STAGES}
    top = [(name, 100 * n / max(1, total)) for name, n in own.most_common(TOP_FUNCTIONS)]
    return total, shares, top


def render(
    results: dict[str, str], costs: dict[str, list[StreamCost]], concurrency: int, seconds: float
) -> str:
    """The section of docs/benchmarks.md: the cost split, stages by transport, top functions."""
    parsed = {transport: stage_shares(raw) for transport, raw in results.items()}
    transports = list(parsed)
    lines = [
        "## Gateway CPU profile at 1,000 streams (synthetic engine)",
        "",
        f"Command: `python -m loadtest.bench.gateway_profile --write docs/benchmarks.md`. "
        f"The gateway relay benchmark's stack; {concurrency} clients streaming replies back to "
        "back (over websockets, their streams multiplexed on one client socket, as in the "
        "relay table).",
        f"Machine: {machine_facts(['aiohttp', 'pydantic', 'uvloop'])}.",
        "",
        *cost_lines(costs),
        f"**Where the CPU goes**, {MAX_TOKENS}-token replies sampled by py-spy (not pausing the "
        f"gateway) for {seconds:.0f} s per transport ({SAMPLES_PER_SECOND} samples a second). "
        "*Share*: of the gateway's samples, those within the stage (a `·` stage lies within the "
        "one above it). Native code counts for the Python function that called it.",
        "",
        "| stage | " + " | ".join(f"{t} share" for t in transports) + " |",
        "|---|" + "---|" * len(transports),
    ]
    for label, _ in STAGES:
        shares = " | ".join(f"{parsed[t][1][label]:.1f} %" for t in transports)
        lines.append(f"| {label} | {shares} |")
    samples = ", ".join(f"{parsed[t][0]:,} ({t})" for t in transports)
    lines += ["", f"Samples: {samples}.", ""]
    for transport in transports:
        lines += [
            f"Functions most {transport} samples were in themselves:",
            "",
            "| function | share |",
            "|---|---|",
        ]
        lines += [f"| `{name}` | {share:.1f} % |" for name, share in parsed[transport][2]]
        lines.append("")
    return "\n".join(lines).rstrip()


def cost_lines(costs: dict[str, list[StreamCost]]) -> list[str]:
    """The cost split's table and what it means for the relay's goals (none: no lines)."""
    if not costs:
        return []
    short, long = COST_REPLY_TOKENS
    rounds = max(len(fits) for fits in costs.values())
    lines = [
        f"**A stream's cost and a token's**: {rounds} rounds per transport, each a run of "
        f"{short}-token and one of {long}-token replies (alternating which first), fitted as "
        "gateway CPU = cost per stream × streams + cost per token × tokens; median / worst "
        "of the rounds' fits. *In the kernel*: the same fit of the gateway's system CPU time "
        "alone (median), mostly its socket writes; on this machine's loopback a write also "
        "pays for the receiving end's TCP, which a network would not.",
        "",
        f"| transport | µs per stream | µs per token | in the kernel, per stream / per token | "
        f"µs per {short}-token stream | tokens per CPU-second at {short} tokens | goal | "
        "fixed share |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for transport, fits in costs.items():
        stream = [fit.stream_us for fit in fits]
        token = [fit.token_us for fit in fits]
        whole = [fit.stream_us + short * fit.token_us for fit in fits]
        rate = [fit.tokens_per_cpu_second(short) for fit in fits]
        fixed = statistics.median(stream) / statistics.median(whole)
        goal = TOKENS_PER_CPU_SECOND_GOAL[transport]
        lines.append(
            f"| {transport} | {statistics.median(stream):.0f} / {max(stream):.0f} | "
            f"{statistics.median(token):.1f} / {max(token):.1f} | "
            f"{statistics.median(f.stream_system_us for f in fits):.0f} / "
            f"{statistics.median(f.token_system_us for f in fits):.1f} | "
            f"{statistics.median(whole):.0f} / {max(whole):.0f} | "
            f"{statistics.median(rate):,.0f} / {min(rate):,.0f} | {goal:,} "
            f"(≤ {short / goal * 1e6:.0f} µs a stream) | {fixed:.0%} |"
        )
    lines.append("")
    return lines


def main() -> None:
    """Profile the gateway for each transport and print (and optionally write) the section."""
    parser = argparse.ArgumentParser(description="the gateway's CPU profile under load")
    parser.add_argument("--concurrency", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--transport", nargs="+", choices=("ws", "sse"), default=["ws", "sse"])
    parser.add_argument("--cost-rounds", type=int, default=3, help="0: no cost split")
    parser.add_argument("--write", type=Path)
    add_logs_option(parser)
    args = parser.parse_args()
    started = time.perf_counter()
    client_cpus, relay_cpus = split_cpus()
    os.sched_setaffinity(0, client_cpus)
    results: dict[str, str] = {}
    costs: dict[str, list[StreamCost]] = {}
    with logs_dir(args.logs) as logs:

        async def run() -> None:
            async with relay_stack(logs, None, client_cpus, relay_cpus) as paths:
                for transport in args.transport:
                    out = logs / f"profile-{transport}.txt"
                    server = paths.servers["gateway ws" if transport == "ws" else "gateway"]
                    if args.cost_rounds:
                        costs[transport] = await cost_rounds(
                            server, args.concurrency, args.cost_rounds
                        )
                    await profile(server, args.concurrency, args.seconds, out)
                    results[transport] = out.read_text()

        try:
            asyncio.run(run())
        except (RuntimeError, TimeoutError):
            print_log_tails(logs)
            raise
    publish(
        render(results, costs, args.concurrency, args.seconds),
        "gateway-profile",
        args.write,
        started,
    )


if __name__ == "__main__":
    main()
