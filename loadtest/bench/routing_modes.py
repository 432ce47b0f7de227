"""Running and measuring routing modes: the conversations through a gateway, and their figures.

A mode is a way the requests go (through which gateway, naming a session or not); a run of
one sends every conversation of a workload, and counts vLLM's prefix-cache hits over it.
"""

from __future__ import annotations

import asyncio
import random
import secrets
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import aiohttp

from loadtest.bench.conversations import Conversation, turn_messages, workload
from loadtest.bench.harness import (
    Sample,
    Server,
    metric_value,
    metrics_text,
    stream_chat,
    wait_ready,
)
from loadtest.bench.report import median, percentile
from loadtest.bench.routing_stack import LEAST_LOAD, PREFIX_AWARE, wait_for_agents

# Between runs, long enough for each agent's next heartbeat: a run starts with the registry
# showing the agents idle, not with the last run's streams.
SETTLE_SECONDS = 2.5
# Each turn (the first too) follows a think time drawn uniformly up to this: about a cycle of
# the other conversations' turns at the default sizes, so the order they come in is mixed.
THINK_SECONDS_MAX = 2.0
CLIENT_TIMEOUT_SECONDS = 600.0
QUERIED_COUNTER = "spotgate_agent_prefix_cache_queried_tokens_total"
HIT_COUNTER = "spotgate_agent_prefix_cache_hit_tokens_total"


@dataclass(frozen=True)
class Mode:
    """How one mode's requests go: through which gateway, naming a session or not."""

    name: str
    gateway: str
    sessions: bool


MODES = (
    Mode("least load", LEAST_LOAD, sessions=False),
    Mode("explicit sessions", PREFIX_AWARE, sessions=True),
    Mode("prefix-aware", PREFIX_AWARE, sessions=False),
)


@dataclass
class ModeSample(Sample):
    """One run of one mode: the harness's figures plus the prefix cache's."""

    prompt_tokens: list[int] = field(default_factory=list)
    queried_tokens: float = 0.0
    hit_tokens: float = 0.0

    @property
    def hit_rate(self) -> float | None:
        """Prompt tokens found in the prefix cache over those looked up (None: none counted)."""
        return self.hit_tokens / self.queried_tokens if self.queried_tokens > 0 else None


async def cache_counters(
    http: aiohttp.ClientSession, agents: Sequence[Server]
) -> tuple[float, float]:
    """(queried, hit) prefix-cache tokens, summed over the agents."""
    texts = await asyncio.gather(*(metrics_text(http, agent.url) for agent in agents))
    return (
        sum(metric_value(text, QUERIED_COUNTER) for text in texts),
        sum(metric_value(text, HIT_COUNTER) for text in texts),
    )


async def run_mode(
    http: aiohttp.ClientSession,
    gateway: Server,
    agents: Sequence[Server],
    mode: Mode,
    conversations: Sequence[Conversation],
    concurrency: int,
    max_tokens: int,
    via: Callable[[Conversation], Server] | None = None,
) -> ModeSample:
    """Every conversation open at once, `concurrency` requests in flight, turns in order.

    `via`: which server (a gateway, with one key's headers) each conversation talks to.

    A slot is held per request, not per conversation, and each turn follows a think time:
    the other conversations' turns come in between, in no fixed order, as with users. Held
    per conversation, the next turn left at once for the agent it had just freed, then the
    least loaded, so least load stuck to one agent as sessions do and measured nothing.
    """
    sample = ModeSample()
    slots = asyncio.Semaphore(concurrency)

    async def converse(conversation: Conversation) -> None:
        think = random.Random(conversation.session)  # fresh with the text, the same per run
        replies: list[str] = []
        for _turn in conversation.user_turns:
            await asyncio.sleep(think.uniform(0, THINK_SECONDS_MAX))
            messages = turn_messages(conversation, replies)
            user = conversation.session if mode.sessions else None
            try:
                async with slots:
                    server = via(conversation) if via is not None else gateway
                    reply = await stream_chat(http, server, messages, max_tokens, user)
            except (aiohttp.ClientError, TimeoutError):
                sample.failures += 1
                return  # its later turns would carry a history the client never had
            sample.ttfts_seconds.append(reply.ttft_seconds)
            sample.prompt_tokens.append(reply.prompt_tokens)
            sample.total_tokens += reply.completion_tokens
            replies.append(reply.text)

    queried_before, hit_before = await cache_counters(http, agents)
    started = time.perf_counter()
    await asyncio.gather(*(converse(conversation) for conversation in conversations))
    sample.wall_seconds = time.perf_counter() - started
    queried_after, hit_after = await cache_counters(http, agents)
    sample.queried_tokens = queried_after - queried_before
    sample.hit_tokens = hit_after - hit_before
    sample.tokens_per_second = sample.total_tokens / sample.wall_seconds
    return sample


async def warm_up(
    http: aiohttp.ClientSession, gateways: Iterable[Server], agents: Sequence[Server]
) -> None:
    """Every agent and gateway ready, each gateway seeing every agent, then each warmed."""
    for agent in agents:
        await wait_ready(http, agent, "/readyz")
    for gateway in gateways:
        await wait_ready(http, gateway, "/readyz")
        await wait_for_agents(http, gateway, len(agents))
        # Warm the gateway's links and the engines: distinct prompts sent at once, which
        # either routing spreads over the agents.
        warm = workload(secrets.randbits(32), len(agents) * 2, 1)
        await asyncio.gather(
            *(stream_chat(http, gateway, turn_messages(chat, []), 2) for chat in warm)
        )


@dataclass(frozen=True)
class Calibration:
    """An idle agent's TTFT for a long fresh prompt, and for it again with one turn more."""

    fresh_tokens: int
    fresh_ttft_seconds: float
    new_tokens: int
    cached_ttft_seconds: float


async def calibrate(
    http: aiohttp.ClientSession, gateway: Server, turns: int, max_tokens: int
) -> Calibration:
    """Prefill on an idle agent: a conversation's last prompt fresh, then one turn later.

    Both name one session, so they reach the same agent, and the second finds all but its
    last turn in that agent's prefix cache.
    """
    (conversation,) = workload(secrets.randbits(32), 1, turns + 1)
    first = turn_messages(conversation, [""] * (turns - 1))
    fresh = await stream_chat(http, gateway, first, max_tokens, conversation.session)
    second = turn_messages(conversation, [""] * (turns - 1) + [fresh.text])
    cached = await stream_chat(http, gateway, second, max_tokens, conversation.session)
    return Calibration(
        fresh.prompt_tokens,
        fresh.ttft_seconds,
        cached.prompt_tokens - fresh.prompt_tokens,
        cached.ttft_seconds,
    )


async def measure(
    servers: dict[str, Server],
    agents: Sequence[Server],
    runs: int,
    conversations: int,
    turns: int,
    concurrency: int,
    max_tokens: int,
) -> tuple[dict[str, list[ModeSample]], Calibration]:
    """`runs` rounds of every mode, the modes' order rotating from round to round."""
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_SECONDS)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        await warm_up(http, servers.values(), agents)
        calibration = await calibrate(http, servers[PREFIX_AWARE], turns, max_tokens)
        progress(
            f"calibration: {calibration.fresh_tokens} fresh tokens TTFT "
            f"{calibration.fresh_ttft_seconds * 1000:.0f} ms; {calibration.new_tokens} more on "
            f"the cached prefix {calibration.cached_ttft_seconds * 1000:.0f} ms"
        )
        results: dict[str, list[ModeSample]] = {mode.name: [] for mode in MODES}
        for run in range(runs):
            # Rotated, so no mode always runs first (or after the same one).
            for mode in MODES[run % len(MODES) :] + MODES[: run % len(MODES)]:
                await asyncio.sleep(SETTLE_SECONDS)
                chats = workload(secrets.randbits(32), conversations, turns)
                sample = await run_mode(
                    http, servers[mode.gateway], agents, mode, chats, concurrency, max_tokens
                )
                results[mode.name].append(sample)
                progress(f"run {run + 1}/{runs} {mode.name}: {summary(sample)}")
        return results, calibration


def summary(sample: ModeSample) -> str:
    """One run's figures on one line, for progress."""
    rate = sample.hit_rate
    ttfts = sample.ttfts_seconds or [float("nan")]
    return (
        f"{len(sample.ttfts_seconds)} requests in {sample.wall_seconds:.1f} s, "
        f"hit rate {'n/a' if rate is None else f'{rate:.0%}'}, "
        f"TTFT p50 {percentile(ttfts, 0.5) * 1000:.0f} ms, "
        f"{sample.tokens_per_second:.0f} tok/s, {sample.failures} failures"
    )


def progress(line: str) -> None:
    """A line on stderr, at once: stdout carries the report."""
    print(line, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class ModeStats:
    """One row of the table: a mode over all its runs."""

    hit_rate: float | None  # median over runs; None: the agents counted no lookups
    hit_rates: tuple[float | None, ...]
    ttft_p50_ms: float
    ttft_p99_ms: float
    tokens_per_second: float
    requests: int
    failures: int


def mode_stats(samples: Sequence[ModeSample]) -> ModeStats:
    """Medians over runs (hit rate, tokens/s) and TTFT quantiles over every request."""
    ttfts = [t for sample in samples for t in sample.ttfts_seconds] or [float("nan")]
    rates = tuple(sample.hit_rate for sample in samples)
    counted = [rate for rate in rates if rate is not None]
    return ModeStats(
        hit_rate=median(counted) if counted else None,
        hit_rates=rates,
        ttft_p50_ms=percentile(ttfts, 0.5) * 1000,
        ttft_p99_ms=percentile(ttfts, 0.99) * 1000,
        tokens_per_second=median([sample.tokens_per_second for sample in samples]),
        requests=sum(len(sample.ttfts_seconds) for sample in samples),
        failures=sum(sample.failures for sample in samples),
    )


def percent(rate: float | None) -> str:
    """A hit rate as a report shows it; a dash where none was counted."""
    return "—" if rate is None else f"{rate:.1%}"


def stats_table(stats: dict[str, ModeStats]) -> list[str]:
    """The Markdown table of the modes' figures: a row per mode, in the order given."""
    lines = [
        "| mode | prefix-cache hit rate (median) | per run | TTFT p50 ms | TTFT p99 ms "
        "| output tok/s (median) | requests | failures |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, row in stats.items():
        per_run = ", ".join(percent(rate) for rate in row.hit_rates)
        lines.append(
            f"| {name} | {percent(row.hit_rate)} | {per_run} | {row.ttft_p50_ms:.0f} "
            f"| {row.ttft_p99_ms:.0f} | {row.tokens_per_second:,.1f} | {row.requests} "
            f"| {row.failures} |"
        )
    return lines
