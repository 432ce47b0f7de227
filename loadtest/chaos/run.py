"""A scenario run: steady traffic, the fault, recovery; all of them on one stack."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

from loadtest.chaos.faults import Fault, aws_down, limit_store_down, scenarios_for
from loadtest.chaos.stack import (
    DEFAULT_TIMINGS,
    SYNTHETIC,
    ChaosStack,
    StackEngine,
    StackTimings,
    chaos_stack,
)
from loadtest.chaos.traffic import Tally, Traffic

DEFAULT_AGENTS = 3  # the command line's defaults (its report names only others)
DEFAULT_STREAMS = 12


@dataclass(frozen=True)
class Outcome:
    """One scenario's row of the report."""

    name: str
    tally: Tally
    recovery_seconds: float | None


async def run_scenario(
    stack: ChaosStack, name: str, fault: Fault, streams: int, settle_seconds: float
) -> Outcome:
    """Steady traffic, the fault, recovery, more traffic; every stream accounted for."""
    if await stack.wait_ready(set(), stack.engine.ready_timeout_seconds) is None:
        raise RuntimeError(f"{name}: the pool did not reach its target before the fault")
    traffic = Traffic(stack, streams)
    traffic.start()
    await traffic.replying.wait()
    await asyncio.sleep(1.0)  # streams are mid-reply when the fault lands
    faulted_at = time.monotonic()
    victims = await fault(stack, traffic, await traffic.busiest_first(await stack.ready_agents()))
    remaining = stack.engine.recovery_timeout_seconds - (time.monotonic() - faulted_at)
    recovered = await stack.wait_ready(victims, remaining)
    recovery = None if recovered is None else time.monotonic() - faulted_at
    await asyncio.sleep(settle_seconds)
    await traffic.stop()
    return Outcome(name, traffic.tally, recovery)


async def run_all(
    agents: int,
    streams: int,
    aws_down_seconds: float,
    settle_seconds: float,
    engine: StackEngine = SYNTHETIC,
    scenarios: Sequence[str] = (),
    timings: StackTimings = DEFAULT_TIMINGS,
) -> list[Outcome]:
    """The `scenarios` (those that apply to the engine by default), in turn, on one stack.

    Each agent takes `streams` streams at once: one agent alone can carry the whole steady
    traffic while the others are faulted, and the full pool needs a surge beyond it.
    """
    outcomes = []
    async with chaos_stack(agents, streams, engine, timings) as stack:
        if engine.kind == "vllm":
            if await stack.wait_ready(set(), engine.ready_timeout_seconds) is None:
                raise RuntimeError("the pool did not reach its target")
            await stack.learn_replies(agents * streams)  # the surge's clients too
        applicable = scenarios_for(engine.kind)
        for name in scenarios or tuple(applicable):
            make = applicable[name]
            fault = make(aws_down_seconds)
            timed = make in (aws_down, limit_store_down)
            label = f"{name} ({aws_down_seconds:.0f} s)" if timed else name
            outcomes.append(await run_scenario(stack, label, fault, streams, settle_seconds))
    return outcomes
