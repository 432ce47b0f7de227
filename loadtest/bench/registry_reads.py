"""What routing costs the registry: gateways scanning the agents table vs reading its change feed.

    python -m loadtest.bench.registry_reads [--agents 1000] [--gateways 8] [--seconds 30]
        [--write docs/benchmarks.md]

Each gateway keeps a view of the pool for routing, refreshed every `REFRESH_SECONDS`. Before,
each one scanned the whole agents table every time; now each reads the `by_change` index,
which holds only what routing reads, for what changed since a little before the newest change
it has seen (and the whole index every `WHOLE_READ_SECONDS`).

The benchmark plays `--seconds` of a pool's life on the AWS emulator (moto's server, in a
process of its own) on a simulated clock: `--agents` agents heartbeating every
`HEARTBEAT_SECONDS` (their load changing each time), `--gateways` gateways refreshing every
`REFRESH_SECONDS` at staggered moments, and the pool manager draining an agent every
`DRAIN_EVERY_SECONDS` with its clock `DRAIN_CLOCK_BEHIND_SECONDS` behind the agents'. Every
write and read is a real request to the emulator, made in time order at its simulated moment;
the simulated clock is what the registry stamps and the views read, so the emulator's own pace
(milliseconds per item, where DynamoDB takes microseconds) changes no result. The scan's
cost does not depend on the other gateways (each reads the whole table), so one gateway scans
and the totals count it `--gateways` times; every gateway reads the change feed.

The emulator does not charge reads, so read request units are counted by DynamoDB's published
rules from what each request returned: a query or scan page costs 0.5 units per 4 KB started
(eventually consistent), measured on the items it read, with the item sizes DynamoDB uses
(attribute names plus values). *Staleness* is how long after a drain's write each gateway's
view holds the agent as draining, in simulated time: what the read path adds, before the
network's round trip. The goal is at most 1 s.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import itertools
import math
import random
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import uvloop

from gateway.dispatch import Dispatcher, PoolView
from loadtest.bench.harness import bench_spec
from loadtest.bench.report import machine_facts, percentile, write_section
from loadtest.bench.workdir import logs_dir
from pool_manager.launches import vouch_for_agent
from spotgate.registry import AgentRecord, AgentState, Registry
from spotgate.settings import QueueSettings
from stack.builder import LocalStack

COMMAND = "python -m loadtest.bench.registry_reads --write docs/benchmarks.md"
REFRESH_SECONDS = 0.5  # the gateway's default `registry_refresh_seconds`
HEARTBEAT_SECONDS = 5.0  # the agent's default `heartbeat_seconds`
DRAIN_EVERY_SECONDS = 2.5
DRAIN_CLOCK_BEHIND_SECONDS = 0.25
DRAIN_PHASE_SECONDS = 0.37 * REFRESH_SECONDS
START = 1_900_000_000.0
MODELS = ("meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen3-8B", "google/gemma-3-12b-it")
STALENESS_GOAL_SECONDS = 1.0
READ_UNIT_BYTES = 4096
EVENTUAL_READ_UNITS = 0.5
PATHS = ("scan the table", "change feed")


@dataclass
class PathResult:
    """One read path over one simulated run."""

    seconds: float = 0.0
    gateways: int = 0
    """Gateways the totals stand for."""
    readers: int = 0
    """Gateways that actually read (the scan's cost is one gateway's, times `gateways`)."""
    read_units: float = 0.0
    requests: int = 0
    items: int = 0
    refreshes: int = 0
    emulator_seconds: list[float] = field(default_factory=list)
    staleness: list[float] = field(default_factory=list)
    heartbeats: int = 0
    drains: int = 0
    missed: int = 0
    """Drain sightings some gateway never made before the run ended."""

    def per_second(self, count: float) -> float:
        """`count` over the run, for all the gateways the run stands for."""
        return count * self.gateways / self.readers / self.seconds if self.seconds else 0.0


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
    if "M" in value:  # 3 bytes of its own, then each entry's name and value
        return 3 + sum(
            1 + len(name.encode()) + attribute_bytes(entry) for name, entry in value["M"].items()
        )
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
        """Charge one Query or Scan response.

        Launch records (`BatchGetItem`) are not charged: a gateway reads each agent's once
        and keeps it, a cost of an agent's arrival, not of the refreshes measured here.
        """
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
        for agent_id, written_at in self._drains.items():
            entry = self.entries.get(agent_id)
            if agent_id not in self._seen and entry and entry.state is AgentState.DRAINING:
                self._seen.add(agent_id)
                self._into.staleness.append(now - written_at)

    def unseen(self) -> int:
        """Drains this view has not shown."""
        return len(set(self._drains) - self._seen)


class SimulatedClock:
    """The time the registry stamps and the views read: moved by the run, not by the wall."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        """The simulated time."""
        return self.now


class ScanningDispatcher(Dispatcher):
    """The read path before the change feed: the whole table, every refresh."""

    async def refresh(self, registry: Registry) -> None:
        """Scan the table into the view."""
        self.view.replace(await registry.list_agents(), self._clock())


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


Event = tuple[float, int, Callable[[], Awaitable[None]]]
"""When, in what order among equals, and what."""


async def _one_run(path: str, agents: int, gateways: int, seconds: float) -> PathResult:
    """One read path on a fresh emulator, `seconds` of simulated time."""
    into = PathResult(seconds=seconds, gateways=gateways)
    clock = SimulatedClock(START)
    load = random.Random(11)
    async with AsyncExitStack() as stack:
        # The emulator in a process of its own, so it does not share the readers' core.
        logs = stack.enter_context(logs_dir(None))
        emulator = await stack.enter_async_context(LocalStack(bench_spec(logs, [], keys=())))
        settings = emulator.shared
        fleet = await stack.enter_async_context(Registry.open(settings, clock))
        pool_manager = await stack.enter_async_context(
            Registry.open(settings, lambda: clock.now - DRAIN_CLOCK_BEHIND_SECONDS)
        )
        records = [_agent(index) for index in range(agents)]
        await asyncio.gather(*(fleet.register(record) for record in records))
        await asyncio.gather(  # what the pool manager vouches for: gateways route by it
            *(
                vouch_for_agent(
                    pool_manager, agent_id=r.agent_id, model=r.model, url=r.url, capacity=r.capacity
                )
                for r in records
            )
        )
        drains: dict[str, float] = {}
        views: list[WatchingView] = []
        events: list[Event] = []
        ties = itertools.count()  # same moment: first scheduled, first done

        def at(moment: float, action: Callable[[], Awaitable[None]]) -> None:
            if moment < START + seconds:
                heapq.heappush(events, (moment, next(ties), action))

        into.readers = 1 if path == PATHS[0] else gateways
        for number in range(into.readers):
            reader = await stack.enter_async_context(Registry.open(settings, clock))
            view = WatchingView(drains, into)
            kind = ScanningDispatcher if path == PATHS[0] else Dispatcher
            dispatcher = kind(QueueSettings(), clock=clock)
            dispatcher.view = view
            views.append(view)
            reader._client.meta.events.register("after-call.dynamodb", Meter(into))
            # The gateway's first read, of the whole feed: one per `WHOLE_READ_SECONDS` after.
            await dispatcher.refresh(reader)

            def refresh(dispatcher: Dispatcher = dispatcher, reader: Registry = reader) -> Any:
                async def run() -> None:
                    started = time.perf_counter()
                    await dispatcher.refresh(reader)
                    into.emulator_seconds.append(time.perf_counter() - started)
                    into.refreshes += 1
                    at(clock.now + REFRESH_SECONDS, refresh(dispatcher, reader))

                return run

            at(START + (number + 1) * REFRESH_SECONDS / into.readers, refresh())

        def heartbeat(agent_id: str) -> Callable[[], Awaitable[None]]:
            async def run() -> None:
                await fleet.heartbeat(agent_id, active=load.randrange(33))
                into.heartbeats += 1
                at(clock.now + HEARTBEAT_SECONDS, heartbeat(agent_id))

            return run

        for index, record in enumerate(records):
            at(START + (index + 1) * HEARTBEAT_SECONDS / agents, heartbeat(record.agent_id))
        order = random.Random(5).sample(records, len(records))

        def drain() -> Callable[[], Awaitable[None]]:
            async def run() -> None:
                agent_id = order[len(drains)].agent_id
                await pool_manager.set_draining(agent_id, deadline=clock.now + 120)
                drains[agent_id] = clock.now
                into.drains += 1
                # A drain needs a refresh of every gateway after it: none in the last second.
                if clock.now + DRAIN_EVERY_SECONDS < START + seconds - STALENESS_GOAL_SECONDS:
                    at(clock.now + DRAIN_EVERY_SECONDS, drain())

            return run

        # Off the refreshes' beat, or every drain would land just before one.
        at(START + DRAIN_EVERY_SECONDS + DRAIN_PHASE_SECONDS, drain())
        while events:
            moment, _, action = heapq.heappop(events)
            clock.now = moment
            await action()
        into.missed = sum(view.unseen() for view in views)
    return into


async def run(agents: int, gateways: int, seconds: float) -> dict[str, PathResult]:
    """Both read paths, one after the other, on the same simulated schedule."""
    return {path: await _one_run(path, agents, gateways, seconds) for path in PATHS}


def _ms(values: list[float], fraction: float) -> str:
    return f"{percentile(values, fraction) * 1000:.0f}" if values else "–"


def render(results: dict[str, PathResult], agents: int) -> str:
    """The Markdown section for `docs/benchmarks.md`."""
    scan, feed = (results[path] for path in PATHS)
    lines = [
        "## Registry reads: gateways scanning the agents table vs reading its change feed",
        "",
        f"Command: `{COMMAND}` ({feed.seconds:g} simulated seconds, {agents:,} agents "
        f"heartbeating every {HEARTBEAT_SECONDS:g} s, {feed.gateways} gateways refreshing every "
        f"{REFRESH_SECONDS:g} s, a drain every {DRAIN_EVERY_SECONDS:g} s written on a clock "
        f"{DRAIN_CLOCK_BEHIND_SECONDS:g} s behind the agents'; every request real, to the AWS "
        "emulator in its own process, on a simulated clock).",
        f"Machine: {machine_facts(['moto', 'aioboto3'])}.",
        "",
        "*Read units*: DynamoDB's on-demand read request units (eventually consistent), counted "
        "from what each request returned by DynamoDB's sizing rules, for all the gateways. "
        "*Staleness*: from a drain's write to each gateway's view holding the agent as "
        f"draining, simulated time; goal at most {STALENESS_GOAL_SECONDS:g} s. *Emulator ms per "
        "refresh*: how long the emulator took to answer one (it serves an item in "
        "milliseconds; for scale only).",
        "",
        "| read path | read units/s | per gateway | requests/s | items read/s | "
        "staleness p50 / p99 / max ms | drain sightings missed | emulator ms per refresh p50 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for path, seen in results.items():
        per_gateway = seen.per_second(seen.read_units) / seen.gateways
        lines.append(
            f"| {path} | {seen.per_second(seen.read_units):,.1f} | {per_gateway:,.1f} "
            f"| {seen.per_second(seen.requests):,.1f} | {seen.per_second(seen.items):,.0f} "
            f"| {_ms(seen.staleness, 0.5)} / {_ms(seen.staleness, 0.99)} "
            f"/ {_ms(seen.staleness, 1.0)} | {seen.missed} of {seen.drains * seen.readers} "
            f"| {_ms(seen.emulator_seconds, 0.5)} |"
        )
    ratio = scan.per_second(scan.read_units) / max(feed.per_second(feed.read_units), 1e-9)
    worst = max(feed.staleness, default=math.inf)
    met = worst <= STALENESS_GOAL_SECONDS and not feed.missed
    lines += [
        "",
        f"The change feed reads {ratio:.1f}× fewer units than the scan, and each gateway parses "
        f"{scan.per_second(scan.items) / max(feed.per_second(feed.items), 1e-9):.1f}× fewer "
        f"items; staleness goal {'met' if met else '**not met**'} on the change feed (worst "
        f"drain over every gateway: {worst * 1000:.0f} ms).",
    ]
    return "\n".join(lines)


def main() -> None:
    """Run the benchmark, print the table, and write it into the report if asked."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--gateways", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--write", type=Path, help="report file to update")
    args = parser.parse_args()
    results = uvloop.run(run(args.agents, args.gateways, args.seconds))
    section = render(results, args.agents)
    print(section)
    if args.write:
        write_section(args.write, "registry_reads", section)


if __name__ == "__main__":
    main()
