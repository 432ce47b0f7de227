"""What shared limits add to a request: the limit store (Redis) vs one replica's own buckets.

    python -m loadtest.bench.limits [--runs 5] [--requests 2000] [--write docs/benchmarks.md]

Before a request reaches an agent the gateway takes its admission from the limits (rpm, tpm,
a stream slot: one script in the store) and, for a credential it has not found valid in the
last seconds, checks the failed-auth budgets first (one more round trip; an API key in use
skips it). When the stream ends its slot goes back and its tokens are charged. Each run times
these calls through `gateway.limits.LimitStore`, the object the gateway's handlers call, on
uvloop as the gateway runs, with the store (Debian's `redis-server` on loopback, started
here) and without it, alternating: one caller after another, and requests arriving at
`OPEN_LOOP_PER_SECOND` (Poisson) whatever the answers' pace, over 1,000 API keys. The table
gives p50 and p99 over every request of every run and what the store adds (shared − local);
a bare PING before each request shows what one round trip to the store costs on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import uvloop

from gateway.limits import LimitStore
from gateway.metrics import GatewayMetrics
from gateway.ratelimit import Limits
from gateway.sharedlimits import SharedBuckets
from loadtest.bench.report import machine_facts, percentile, write_section
from spotgate.settings import GatewaySettings
from stack.redis_server import RedisServer

COMMAND = "python -m loadtest.bench.limits --write docs/benchmarks.md"
KEYS = 1_000
OPEN_LOOP_PER_SECOND = 500.0
LOADS = ("one at a time", f"{OPEN_LOOP_PER_SECOND:g} requests/s")
GENEROUS = Limits(rpm=10_000_000, tpm=10_000_000_000)
"""Limits no run reaches: every request takes the whole path, none stops at a refusal."""
GOAL_P99_MS = 1.0


@dataclass
class Latencies:
    """Seconds per call of one path under one load, over every run."""

    admit: list[float] = field(default_factory=list)
    auth_check: list[float] = field(default_factory=list)
    release: list[float] = field(default_factory=list)
    ping: list[float] = field(default_factory=list)


async def _request(store: LimitStore, index: int, into: Latencies) -> None:
    if store.shared is not None:  # the machine's own round trip to the store, for scale
        before = time.perf_counter()
        await store.shared.ping()
        into.ping.append(time.perf_counter() - before)
    key_id = f"bench-{index % KEYS}"
    now = time.time()
    started = time.perf_counter()
    decision = await store.auth_check(f"10.0.{index % 250}.1", key_id, now)
    checked = time.perf_counter()
    admission = await store.admit(key_id, GENEROUS, now)
    admitted = time.perf_counter()
    if not (decision.admitted and admission.admitted):
        raise RuntimeError(f"refused: {decision} {admission.decision}")
    await store.finish(admission, 100, now)
    into.auth_check.append(checked - started)
    into.admit.append(admitted - checked)
    into.release.append(time.perf_counter() - admitted)


async def _one_at_a_time(store: LimitStore, requests: int, into: Latencies) -> None:
    for index in range(requests):
        await _request(store, index, into)


async def _open_loop(store: LimitStore, requests: int, into: Latencies) -> None:
    arrivals = random.Random(7)
    tasks = []
    for index in range(requests):
        tasks.append(asyncio.create_task(_request(store, index, into)))
        await asyncio.sleep(arrivals.expovariate(OPEN_LOOP_PER_SECOND))
    await asyncio.gather(*tasks)


async def run(runs: int, requests: int) -> dict[tuple[str, str], Latencies]:
    """Time the limits path with and without the store, alternating, under each load."""
    server = RedisServer()
    server.start()
    results: dict[tuple[str, str], Latencies] = {}
    loads = dict(zip(LOADS, (_one_at_a_time, _open_loop), strict=True))
    try:
        settings = GatewaySettings(limit_store=server.settings())
        async with SharedBuckets.open(settings.limit_store) as shared:
            stores = {
                "local": LimitStore(GatewaySettings(), GatewayMetrics()),
                "shared": LimitStore(settings, GatewayMetrics(), shared),
            }
            await _open_loop(stores["shared"], 500, Latencies())  # scripts loaded, pool warm
            for _ in range(runs):
                for load, drive in loads.items():
                    for name, store in stores.items():
                        await drive(store, requests, results.setdefault((name, load), Latencies()))
            if stores["shared"].status != "shared":
                raise RuntimeError(f"the store fell back: {stores['shared'].health.error}")
    finally:
        server.stop()
    return results


def _ms(values: list[float], fraction: float) -> float:
    return percentile(values, fraction) * 1000


def render(results: dict[tuple[str, str], Latencies], runs: int, requests: int) -> str:
    """The Markdown section for `docs/benchmarks.md`."""
    lines = [
        "## Shared limits: the limit store (Redis) vs one replica's own buckets",
        "",
        f"Command: `{COMMAND}` ({runs} alternating runs × {requests:,} requests per path and "
        f"load, {KEYS:,} API keys; `redis-server` on the same machine, over loopback; uvloop).",
        f"Machine: {machine_facts(['redis', 'uvloop'])}.",
        "",
        "*Admission*: the key's rpm, tpm and a stream slot, which every request waits for "
        "before it is routed; *auth check*: the failed-auth budgets, which a credential the "
        "gateway has not found valid in the last 10 s waits for first (an API key in use skips "
        "it); *release*: the slot back and the tokens charged, after the stream. Milliseconds "
        f"per call, p50 / p99 over every request. Goal: the store adds at most {GOAL_P99_MS:g} "
        "ms at p99 to a request.",
        "",
        "| load | path | admission | auth check | admission + auth check | release | a bare PING |",
        "|---|---|---|---|---|---|---|",
    ]
    for load in LOADS:
        local, shared = results[("local", load)], results[("shared", load)]
        for name, seen in (("own buckets", local), ("limit store", shared)):
            both = [a + b for a, b in zip(seen.admit, seen.auth_check, strict=True)]
            lines.append(
                f"| {load} | {name} | {_pair(seen.admit)} | {_pair(seen.auth_check)} "
                f"| {_pair(both)} | {_pair(seen.release)} "
                f"| {_pair(seen.ping) if seen.ping else ''} |"
            )
        added = _ms(shared.admit, 0.99) - _ms(local.admit, 0.99)
        verdict = "goal met" if added <= GOAL_P99_MS else "**goal not met**"
        over_ping = _ms(shared.admit, 0.99) - _ms(shared.ping, 0.99)
        lines.append(f"| {load} | added by the store, admission p99 | {added:+.3f} ({verdict}); "
                     f"{over_ping:+.3f} over a bare PING's p99 | | | | |")  # fmt: skip
    return "\n".join(lines)


def _pair(values: list[float]) -> str:
    return f"{_ms(values, 0.5):.3f} / {_ms(values, 0.99):.3f}"


def main() -> None:
    """Run the benchmark, print the table, and write it into the report if asked."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--write", type=Path, help="report file to update")
    args = parser.parse_args()
    results = uvloop.run(run(args.runs, args.requests))
    section = render(results, args.runs, args.requests)
    print(section)
    if args.write:
        write_section(args.write, "limits", section)


if __name__ == "__main__":
    main()
