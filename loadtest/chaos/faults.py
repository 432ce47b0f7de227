"""The faults injected into running traffic, and the scenarios by name."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable

import psutil

from loadtest.chaos.stack import (
    AGENT_HEARTBEAT_SECONDS,
    READY_TIMEOUT_SECONDS,
    REGISTRY_POLL_SECONDS,
    TOKENS_PER_SECOND,
    ChaosStack,
)
from loadtest.chaos.traffic import STREAM_TIMEOUT_SECONDS, SseClients, Traffic, active_streams
from spotgate.registry import Registry

NOTICE_SECONDS = 20.0
ENGINE_CORE_PROCESS_NAME = "VLLM::EngineCor"
"""What vLLM's engine core process calls itself (`VLLM::EngineCore`, cut to 15 characters)."""
# A fresh agent is killed this long after it is seen registered, or once it has a stream:
# well within its first heartbeat interval, and long enough for the gateway to route to it.
NEWCOMER_LIFETIME_SECONDS = 0.4 * AGENT_HEARTBEAT_SECONDS


Fault = Callable[[ChaosStack, Traffic, dict[str, str]], Awaitable[set[str]]]
"""Inject a fault into running traffic, given the ready agents (id → URL, busiest first);
return the agents it took out."""


async def kill_9(stack: ChaosStack, traffic: Traffic, ready: dict[str, str]) -> set[str]:
    """SIGKILL one serving agent."""
    victim, process = next(iter(stack.serving_processes(ready).items()))
    process.send_signal(signal.SIGKILL)
    return {victim}


async def spot_notice(stack: ChaosStack, traffic: Traffic, ready: dict[str, str]) -> set[str]:
    """A spot interruption with a 20-second deadline."""
    victim = next(iter(stack.serving_processes(ready)))
    await stack.interrupt(victim, NOTICE_SECONDS)
    return {victim}


async def two_interrupted(stack: ChaosStack, traffic: Traffic, ready: dict[str, str]) -> set[str]:
    """Two agents interrupted at once (20-second deadline)."""
    victims = set(list(stack.serving_processes(ready))[:2])
    await asyncio.gather(*(stack.interrupt(v, NOTICE_SECONDS) for v in victims))
    return victims


async def hang(stack: ChaosStack, traffic: Traffic, ready: dict[str, str]) -> set[str]:
    """An agent that stops answering but keeps its sockets open (SIGSTOP), killed later."""
    victim, process = next(iter(stack.serving_processes(ready).items()))
    process.suspend()
    kill_in_seconds = stack.engine.recovery_timeout_seconds / 2
    asyncio.get_running_loop().call_later(kill_in_seconds, _kill_quietly, process)
    return {victim}


async def engine_core_stopped(
    stack: ChaosStack, traffic: Traffic, ready: dict[str, str]
) -> set[str]:
    """vLLM: SIGSTOP only the engine core of a serving agent (and its workers).

    The agent's own process answers on, `/healthz` green, heartbeats going: a wedged GPU.
    """
    victim, process = next(iter(stack.serving_processes(ready).items()))
    cores = [
        child
        for child in process.children(recursive=True)
        if child.name().startswith(ENGINE_CORE_PROCESS_NAME)
    ]
    if not cores:
        raise RuntimeError(f"{victim} runs no {ENGINE_CORE_PROCESS_NAME} process")
    for core in cores:
        for stopped in (core, *core.children(recursive=True)):
            stopped.suspend()
    return {victim}


def _kill_quietly(process: psutil.Process) -> None:
    with contextlib.suppress(psutil.NoSuchProcess):
        process.kill()


def aws_down(seconds: float) -> Fault:
    """The AWS emulator (DynamoDB, SQS) unreachable for `seconds`."""

    async def fault(stack: ChaosStack, _traffic: Traffic, _ready: dict[str, str]) -> set[str]:
        stack.emulator.stop()
        await asyncio.sleep(seconds)
        stack.emulator.start()
        return set()

    fault.__doc__ = f"the AWS emulator stopped for {seconds:.0f} s"
    return fault


def limit_store_down(seconds: float) -> Fault:
    """The gateways' limit store (Redis) stopped for `seconds`, then started empty."""

    async def fault(stack: ChaosStack, _traffic: Traffic, _ready: dict[str, str]) -> set[str]:
        stack.limit_store.stop()
        await asyncio.sleep(seconds)
        stack.limit_store.start()  # same port, no data: what a restarted node holds
        return set()

    fault.__doc__ = f"the limit store stopped for {seconds:.0f} s and restarted empty"
    return fault


async def gateway_restart(stack: ChaosStack, traffic: Traffic, _ready: dict[str, str]) -> set[str]:
    """SIGTERM the gateway; its supervisor starts it again; done once the new one ends a stream."""
    await stack.restart_gateway()
    traffic.completed.clear()  # the old gateway is gone: the next exact stream is the new one's
    async with asyncio.timeout(STREAM_TIMEOUT_SECONDS):
        await traffic.completed.wait()
    return set()


async def gateway_stopped_under_long_streams(
    stack: ChaosStack, traffic: Traffic, _ready: dict[str, str]
) -> set[str]:
    """SIGTERM one of two gateways while streams longer than its grace run through it.

    When the grace is over each hears `going_away`: websocket clients resume through the
    other gateway, exact; SSE clients see an error event, then `[DONE]`. Done once every
    long stream has ended, the gateway running again (its supervisor restarted it).
    """
    max_tokens = round(stack.timings.long_stream_seconds * TOKENS_PER_SECOND)
    websocket = Traffic(
        stack, 2, name="long", rounds=1, tally=traffic.tally, max_tokens=max_tokens, gateway=1
    )
    sse = SseClients(stack, 2, max_tokens=max_tokens, gateway=1, tally=traffic.tally)
    websocket.start()
    sse.start()
    async with asyncio.timeout(STREAM_TIMEOUT_SECONDS):
        await websocket.replying.wait()
        await sse.replying.wait()
    await stack.restart_gateway(1)
    await websocket.finished()
    await sse.finished()
    return set()


async def gateway_kill_9(stack: ChaosStack, traffic: Traffic, _ready: dict[str, str]) -> set[str]:
    """SIGKILL one of the two gateways mid-stream; its clients resume through the other.

    Done once a stream resumed that way has ended exact, and the stack's supervisor has
    started the gateway again on its port.
    """
    traffic.completed.clear()
    resumed_before = traffic.tally.resumed
    restarts = stack.gateway_restarts(1)
    stack.kill_gateway(1)  # the first serves the agents' JWKS: the second is the one to lose
    async with asyncio.timeout(STREAM_TIMEOUT_SECONDS):
        while traffic.tally.resumed == resumed_before:
            traffic.completed.clear()
            await traffic.completed.wait()
    await stack.wait_gateway_restarted(1, restarts, READY_TIMEOUT_SECONDS)
    return set()


async def serving_a_stream(agent_url: str) -> None:
    """Until the agent at `agent_url` generates a stream."""
    while await active_streams(agent_url) < 1:  # noqa: ASYNC110 - an agent's metrics, polled
        await asyncio.sleep(REGISTRY_POLL_SECONDS)


async def dies_after_registering(
    stack: ChaosStack, traffic: Traffic, ready: dict[str, str]
) -> set[str]:
    """SIGKILL a serving agent, then its replacement as soon as it registers ready.

    The replacement dies before its first heartbeat, once it has a stream or shortly after
    it registers, so its entry looks healthy to the gateway until it expires.
    """
    before = set(stack.agent_processes())
    victims = await kill_9(stack, traffic, ready)
    async with asyncio.timeout(stack.engine.ready_timeout_seconds):
        while not (fresh := stack.agent_processes().keys() - before):  # noqa: ASYNC110 - polled
            await asyncio.sleep(REGISTRY_POLL_SECONDS)
        newcomer = fresh.pop()
        process = stack.agent_processes()[newcomer]
        async with Registry.open(stack.emulator.settings()) as registry:
            record = None
            while record is None or record.ready_at is None:
                await asyncio.sleep(REGISTRY_POLL_SECONDS)
                record = await registry.get_agent(newcomer)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(serving_a_stream(record.url), NEWCOMER_LIFETIME_SECONDS)
            process.kill()
            record = await registry.get_agent(newcomer)
    if record is None or record.heartbeat_at != record.ready_at:
        raise RuntimeError(f"{newcomer} sent a heartbeat before it was killed")
    return victims | {newcomer}


async def full_pool(stack: ChaosStack, traffic: Traffic, _ready: dict[str, str]) -> set[str]:
    """As many streams again as the whole pool holds, at once: the surplus must queue."""
    surplus = Traffic(
        stack, stack.agents * stack.agent_capacity, name="surge", rounds=1, tally=traffic.tally
    )
    surplus.start()
    await surplus.finished()
    return set()


SCENARIOS: dict[str, Callable[[float], Fault]] = {
    "kill -9 of a serving agent": lambda _: kill_9,
    "spot notice, 20 s deadline": lambda _: spot_notice,
    "two agents interrupted at once": lambda _: two_interrupted,
    "agent hangs (SIGSTOP), socket open": lambda _: hang,
    "AWS (moto server) stopped": aws_down,
    "limit store (Redis) restarted empty": limit_store_down,
    "gateway restarted (SIGTERM, new process)": lambda _: gateway_restart,
    "kill -9 of one of two gateways": lambda _: gateway_kill_9,
    "replacement killed before its first heartbeat": lambda _: dies_after_registering,
    "full pool: a surge of its whole capacity": lambda _: full_pool,
}
SYNTHETIC_SCENARIOS: dict[str, Callable[[float], Fault]] = {
    "SIGTERM of one of two gateways, streams longer than its grace": (
        lambda _: gateway_stopped_under_long_streams
    ),
}
"""Faults whose streams need replies of any length: only the synthetic engine knows them."""
VLLM_SCENARIOS: dict[str, Callable[[float], Fault]] = {
    "engine core stopped (SIGSTOP), agent alive": lambda _: engine_core_stopped,
}
"""Faults only a vLLM agent can suffer: the synthetic engine runs in the agent's process."""


def scenarios_for(kind: str) -> dict[str, Callable[[float], Fault]]:
    """The scenarios that apply to agents of an engine kind, by name."""
    return {**SCENARIOS, **(VLLM_SCENARIOS if kind == "vllm" else SYNTHETIC_SCENARIOS)}
