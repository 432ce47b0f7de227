"""The gateway's cost: clients direct to an agent, through our gateway, through LiteLLM.

    python -m loadtest.bench.gateway_relay [--litellm PATH] [--runs 3] [--max-tokens 32]
                                           [--concurrency 1 100 1000] [--write FILE]

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
import contextlib
import os
import secrets
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp

from loadtest.bench.harness import (
    Sample,
    Server,
    alternating_runs,
    bucket_quantile,
    print_log_tails,
    spawn,
    split_cpus,
    timed_run,
    wait_ready,
)
from loadtest.bench.report import machine_facts, median, percentile, write_section
from spotgate.emulator import AwsEmulator
from spotgate.process import free_port
from spotgate.registry import Registry
from spotgate.tokens import GATEWAY_SUBJECT_PREFIX, KeyRing, SigningKey, issue

MODEL = "synth"
TOKENS_PER_SECOND = 50.0
TTFT_SECONDS = 0.05
AGENT_CAPACITY = 4096
COMMAND = (
    "python -m loadtest.bench.gateway_relay --litellm .bench/litellm/bin/litellm "
    "--write docs/benchmarks.md"
)
ADDED_TTFT_HISTOGRAM = "spotgate_gateway_added_ttft_seconds"
PATHS = ("direct", "gateway", "litellm", "direct ws", "gateway ws")


def _aws_env(aws: AwsEmulator) -> dict[str, str]:
    return {
        **os.environ,
        "SPOTGATE_AWS__ENDPOINT_URL": aws.url,
        "SPOTGATE_AWS__REGION": aws.settings().aws.region,
        "SPOTGATE_AWS__ACCESS_KEY_ID": "local",
        "SPOTGATE_AWS__SECRET_ACCESS_KEY": "local",
        "SPOTGATE_LOG_LEVEL": "warning",
    }


@contextlib.contextmanager
def _stack(
    logs: Path, litellm: Path | None, client_cpus: set[int], relay_cpus: set[int]
) -> Iterator[dict[str, Server]]:
    aws = AwsEmulator()
    aws.start()
    key = SigningKey.generate()
    gateway_port, agent_port = free_port(), free_port()
    gateway_url = f"http://127.0.0.1:{gateway_port}"
    agent_url = f"http://127.0.0.1:{agent_port}"
    api_key = asyncio.run(_prepare(aws))
    # A gateway's token: the direct websocket client multiplexes like a gateway does.
    agent_token = issue(
        KeyRing([key]),
        subject=f"{GATEWAY_SUBJECT_PREFIX}bench",
        issuer=gateway_url,
        now=time.time(),
        ttl_seconds=900,
    ).token
    servers: dict[str, Server] = {}
    try:
        agent = spawn(
            [sys.executable, "-m", "spotgate.cli", "agent"],
            logs / "agent.log",
            {
                **_aws_env(aws),
                "SPOTGATE_AGENT_ENGINE": "synthetic",
                "SPOTGATE_AGENT_SERVED_MODEL_NAME": MODEL,
                "SPOTGATE_AGENT_PORT": str(agent_port),
                "SPOTGATE_AGENT_PINNED_PUBLIC_KEY": key.verify_key.to_pem(),
                "SPOTGATE_AGENT_TOKEN_ISSUER": gateway_url,
                "SPOTGATE_AGENT_IMDS_URL": "http://127.0.0.1:9",
                "SPOTGATE_AGENT_SYNTHETIC__TOKENS_PER_SECOND": str(TOKENS_PER_SECOND),
                "SPOTGATE_AGENT_SYNTHETIC__TTFT_SECONDS": str(TTFT_SECONDS),
                "SPOTGATE_AGENT_SYNTHETIC__CAPACITY": str(AGENT_CAPACITY),
            },
            client_cpus,
        )
        agent_auth = {"Authorization": f"Bearer {agent_token}"}
        servers["direct"] = Server("direct", agent_url, agent_auth, agent, MODEL)
        servers["direct ws"] = Server("direct ws", agent_url, agent_auth, agent, MODEL, "ws")
        gateway = spawn(
            [sys.executable, "-m", "spotgate.cli", "gateway"],
            logs / "gateway.log",
            {
                **_aws_env(aws),
                "SPOTGATE_GATEWAY_PORT": str(gateway_port),
                "SPOTGATE_GATEWAY_PUBLIC_URL": gateway_url,
                "SPOTGATE_GATEWAY_TOKEN__SIGNING_KEY_PEM": key.to_pem(),
                "SPOTGATE_GATEWAY_LIMITS__MAX_STREAMS_PER_CONNECTION": str(AGENT_CAPACITY),
                "SPOTGATE_GATEWAY_MAX_STREAMS_PER_KEY": str(AGENT_CAPACITY),
            },
            relay_cpus,
        )
        gateway_auth = {"Authorization": f"Bearer {api_key}"}
        servers["gateway"] = Server(
            "gateway", gateway_url, gateway_auth, gateway, MODEL, "sse", ADDED_TTFT_HISTOGRAM
        )
        servers["gateway ws"] = Server(
            "gateway ws", gateway_url, gateway_auth, gateway, MODEL, "ws", ADDED_TTFT_HISTOGRAM
        )
        if litellm is not None:
            port = free_port()
            config = logs / "litellm.yaml"
            master_key = f"sk-{secrets.token_hex(16)}"
            config.write_text(
                f"general_settings:\n  master_key: {master_key}\n"
                "model_list:\n"
                f"  - model_name: {MODEL}\n"
                "    litellm_params:\n"
                f"      model: openai/{MODEL}\n"
                f"      api_base: {agent_url}/v1\n"
                f"      api_key: {agent_token}\n"
            )
            proxy = spawn(
                [str(litellm), "--config", str(config), "--port", str(port),
                 "--host", "127.0.0.1", "--num_workers", "1"],
                logs / "litellm.log",
                {**os.environ, "LITELLM_LOG": "ERROR"},
                relay_cpus,
            )  # fmt: skip
            servers["litellm"] = Server(
                "litellm",
                f"http://127.0.0.1:{port}",
                {"Authorization": f"Bearer {master_key}"},
                proxy,
                MODEL,
            )
        yield servers
    finally:
        processes = {server.process.pid: server.process for server in servers.values()}
        for process in processes.values():
            process.terminate()
        for process in processes.values():
            with contextlib.suppress(Exception):
                process.wait(timeout=30)
        aws.stop()


async def _prepare(aws: AwsEmulator) -> str:
    async with Registry.open(aws.settings()) as registry:
        await registry.create_tables()
        return (await registry.create_key("bench")).api_key


async def measure(
    servers: dict[str, Server], concurrencies: list[int], runs: int, max_tokens: int
) -> dict[tuple[str, int], list[Sample]]:
    """Alternate runs between the paths at each concurrency."""
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        await wait_ready(http, servers["direct"], "/readyz")
        await wait_ready(http, servers["gateway"], "/readyz")
        if "litellm" in servers:
            await wait_ready(http, servers["litellm"], "/health/liveliness")
        for server in servers.values():  # warm every path (links, pools) before timing
            for _ in range(30):
                with contextlib.suppress(aiohttp.ClientError):
                    await timed_run(http, server, 2, 1, 4)
                    break
                await asyncio.sleep(0.5)
        return await alternating_runs(
            http,
            list(servers.values()),
            concurrencies,
            runs,
            max_tokens,
            requests_per_client,
            stream_seconds(max_tokens),
        )


def requests_per_client(concurrency: int) -> int:
    """Enough streams per client for steady state and a p99 over ≥ 1000 samples per path."""
    return max(1, min(20, 1000 // concurrency))


def stream_seconds(max_tokens: int) -> float:
    """How long one stream lasts on an idle synthetic engine."""
    return TTFT_SECONDS + (max_tokens - 1) / TOKENS_PER_SECOND


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
        "stream's length and each streams up to 20 completions back to back, so the streams "
        "are in steady state at the stated concurrency (≥ 1000 TTFT samples per path and "
        "run, 1000 at 1000 streams). Client and agent are pinned to one half of the CPUs, "
        "the relay under test (gateway or LiteLLM) to the other, as a relay has its own "
        "CPUs in a deployment.",
        f"Machine: {machine_facts(['aiohttp'])}.",
        "",
        "| streams | path | tok/s (median) | TTFT p50 ms | TTFT p99 ms | added p50 ms "
        "| added p99 ms | gateway's own p50 / p99 ms | relayed tok per relay CPU-s | failures |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for concurrency in concurrencies:
        base = None
        for path in paths:
            if path == "direct ws":
                base = None  # websocket rows compare with the direct websocket
            samples = results[(path, concurrency)]
            ttfts = [t for sample in samples for t in sample.ttfts_seconds] or [0.0]
            p50, p99 = percentile(ttfts, 0.5) * 1000, percentile(ttfts, 0.99) * 1000
            rate = median([sample.tokens_per_second for sample in samples])
            failures = sum(sample.failures for sample in samples)
            own = "—"
            if samples[0].added_ttft_buckets:
                merged: dict[float, float] = {}
                for sample in samples:
                    for bound, count in sample.added_ttft_buckets.items():
                        merged[bound] = merged.get(bound, 0.0) + count
                own = (
                    f"≤ {bucket_quantile(merged, 0.5) * 1000:g} / "
                    f"≤ {bucket_quantile(merged, 0.99) * 1000:g}"
                )
            if base is None:
                base = (p50, p99)
                added = ("—", "—")
                per_cpu = "—"
            else:
                added = (f"{p50 - base[0]:+.1f}", f"{p99 - base[1]:+.1f}")
                tokens = sum(sample.total_tokens for sample in samples)
                cpu = sum(sample.server_cpu_seconds for sample in samples)
                per_cpu = f"{tokens / cpu:,.0f}" if cpu > 0 else "—"
            lines.append(
                f"| {concurrency} | {path} | {rate:,.0f} | {p50:.1f} | {p99:.1f} | {added[0]} "
                f"| {added[1]} | {own} | {per_cpu} | {failures} |"
            )
    lines += [
        "",
        "*added*: the path's TTFT minus direct's at the same concurrency (websocket rows: minus "
        "direct ws). Over HTTP, direct means the agent serves every SSE stream itself, next to "
        "the client on the same CPUs, while through the gateway the agent serves one "
        "multiplexed websocket and the gateway the SSE streams on its own CPUs, so *added* can "
        "be negative. The websocket rows give the agent and the client the same work on both "
        "paths and isolate the extra hop. *gateway's own*: its "
        "`spotgate_gateway_added_ttft_seconds` histogram over the same runs (bucket upper "
        "bounds): request to agent, plus agent's first token to the client's writer.",
    ]
    return "\n".join(lines)


def main() -> None:
    """Run the comparison and print (and optionally write) the table."""
    parser = argparse.ArgumentParser(description="direct vs gateway vs LiteLLM")
    parser.add_argument("--litellm", type=Path, help="the litellm binary of its own virtualenv")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 100, 1000])
    parser.add_argument("--write", type=Path)
    args = parser.parse_args()
    litellm = args.litellm if args.litellm and args.litellm.exists() else None
    client_cpus, relay_cpus = split_cpus()
    os.sched_setaffinity(0, client_cpus)
    with tempfile.TemporaryDirectory(prefix="spotgate-bench-") as scratch:
        logs = Path(scratch)
        try:
            with _stack(logs, litellm, client_cpus, relay_cpus) as servers:
                results = asyncio.run(
                    measure(servers, args.concurrency, args.runs, args.max_tokens)
                )
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
