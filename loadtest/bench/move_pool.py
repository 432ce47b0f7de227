"""The move benchmark's agents: one per CPU, each polling an IMDS emulator of its own.

A drained agent exits, as on EC2, and a killed one is gone at once (its process group with
it, as a machine that disappears); either way a fresh agent, with a new agent id and IMDS
emulator, takes its CPU (`Pool.replace`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from loadtest.bench.harness import Server
from loadtest.bench.move_gap_figures import (
    AGENT_EXIT_SECONDS,
    IMDS_POLL_SECONDS,
    LONG_PROMPT_LIMITS,
    MAX_MODEL_LEN,
)
from loadtest.bench.routing_stack import agent_process, agent_server
from spotgate.process import Child, free_port
from spotgate.tokens import SigningKey
from stack.builder import AgentProcess, LocalStack

IMDS_START_SECONDS = 30.0
IMDS_STOP_SECONDS = 30.0


@dataclass
class Slot:
    """A CPU, the agent on it and the IMDS emulator that agent polls."""

    cpu: int
    agent: Server
    agent_id: str
    imds: Child
    imds_url: str
    process: AgentProcess  # how the agent was started (its socket, closed once it is gone)


class Pool:
    """An agent per CPU, each with an IMDS emulator of its own; a drained or killed one replaced."""

    def __init__(
        self,
        stack: LocalStack,
        model: Path,
        key: SigningKey,
        issuer: str,
        imds_poll_seconds: float = IMDS_POLL_SECONDS,
    ) -> None:
        self._stack, self._model, self._key, self._issuer = stack, model, key, issuer
        self._imds_poll_seconds = imds_poll_seconds
        self._serial = 0
        self.slots: list[Slot] = []

    async def start(self, cpu: int) -> Slot:
        """A fresh IMDS emulator and agent on `cpu`, vouched for as the pool manager would."""
        n, self._serial = self._serial, self._serial + 1
        port = free_port()
        command = ["gpu_agent.imds_emulator", "--port", str(port)]
        command += ["--instance-id", f"i-bench{n:04d}"]
        imds = self._stack.processes.start(f"imds-{n + 1}", command, {})
        await self._stack.wait_accepting(port, imds, IMDS_START_SECONDS)
        imds_url = f"http://127.0.0.1:{port}"
        agent = agent_process(
            self._model,
            self._key,
            self._issuer,
            n,
            cpu,
            imds_url=imds_url,
            imds_poll_seconds=self._imds_poll_seconds,
            max_model_len=MAX_MODEL_LEN,
            limits=LONG_PROMPT_LIMITS,
        )
        await self._stack.start_agent(agent)
        server = agent_server(self._stack, n, agent)
        slot = Slot(cpu, server, agent.agent_id, imds, imds_url, agent)
        self.slots.append(slot)
        return slot

    def slot_of(self, agent_id: str) -> Slot:
        """The slot whose agent registered as `agent_id`."""
        return next(slot for slot in self.slots if slot.agent_id == agent_id)

    def _agent(self, slot: Slot) -> Child:
        processes = self._stack.processes.children
        return next(child for child in processes if child.process is slot.agent.process)

    def kill(self, slot: Slot) -> None:
        """SIGKILL the slot's agent and its process group (its engine): a machine gone."""
        self._stack.processes.kill(self._agent(slot))

    async def replace(self, slot: Slot) -> Slot:
        """Once the drained (or killed) agent has exited, a fresh one on its CPU."""
        processes = self._stack.processes
        agent = self._agent(slot)
        try:
            await asyncio.wait_for(agent.exited(), AGENT_EXIT_SECONDS)
        except TimeoutError:
            raise TimeoutError(f"{slot.agent_id} did not exit after its drain") from None
        await processes.stop(lambda child: child is slot.imds, IMDS_STOP_SECONDS)
        for child in (agent, slot.imds):
            processes.forget(child)
        slot.process.socket.close()
        self.slots.remove(slot)
        return await self.start(slot.cpu)

    def close(self) -> None:
        """Close the agents' sockets (the stack stops their processes)."""
        for slot in self.slots:
            slot.process.socket.close()
