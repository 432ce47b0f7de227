"""The gateway's cost: clients direct to an agent, through our gateway, through LiteLLM.

    python -m loadtest.bench.gateway_relay [--litellm PATH] [--runs 3] [--max-tokens 32]
                                           [--concurrency 1 100 1000] [--paths PATH ...]
                                           [--write FILE]

One agent with the **synthetic engine** (fixed TTFT and rate, so the engine adds no noise)
serves all three paths side by side: (a) its own OpenAI endpoint, (b) our gateway in front
of it, (c) LiteLLM's proxy (from its own virtualenv, `--litellm` names its `litellm` binary)
in front of the same endpoint. Runs alternate between the paths. Reported per path and
concurrency: output tokens/s, TTFT p50/p99 and what the path adds to them over direct, and
relayed tokens per CPU-second of the relay process (the gateway's or LiteLLM's).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from loadtest.bench.harness import (
    CLIENT_KEEPALIVE_SECONDS,
    Sample,
    alternating_runs,
    bucket_quantile,
    split_cpus,
    wait_ready,
    warmed,
)
from loadtest.bench.relay_stack import (
    LITELLM_READY_PATH,
    TOKENS_PER_SECOND,
    TTFT_SECONDS,
    RelayPaths,
    relay_stack,
)
from loadtest.bench.report import machine_facts, median, percentile, write_section
from loadtest.bench.workdir import add_logs_option, logs_dir, print_log_tails
from spotgate.settings import TOKEN_TTL_MAX_SECONDS

MAX_REQUESTS_PER_CLIENT = 20
"""The most completions one client streams back to back in a run (at 1 stream: ~13 s)."""
MIN_REQUESTS_PER_CLIENT = 5
"""The fewest: four of a run's five stream lengths are in steady state (at 1000: 5,000 streams)."""
COMMAND = (
    "python -m loadtest.bench.gateway_relay --litellm .bench/litellm/bin/litellm "
    "--write docs/benchmarks.md"
)
PATHS = (
    "direct",
    "gateway",
    "litellm",
    "direct ws",
    "gateway ws",
    "direct ws, own sockets",
    "gateway ws, own sockets",
)


async def measure_on_stack(
    logs: Path,
    litellm: Path | None,
    client_cpus: set[int],
    relay_cpus: set[int],
    args: argparse.Namespace,
) -> dict[tuple[str, int], list[Sample]]:
    """Start the stack, measure it, stop it."""
    async with relay_stack(logs, litellm, client_cpus, relay_cpus) as paths:
        return await measure(
            paths, args.concurrency, args.runs, args.max_tokens, frozenset(args.paths)
        )


async def measure(
    paths: RelayPaths,
    concurrencies: list[int],
    runs: int,
    max_tokens: int,
    chosen_paths: frozenset[str] = frozenset(PATHS),
) -> dict[tuple[str, int], list[Sample]]:
    """Alternate runs between the paths (those of `chosen_paths`) at each concurrency."""
    servers = paths.servers
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=CLIENT_KEEPALIVE_SECONDS)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        await wait_ready(http, servers["direct"], "/readyz")
        await wait_ready(http, servers["gateway"], "/readyz")
        if "litellm" in servers:
            await wait_ready(http, servers["litellm"], LITELLM_READY_PATH)
        chosen = [server for name, server in servers.items() if name in chosen_paths]
        for server in chosen:  # warm every path before timing
            await warmed(http, server)
        return await alternating_runs(
            http,
            chosen,
            concurrencies,
            runs,
            max_tokens,
            requests_per_client,
            stream_seconds(max_tokens),
            functools.partial(paths.before_run, http),
        )


TOKENS_PER_CPU_SECOND_GOAL = {"sse": 50_000, "ws": 100_000}
"""The relay's goal at 1000 streams of 32-token replies: relayed tokens per gateway CPU-second."""


def requests_per_client(concurrency: int) -> int:
    """Enough streams per client for ~1000 TTFT samples per path and run, and a steady state.

    Each client streams at least `MIN_REQUESTS_PER_CLIENT` replies back to back: the first
    stream's length is the arrival ramp, the others run at the stated concurrency.
    """
    return max(MIN_REQUESTS_PER_CLIENT, min(MAX_REQUESTS_PER_CLIENT, 1000 // concurrency))


def stream_seconds(max_tokens: int) -> float:
    """How long one stream lasts on an idle synthetic engine."""
    return TTFT_SECONDS + (max_tokens - 1) / TOKENS_PER_SECOND


@dataclass(frozen=True)
class PathStats:
    """One row of the table: a path at one concurrency, over all its runs."""

    tokens_per_second: float
    ttft_ms: tuple[float, float]
    added_ms: tuple[float, float] | None  # None: the baseline row
    own_ms: tuple[float, float] | None  # the gateway's histogram (bucket bounds)
    tokens_per_relay_cpu_second: float | None
    tokens_per_chunk: float  # tokens per message that carried text, as the client got them
    failures: int
    samples: int
    failure_kinds: dict[str, int] = field(default_factory=dict)
    added_p99_per_run_ms: tuple[float, ...] = ()  # run i against the baseline's run i
    tokens_per_relay_cpu_second_per_run: tuple[float, ...] = ()  # run by run, in run order


def path_stats(
    results: dict[tuple[str, int], list[Sample]], concurrency: int, paths: list[str]
) -> dict[str, PathStats]:
    """Each path's figures at `concurrency`; *added* against the direct path above it."""
    stats: dict[str, PathStats] = {}
    base: tuple[float, float] | None = None
    base_samples: list[Sample] = []
    for path in paths:
        if path.startswith("direct"):
            base = None  # each kind of row compares with its own direct path
        samples = results[(path, concurrency)]
        ttfts = [t for sample in samples for t in sample.ttfts_seconds] or [0.0]
        ttft = (percentile(ttfts, 0.5) * 1000, percentile(ttfts, 0.99) * 1000)
        own = None
        if samples[0].added_ttft_buckets:
            merged: dict[float, float] = {}
            for sample in samples:
                for bound, count in sample.added_ttft_buckets.items():
                    merged[bound] = merged.get(bound, 0.0) + count
            own = (bucket_quantile(merged, 0.5) * 1000, bucket_quantile(merged, 0.99) * 1000)
        added = per_cpu = None
        per_run: tuple[float, ...] = ()
        per_cpu_per_run: tuple[float, ...] = ()
        if base is None:
            base, base_samples = ttft, samples
        else:
            added = (ttft[0] - base[0], ttft[1] - base[1])
            per_run = tuple(
                (_p99(ours.ttfts_seconds) - _p99(theirs.ttfts_seconds)) * 1000
                for ours, theirs in zip(samples, base_samples, strict=True)
                if ours.ttfts_seconds and theirs.ttfts_seconds
            )
            cpu = sum(sample.server_cpu_seconds for sample in samples)
            tokens = sum(sample.total_tokens for sample in samples)
            per_cpu = tokens / cpu if cpu > 0 else None
            per_cpu_per_run = tuple(
                sample.total_tokens / sample.server_cpu_seconds
                for sample in samples
                if sample.server_cpu_seconds > 0
            )
        stats[path] = PathStats(
            tokens_per_second=median([sample.tokens_per_second for sample in samples]),
            ttft_ms=ttft,
            added_ms=added,
            own_ms=own,
            tokens_per_relay_cpu_second=per_cpu,
            tokens_per_chunk=sum(sample.total_tokens for sample in samples)
            / max(1, sum(sample.chunks for sample in samples)),
            failures=sum(sample.failures for sample in samples),
            failure_kinds=dict(sum((sample.failure_kinds for sample in samples), Counter())),
            samples=sum(len(sample.ttfts_seconds) for sample in samples),
            added_p99_per_run_ms=per_run,
            tokens_per_relay_cpu_second_per_run=per_cpu_per_run,
        )
    return stats


def _p99(values: list[float]) -> float:
    return percentile(values, 0.99)


def _row(concurrency: int, path: str, row: PathStats) -> str:
    added = ("—", "—") if row.added_ms is None else tuple(f"{v:+.1f}" for v in row.added_ms)
    own = "—" if row.own_ms is None else f"≤ {row.own_ms[0]:g} / ≤ {row.own_ms[1]:g}"
    per_cpu = row.tokens_per_relay_cpu_second
    return (
        f"| {concurrency} | {path} | {row.tokens_per_second:,.0f} | {row.samples:,} "
        f"| {row.ttft_ms[0]:.1f} | {row.ttft_ms[1]:.1f} | {added[0]} | {added[1]} | {own} "
        f"| {'—' if per_cpu is None else f'{per_cpu:,.0f}'} | {row.tokens_per_chunk:.2f} "
        f"| {row.failures}{_kinds(row.failure_kinds)} |"
    )


def _kinds(kinds: dict[str, int]) -> str:
    """The failures by kind (`failure_kind`), most first: " (598 timeout, 1 HTTP 500)"."""
    if not kinds:
        return ""
    ranked = sorted(kinds.items(), key=lambda kind: -kind[1])
    return " (" + ", ".join(f"{count:,} {kind}" for kind, count in ranked) + ")"


def _lower_by(ours: float, theirs: float) -> str:
    if ours <= 0:
        return f"ours {ours:+.1f} ms (nothing added) vs {theirs:+.1f} ms"
    return f"{ours:+.1f} vs {theirs:+.1f} ms: {theirs / ours:.1f}× lower"


def goal_lines(stats: dict[int, dict[str, PathStats]]) -> list[str]:
    """The goals, each judged from the table's own figures."""
    lines = ["Goals, from the rows above:", ""]
    if 100 in stats and {"gateway ws", "gateway"} <= stats[100].keys():
        ws, sse = stats[100]["gateway ws"], stats[100]["gateway"]
        if ws.added_ms is not None and ws.own_ms is not None and sse.own_ms is not None:
            runs = ", ".join(f"{value:+.1f}" for value in ws.added_p99_per_run_ms)
            per_run = median(ws.added_p99_per_run_ms) if ws.added_p99_per_run_ms else 0.0
            lines.append(
                f"- added TTFT p99 ≤ 5 ms at 100 streams: websocket end to end "
                f"**{ws.added_ms[1]:+.1f} ms** over all samples; run by run against the direct "
                f"run beside it {runs} ms (median **{per_run:+.1f} ms**); the gateway's own "
                f"p99 ≤ {ws.own_ms[1]:g} ms (websocket), ≤ {sse.own_ms[1]:g} ms (SSE)."
            )
    if 1000 in stats:
        for label, direct, gateway, per_cpu_goal in (
            ("SSE", "direct", "gateway", TOKENS_PER_CPU_SECOND_GOAL["sse"]),
            ("websocket", "direct ws", "gateway ws", TOKENS_PER_CPU_SECOND_GOAL["ws"]),
            (
                "websocket, a socket per client",
                "direct ws, own sockets",
                "gateway ws, own sockets",
                TOKENS_PER_CPU_SECOND_GOAL["ws"],
            ),
        ):
            if gateway in stats[1000] and direct in stats[1000]:
                ours, theirs = stats[1000][gateway], stats[1000][direct]
                share = ours.tokens_per_second / theirs.tokens_per_second
                per_cpu = ours.tokens_per_relay_cpu_second or 0.0
                own_p99 = "—" if ours.own_ms is None else f"≤ {ours.own_ms[1]:g} ms"
                lines.append(
                    f"- at 1000 streams ({label}): relayed tokens per gateway CPU-second "
                    f"≥ {per_cpu_goal:,}: **{per_cpu:,.0f}** ({_met(per_cpu >= per_cpu_goal)})"
                    f"{_run_by_run(ours.tokens_per_relay_cpu_second_per_run)}; "
                    f"throughput ≥ 95 % of direct: {ours.tokens_per_second:,.0f} vs "
                    f"{theirs.tokens_per_second:,.0f} tok/s, **{share:.0%}** "
                    f"({_met(share >= 0.95)}); the gateway's own added TTFT p99 ≤ 10 ms: "
                    f"**{own_p99}** ({_met(ours.own_ms is not None and ours.own_ms[1] <= 10)})."
                )
    for concurrency, rows in stats.items():
        relayed, litellm = rows.get("gateway"), rows.get("litellm")
        gateway_added = None if relayed is None else relayed.added_ms
        if gateway_added is None or litellm is None or litellm.added_ms is None:
            continue
        lines.append(
            f"- ≥ 5× lower added TTFT than LiteLLM at {concurrency} "
            f"stream{'' if concurrency == 1 else 's'} (SSE): p50 "
            f"{_lower_by(gateway_added[0], litellm.added_ms[0])}; p99 "
            f"{_lower_by(gateway_added[1], litellm.added_ms[1])}."
        )
    return lines


def _run_by_run(per_run: tuple[float, ...]) -> str:
    """A figure's runs, in run order, with their median and worst: the table's is over all."""
    if len(per_run) < 2:
        return ""
    runs = ", ".join(f"{value:,.0f}" for value in per_run)
    return f", run by run {runs} (median {median(per_run):,.0f}, worst {min(per_run):,.0f})"


def _met(met: bool) -> str:
    return "met" if met else "not met"


def render(
    results: dict[tuple[str, int], list[Sample]],
    concurrencies: list[int],
    runs: int,
    max_tokens: int,
    paths: list[str],
) -> str:
    """The Markdown section for `docs/benchmarks.md`."""
    lines = [
        "## Gateway relay: direct to the agent vs our gateway vs LiteLLM (synthetic engine)",
        "",
        f"Command: `{COMMAND}`.",
        f"Engine: **synthetic** ({TOKENS_PER_SECOND:.0f} tokens/s per stream, TTFT "
        f"{TTFT_SECONDS * 1000:.0f} ms); streamed chat completions of {max_tokens} tokens; "
        f"{runs} alternating runs per path and concurrency. Clients arrive staggered over one "
        f"stream's length and each streams {MIN_REQUESTS_PER_CLIENT} to "
        f"{MAX_REQUESTS_PER_CLIENT} completions back to back, so the streams are in steady "
        "state at the stated concurrency (*TTFT samples*: over all runs; at 1 stream the p99 "
        "is close to the slowest sample; a failed request, which the client's 600-second "
        "timeout or a refusal ended, gives none). "
        "Client and agent are pinned to one half of the CPUs, the relay under test (gateway "
        "or LiteLLM) to the other, as a relay has its own CPUs in a deployment. Before each "
        "run the direct paths get a fresh token to the agent (a token lives at most "
        f"{TOKEN_TTL_MAX_SECONDS // 60} minutes) and LiteLLM's proxy is restarted with one, "
        f"then warmed. Clients keep an idle connection {CLIENT_KEEPALIVE_SECONDS:g} s, less "
        "than any server under test (LiteLLM's closes one after 5 s), so none is reset as "
        "it is reused.",
        f"Machine: {machine_facts(['aiohttp'])}.",
        "",
        "| streams | path | tok/s (median) | TTFT samples | TTFT p50 ms | TTFT p99 ms "
        "| added p50 ms | added p99 ms | gateway's own p50 / p99 ms "
        "| relayed tok per relay CPU-s | tok per chunk | failures |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    stats = {c: path_stats(results, c, paths) for c in concurrencies}
    for concurrency, rows in stats.items():
        lines += [_row(concurrency, path, row) for path, row in rows.items()]
    lines += [
        "",
        "*added*: the path's TTFT minus that of the direct path above it at the same "
        "concurrency. Over HTTP, direct means the agent serves every SSE stream itself, next "
        "to the client on the same CPUs, while through the gateway the agent serves one "
        "multiplexed websocket and the gateway the SSE streams on its own CPUs, so *added* can "
        "be negative. The *ws* rows give the agent and the client the same work on both paths "
        "and isolate the extra hop: a run's streams share one client websocket, as one client "
        "multiplexing its streams sends them, so the gateway writes a turn's tokens to it in "
        "one system call. In the *ws, own sockets* rows each client has a websocket of its "
        "own, as browsers and most clients do, so each token is a write of its own, as over "
        "SSE; direct, the agent serves each client's socket itself, as over HTTP, on the CPUs "
        "it shares with the client. *gateway's own*: its "
        "`spotgate_gateway_added_ttft_seconds` histogram over the same runs (bucket upper "
        "bounds): request to agent, plus agent's first token to the client's writer. "
        "*tok per chunk*: completion tokens per message that carried text (an SSE chunk, a "
        "websocket `delta`) as the client got them; above 1 where a client fell behind and "
        "its deltas were merged.",
        "",
        *goal_lines(stats),
    ]
    return "\n".join(lines)


def main() -> None:
    """Run the comparison and print (and optionally write) the table."""
    parser = argparse.ArgumentParser(description="direct vs gateway vs LiteLLM")
    parser.add_argument("--litellm", type=Path, help="the litellm binary of its own virtualenv")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 100, 1000])
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    parser.add_argument("--write", type=Path)
    add_logs_option(parser)
    args = parser.parse_args()
    litellm = args.litellm if args.litellm and args.litellm.exists() else None
    client_cpus, relay_cpus = split_cpus()
    os.sched_setaffinity(0, client_cpus)
    with logs_dir(args.logs) as logs:
        try:
            results = asyncio.run(measure_on_stack(logs, litellm, client_cpus, relay_cpus, args))
        except (RuntimeError, TimeoutError):
            print_log_tails(logs)
            raise
    paths = [path for path in PATHS if (path, args.concurrency[0]) in results]
    section = render(results, args.concurrency, args.runs, args.max_tokens, paths)
    if litellm is None:
        section += "\n\nLiteLLM was not run (no `--litellm` binary given)."
    print(section)
    if args.write:
        write_section(args.write, "gateway-relay", section)


if __name__ == "__main__":
    main()
