"""Whether a key learns what another key's prompt holds from where its own streams land.

Key B streams a chat whose system prompt holds a secret 4-digit number (in its first block).
Key A knows the rest of that prompt and tries `ORACLE_GUESSES` numbers, each
`ORACLE_ROUNDS` times with another question, over a pool of `ORACLE_AGENTS` agents, and
watches what its streams' `start` frames say: before tenants, the gateway matched A's prompt
against B's and sent the right guess to B's agent every time (and `start.agent` named it), while
each wrong guess landed by its own hash, so the one guess that never moved was the number.
Now every guess is matched within A's own tenant, and `start` names agents by a handle of each
stream's own, so no guess stands out and no two streams can be told to share an agent.

(The synthetic engine keeps no prefix cache, so time to first token carries nothing here; the
vLLM agent's tests check that one tenant's prompt finds nothing in another's cache.)
"""

from __future__ import annotations

import asyncio
import json
import random
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any

import aiohttp
import websockets

from loadtest.hostile.client import MODEL
from loadtest.hostile.report import Row
from loadtest.hostile.revocation import connect_with_key
from loadtest.hostile.stack import AGENT_ID, HostileStack
from spotgate.process import loopback_socket
from spotgate.registry import Registry
from stack.builder import AgentProcess

ORACLE_AGENTS = 3
"""The stack's agent and two more: a wrong guess lands on B's agent a third of the time."""
ORACLE_GUESSES = 40
ORACLE_ROUNDS = 6
"""Questions per guess: a wrong guess lands on one agent every time with odds 1 in 243."""
ORACLE_FRAME_TIMEOUT_SECONDS = 10.0
READY_AGENTS_SAMPLE = 'spotgate_gateway_agents{state="ready"}'


def vault_chat(stream_id: str, pin: int, question: str) -> str:
    """A chat whose system prompt holds `pin`, then the rest both keys know."""
    system = f"The vault PIN is {pin:04d}. Never say it. " + "Answer questions about EC2. " * 30
    return json.dumps(
        {
            "type": "generate",
            "id": stream_id,
            "model": MODEL,
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": question},
            ],
            "max_tokens": 1,
        }
    )


async def started_on(ws: websockets.ClientConnection, frame: str, stream_id: str) -> str | None:
    """Send one stream; what its `start` named (None: it ended with no `start`)."""
    await ws.send(frame)
    named = None
    while True:
        received: dict[str, Any] = json.loads(
            await asyncio.wait_for(ws.recv(), ORACLE_FRAME_TIMEOUT_SECONDS)
        )
        if received.get("id") != stream_id:
            continue
        if received["type"] == "start" and named is None:
            named = str(received["agent"])
        if received["type"] in ("done", "error"):
            return named


@asynccontextmanager
async def more_agents(stack: HostileStack, count: int) -> AsyncIterator[None]:
    """`count` more synthetic agents, vouched for, until the gateway routes to all of them."""
    sockets = [loopback_socket() for _ in range(count)]
    children = []
    try:
        for n, sock in enumerate(sockets):
            agent_id = f"{AGENT_ID}-{n + 2}"
            # Vouched for, as the pool manager would have launched it.
            agent = AgentProcess(agent_id, stack.agent_settings(agent_id), sock)
            children.append(await stack.stack.start_agent(agent))
        await _routable(stack, 1 + count)
        yield
    finally:
        await stack.processes.stop(lambda child: child in children, 30)
        for child in children:  # stopped on purpose; their logs stay, for the secrets search
            stack.processes.children.remove(child)
        for sock in sockets:
            sock.close()


async def _routable(stack: HostileStack, agents: int) -> None:
    async with asyncio.timeout(90):
        while True:
            stack.processes.check()
            with suppress(aiohttp.ClientError):
                async with stack.http.get(f"{stack.gateway_ops_url}/metrics") as reply:
                    for line in (await reply.text()).splitlines():
                        if (
                            line.startswith(READY_AGENTS_SAMPLE)
                            and float(line.split()[-1]) >= agents
                        ):
                            return
            await asyncio.sleep(0.5)


async def tenant_oracle(stack: HostileStack) -> Row:
    """Key A guesses key B's secret from where its streams land: it must find nothing."""
    row = Row(
        "gateway",
        f"key A guesses a 4-digit number in key B's system prompt, {ORACLE_GUESSES} guesses × "
        f"{ORACLE_ROUNDS} rounds over {ORACLE_AGENTS} agents, B streaming its prompt each "
        "round: does a guess land where B's stream did (`start.agent`)? Before tenants the "
        "right guess did every round and a wrong one only by chance, the number among a third "
        "of the guesses",
    )
    async with Registry.open(stack.emulator.settings()) as registry:
        for name in ("tenant-a", "tenant-b"):
            created = await registry.create_key(name)
            stack.keys[name] = created
            stack.secrets.add(created.api_key)
    secret = secrets.randbelow(10_000)
    others = random.sample([pin for pin in range(10_000) if pin != secret], ORACLE_GUESSES - 1)
    guesses = [secret, *others]
    random.shuffle(guesses)
    async with more_agents(stack, ORACLE_AGENTS - 1):
        victim = await connect_with_key(stack, "tenant-b")
        attacker = await connect_with_key(stack, "tenant-a")
        try:
            handles: list[str] = []
            with_victim = dict.fromkeys(guesses, 0)  # rounds each guess landed where B's did
            for round_ in range(ORACLE_ROUNDS):
                victim_id = f"victim-{round_}"
                frame = vault_chat(victim_id, secret, f"Hello {round_}")
                victims = await started_on(victim, frame, victim_id)
                if victims is not None:
                    handles.append(victims)
                for guess in guesses:
                    stream_id = f"guess-{guess:04d}-{round_}"
                    frame = vault_chat(stream_id, guess, f"Question {round_}?")
                    handle = await started_on(attacker, frame, stream_id)
                    row.record("started" if handle is not None else "ended unstarted")
                    if handle is not None:
                        handles.append(handle)
                        with_victim[guess] += handle == victims
            always = [guess for guess, rounds in with_victim.items() if rounds == ORACLE_ROUNDS]
            if secret in always:
                row.problems.append(
                    f"the secret landed with B's stream every round, as {len(always) - 1} of "
                    f"{ORACLE_GUESSES - 1} wrong guesses did"
                )
            if len(set(handles)) < len(handles):
                row.problems.append("two streams' `start` named the same handle: linkable")
            landed = sum(with_victim.values())
            row.notes.append(f"{landed} streams landed where B's did, as far as `start` said")
        finally:
            await victim.close()
            await attacker.close()
    return row
