"""What routing costs the registry: gateways scanning the agents table vs reading its change feed.

    python -m loadtest.bench.registry_reads [--agents 1000] [--gateways 8] [--seconds 60]
        [--runs 2] [--write docs/benchmarks.md]

Each gateway keeps a view of the pool for routing, refreshed every `REFRESH_SECONDS`. Before,
each one scanned the whole agents table every time; now each reads the `by_change` index,
which holds only what routing reads, for what changed since a little before the newest change
it has seen (and the whole index every `WHOLE_READ_SECONDS`). The benchmark runs both, one
after the other and `--runs` times each, on the AWS emulator (moto's server, in a process of
its own): `--agents` agents registered and heartbeating every `HEARTBEAT_SECONDS` (with their
load changing), `--gateways` readers refreshing concurrently, and an agent drained every
`DRAIN_EVERY_SECONDS`.

The emulator does not charge reads, so read request units are counted by DynamoDB's published
rules from what each request returned: a query or scan page costs 0.5 units per 4 KB started
(eventually consistent), measured on the items it read, with the item sizes DynamoDB uses
(attribute names plus values). *Routing staleness* is how long after a drain's write returns
each gateway's view holds the agent as draining: DESIGN asks for at most 1 s.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import sys
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import uvloop

from gateway.dispatch import Dispatcher, PoolView
from loadtest.bench.report import machine_facts, percentile, write_section
from spotgate.registry import AgentRecord, AgentState, Registry
from spotgate.settings import QueueSettings, emulator_settings
from stack.emulator import EMULATOR_REGION

COMMAND = "python -m loadtest.bench.registry_reads --write docs/benchmarks.md"
REFRESH_SECONDS = 0.5  # the gateway's default `registry_refresh_seconds`
HEARTBEAT_SECONDS = 5.0  # the agent's default `heartbeat_seconds`
DRAIN_EVERY_SECONDS = 3.0
MODELS = ("meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen3-8B", "google/gemma-3-12b-it")
STALENESS_GOAL_SECONDS = 1.0
READ_UNIT_BYTES = 4096
EVENTUAL_READ_UNITS = 0.5
PATHS = ("scan the table", "change feed")


@dataclass
class PathResult:
    """One read path over every run."""

    seconds: float = 0.0
    read_units: float = 0.0
    requests: int = 0
    items: int = 0
    read_latency: list[float] = field(default_factory=list)
    staleness: list[float] = field(default_factory=list)
    heartbeats: int = 0
    drains: int = 0
    missed: int = 0
    """Drains some gateway never saw before its run ended."""


def attribute_bytes(value: dict[str, Any]) -> int:
    """An attribute value's size as DynamoDB counts it."""
    if "S" in value:
        return len(value["S"].encode())
    if "N" in value:
        digits = Decimal(value["N"]).normalize().as_tuple().digits
        return 1 + math.ceil(len(digits) / 2)
    if "BOOL" in value or "NULL" in value:
        return 1
    if "SS" in value:
        return sum(len(item.encode()) for item in value["SS"])
    raise ValueError(f"unexpected attribute {sorted(value)}")


def item_bytes(item: dict[str, dict[str, Any]]) -> int:
    """An item's size as DynamoDB counts it: each attribute's name and value."""
    return sum(len(name.encode()) + attribute_bytes(value) for name, value in item.items())


def page_read_units(items: list[dict[str, dict[str, Any]]], scanned: int) -> float:
    """What one eventually consistent query or scan page costs, from the items it returned.

    A scan is charged for every item it read, the filtered-out ones too: `scanned` counts them
    (their size taken as the mean of those returned).
    """
    size = sum(item_bytes(item) for item in items)
    if items and scanned > len(items):
        size = size * scanned // len(items)
    return max(1, math.ceil(size / READ_UNIT_BYTES)) * EVENTUAL_READ_UNITS


class Meter:
    """Counts a registry client's reads of the agents table (an `after-call` hook)."""

    def __init__(self, into: PathResult) -> None:
        self._into = into

    def __call__(self, *, parsed: dict[str, Any], model: Any, **_: Any) -> None:
        """Charge one Query or Scan response."""
        if model.name not in ("Query", "Scan"):
            return
        items = parsed.get("Items", [])
        self._into.requests += 1
        self._into.items += len(items)
        self._into.read_units += page_read_units(items, parsed.get("ScannedCount", len(items)))


class WatchingView(PoolView):
    """A gateway's view that notes when it first holds each drained agent as draining."""

    def __init__(self, drains: dict[str, float], into: PathResult) -> None:
        super().__init__()
        self._drains = drains
        self._seen: set[str] = set()
        self._into = into

    def update(self, changes: list[AgentRecord], now: float) -> None:
        """Install the read, then time every drain it shows for the first time."""
        super().update(changes, now)
        seen_at = time.time()
        for agent_id, written_at in list(self._drains.items()):
            entry = self.entries.get(agent_id)
            if agent_id not in self._seen and entry and entry.state is AgentState.DRAINING:
                self._seen.add(agent_id)
                self._into.staleness.append(seen_at - written_at)

    def unseen(self) -> int:
        """Drains this view has not shown."""
        return len(set(self._drains) - self._seen)


async def _scan_forever(registry: Registry, view: PoolView, into: PathResult) -> None:
    """The read path before the change feed: the whole table, every refresh."""
    while True:
        started = time.perf_counter()
        records = await registry.list_agents()
        into.read_latency.append(time.perf_counter() - started)
        view.replace(records, time.time())
        await asyncio.sleep(REFRESH_SECONDS)


class TimedRegistry:
    """The registry as the dispatcher sees it, timing each read of the feed."""

    def __init__(self, registry: Registry, into: PathResult) -> None:
        self._registry = registry
        self._into = into

    async def changed_since(self, since: float | None) -> list[AgentRecord]:
        """The registry's answer, timed."""
        started = time.perf_counter()
        records = await self._registry.changed_since(since)
        self._into.read_latency.append(time.perf_counter() - started)
        return records


def _agent(index: int) -> AgentRecord:
    return AgentRecord(
        agent_id=f"i-{index:017x}",
        url=f"ws://10.0.{index // 250}.{index % 250}:8000/v1/stream",
        model=MODELS[index % len(MODELS)],
        state=AgentState.READY,
        capacity=32,
        lifecycle="spot",
        instance_type="g6e.xlarge",
        zone=f"us-east-1{'abcd'[index % 4]}",
        engine="vllm",
        max_model_len=32768,
        max_token_chars=48,
    )


async def _heartbeat_forever(registry: Registry, agents: list[str], into: PathResult) -> None:
    """Every agent beats every `HEARTBEAT_SECONDS`, spread evenly, its load moving."""
    load = random.Random(11)
    gap = HEARTBEAT_SECONDS / len(agents)
    next_at = time.monotonic()
    while True:
        for agent_id in agents:
            await registry.heartbeat(agent_id, active=load.randrange(33))
            into.heartbeats += 1
            next_at += gap
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))


async def _drain_now_and_then(
    registry: Registry, agents: list[str], drains: dict[str, float]
) -> None:
    for agent_id in random.Random(5).sample(agents, len(agents)):
        await asyncio.sleep(DRAIN_EVERY_SECONDS)
        await registry.set_draining(agent_id, deadline=time.time() + 120)
        drains[agent_id] = time.time()


@asynccontextmanager
async def _emulator() -> AsyncIterator[str]:
    """The emulator in a process of its own, so it does not share the readers' core."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "stack.emulator", stdout=asyncio.subprocess.PIPE
    )
    try:
        if process.stdout is None:
            raise RuntimeError("the emulator has no stdout")
        yield (await process.stdout.readline()).decode().strip()
    finally:
        process.terminate()
        await process.wait()


async def _one_run(path: str, agents: int, gateways: int, seconds: float, into: PathResult) -> None:
    """One read path on a fresh emulator: register, heartbeat, read, drain; count and time."""
    async with AsyncExitStack() as stack:
        settings = emulator_settings(await stack.enter_async_context(_emulator()), EMULATOR_REGION)
        writer = await stack.enter_async_context(Registry.open(settings))
        await writer.create_tables()
        records = [_agent(index) for index in range(agents)]
        for record in records:
            await writer.register(record)
        ids = [record.agent_id for record in records]
        drains: dict[str, float] = {}
        views: list[WatchingView] = []
        tasks: list[asyncio.Task[None]] = []
        for _ in range(gateways):
            reader = await stack.enter_async_context(Registry.open(settings))
            reader._client.meta.events.register("after-call.dynamodb", Meter(into))
            view = WatchingView(drains, into)
            views.append(view)
            if path == PATHS[0]:
                tasks.append(asyncio.create_task(_scan_forever(reader, view, into)))
            else:
                dispatcher = Dispatcher(QueueSettings())
                dispatcher.view = view
                timed: Any = TimedRegistry(reader, into)
                tasks.append(
                    asyncio.create_task(dispatcher.refresh_forever(timed, REFRESH_SECONDS))
                )
        heartbeats = await stack.enter_async_context(Registry.open(settings))
        tasks.append(asyncio.create_task(_heartbeat_forever(heartbeats, ids, into)))
        tasks.append(asyncio.create_task(_drain_now_and_then(writer, ids, drains)))
        started = time.monotonic()
        await asyncio.sleep(seconds)
        # A drain written just now has not had its chance yet: give the views one more second.
        last_drain = max(drains.values(), default=0.0)
        await asyncio.sleep(max(0.0, last_drain + 2 * STALENESS_GOAL_SECONDS - time.time()))
        into.seconds += time.monotonic() - started
        into.drains += len(drains)
        into.missed += sum(view.unseen() for view in views)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def run(runs: int, agents: int, gateways: int, seconds: float) -> dict[str, PathResult]:
    """Both read paths, alternating, `runs` times each."""
    results = {path: PathResult() for path in PATHS}
    for _ in range(runs):
        for path in PATHS:
            await _one_run(path, agents, gateways, seconds, results[path])
    return results


def _ms(values: list[float], fraction: float) -> str:
    return f"{percentile(values, fraction) * 1000:.0f}" if values else "–"


def render(results: dict[str, PathResult], runs: int, agents: int, gateways: int) -> str:
    """The Markdown section for `docs/benchmarks.md`."""
    scan, feed = (results[path] for path in PATHS)
    lines = [
        "## Registry reads: gateways scanning the agents table vs reading its change feed",
        "",
        f"Command: `{COMMAND}` ({runs} runs per path, {agents:,} agents heartbeating every "
        f"{HEARTBEAT_SECONDS:g} s, {gateways} gateways refreshing every {REFRESH_SECONDS:g} s, "
        f"a drain every {DRAIN_EVERY_SECONDS:g} s; the AWS emulator in its own process).",
        f"Machine: {machine_facts(['moto', 'aioboto3'])}.",
        "",
        "*Read units*: DynamoDB's on-demand read request units, eventually consistent, counted "
        "from what each request returned by DynamoDB's sizing rules (the emulator charges "
        "nothing). *Staleness*: from a drain's write to each gateway's view holding the agent "
        f"as draining; goal at most {STALENESS_GOAL_SECONDS:g} s. Read latency includes "
        "parsing the answer on the gateway's event loop.",
        "",
        "| read path | read units/s, all gateways | per gateway | requests/s | items read/s "
        "| read p50 / p99 ms | staleness p50 / p99 / max ms | drains never seen | heartbeats/s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for path, seen in results.items():
        per_second = 1 / seen.seconds if seen.seconds else 0.0
        lines.append(
            f"| {path} | {seen.read_units * per_second:,.1f} "
            f"| {seen.read_units * per_second / gateways:,.1f} "
            f"| {seen.requests * per_second:,.1f} | {seen.items * per_second:,.0f} "
            f"| {_ms(seen.read_latency, 0.5)} / {_ms(seen.read_latency, 0.99)} "
            f"| {_ms(seen.staleness, 0.5)} / {_ms(seen.staleness, 0.99)} "
            f"/ {_ms(seen.staleness, 1.0)} | {seen.missed} "
            f"| {seen.heartbeats * per_second:,.0f} |"
        )
    rate = [r.read_units / r.seconds if r.seconds else 0.0 for r in (scan, feed)]
    met = feed.staleness and percentile(feed.staleness, 1.0) <= STALENESS_GOAL_SECONDS
    lines += [
        "",
        f"The change feed reads {rate[0] / rate[1] if rate[1] else math.inf:.1f}× fewer units "
        f"than the scan; staleness goal {'met' if met and not feed.missed else '**not met**'} "
        "on the change feed (worst drain over every gateway).",
    ]
    return "\n".join(lines)


def main() -> None:
    """Run the benchmark, print the table, and write it into the report if asked."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--gateways", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--write", type=Path, help="report file to update")
    args = parser.parse_args()
    results = uvloop.run(run(args.runs, args.agents, args.gateways, args.seconds))
    section = render(results, args.runs, args.agents, args.gateways)
    print(section)
    if args.write:
        write_section(args.write, "registry_reads", section)


if __name__ == "__main__":
    main()
