"""The `local` provider: each agent is a subprocess with its own port and IMDS emulator.

It stands in for EC2 in `spotgate up` and the tests. A launch starts an IMDS emulator that
answers with the placement and lifecycle asked for, then an agent (`python -m gpu_agent`)
pointed at it; the agent finds its identity there, warms up and registers, exactly as on an
instance.
Terminating sends SIGTERM (the agent drains, as systemd would make it) and SIGKILLs what
outlasts the drain grace. An interruption notice goes to the agent's IMDS emulator, and the
agent is killed outright at the notice's deadline, as AWS reclaims an instance.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from pool_manager.policy import Launch, PlacementKey, PlacementOption
from pool_manager.provider import Instance, ProviderError
from spotgate.logging import get_logger
from spotgate.process import Child, ChildProcesses, loopback_socket, socket_port
from spotgate.settings import (
    AgentSettings,
    LocalPoolSettings,
    PoolModel,
    SharedSettings,
    advertised_url,
    settings_env,
)

LOCAL_INSTANCE_TYPE = "local"
LOCAL_PLACEMENTS = (
    PlacementOption(LOCAL_INSTANCE_TYPE, "local-a", 1.0, 3.0),
    PlacementOption(LOCAL_INSTANCE_TYPE, "local-b", 1.0, 3.0),
)
STOP_MARGIN_SECONDS = 10.0  # beyond the agent's own drain grace, before SIGKILL
IMDS_REQUEST_TIMEOUT_SECONDS = 5.0
LAUNCHES_FILE = "local-launches"
"""In the log directory: how many agents this stack's pool managers launched. A pool manager
restarted numbers its agents on from there: the registry refuses an agent id used before."""

log = get_logger(__name__)


@dataclass
class _LocalAgent:
    instance: Instance
    agent: Child
    imds: Child
    imds_url: str
    stopping: bool = False
    reclaim: asyncio.Task[None] | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


class LocalProvider:
    """Agents as child processes of the pool manager."""

    def __init__(
        self,
        shared: SharedSettings,
        settings: LocalPoolSettings,
        models: Sequence[PoolModel],
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._shared = shared
        self._settings = settings
        self._models = tuple(models)
        self._processes = ChildProcesses(Path(settings.log_dir))
        self._clock = clock
        self._agents: dict[str, _LocalAgent] = {}
        self._launches = Path(settings.log_dir) / LAUNCHES_FILE
        self._launched = int(self._launches.read_text()) if self._launches.exists() else 0

    async def launch(self, model: str, launch: Launch) -> Instance:
        """Start an IMDS emulator and an agent for `model` in the requested placement."""
        served = next((m for m in self._models if m.name == model), None)
        if served is None:
            names = ", ".join(m.name for m in self._models)
            raise ProviderError(f"the local provider serves {names or 'no model'}, not '{model}'")
        self._launched += 1
        self._launches.write_text(str(self._launched))
        agent_id = f"local-{self._launched}"
        launched_at = self._clock()  # before either process: its IMDS says so, as EC2's does
        # Bound here to port 0 and handed over: each port is known now and is the child's alone
        # (closed here once it runs: when the child goes, its port refuses connections).
        imds_socket, agent_socket = loopback_socket(), loopback_socket()
        imds_url = f"http://127.0.0.1:{socket_port(imds_socket)}"
        imds = self._processes.start(
            f"imds-{agent_id}",
            ["gpu_agent.imds_emulator", "--listen-fd", str(imds_socket.fileno()),
             "--instance-id", agent_id, "--instance-type", launch.instance_type,
             "--zone", launch.zone, "--lifecycle", launch.lifecycle,
             "--launched-at", repr(launched_at)],
            {},
            (imds_socket,),
        )  # fmt: skip
        imds_socket.close()
        agent_settings = AgentSettings(
            shared=self._shared,
            agent_id=agent_id,
            port=socket_port(agent_socket),
            listen_fd=agent_socket.fileno(),
            engine=self._settings.engine,
            model=served.source,
            served_model_name=model,
            imds_url=imds_url,
            drain_grace_seconds=self._settings.drain_grace_seconds,
            jwks_url=self._settings.jwks_url,
        )
        env = {**settings_env(agent_settings), **self._settings.agent_env, **served.agent_env}
        # `python -m gpu_agent`, as `spotgate agent` runs it on an instance
        agent = self._processes.start(f"agent-{agent_id}", ["gpu_agent"], env, (agent_socket,))
        agent_socket.close()
        instance = Instance(
            instance_id=agent_id,
            agent_id=agent_id,
            model=model,
            lifecycle=launch.lifecycle,
            instance_type=launch.instance_type,
            zone=launch.zone,
            launched_at=launched_at,
            url=advertised_url(agent_settings),
        )
        self._agents[agent_id] = _LocalAgent(instance, agent, imds, imds_url)
        return instance

    async def instances(self) -> list[Instance]:
        """Agents whose process still runs and that were not told to stop."""
        for agent_id, local in list(self._agents.items()):
            if not local.agent.running:  # exited (drained, crashed or reclaimed)
                self._processes.kill(local.imds)
                self._processes.forget(local.agent)
                self._processes.forget(local.imds)
                del self._agents[agent_id]
        return [local.instance for local in self._agents.values() if not local.stopping]

    async def terminate(self, instance_id: str) -> None:
        """SIGTERM the agent (it drains), SIGKILL it after the grace; idempotent."""
        local = self._agents.get(instance_id)
        if local is None or local.stopping:
            return
        local.stopping = True
        grace = self._settings.drain_grace_seconds + STOP_MARGIN_SECONDS
        stop = self._processes.stop(lambda child: child is local.agent, grace)
        local.tasks.append(asyncio.create_task(stop, name=f"stop {instance_id}"))

    async def interruption_noticed(self, instance_id: str, deadline: float) -> None:
        """Give the agent its spot notice through IMDS, and reclaim it at the deadline."""
        local = self._agents.get(instance_id)
        if local is None or local.reclaim is not None:
            return
        in_seconds = max(0.0, deadline - self._clock())
        timeout = aiohttp.ClientTimeout(total=IMDS_REQUEST_TIMEOUT_SECONDS)
        try:
            async with aiohttp.ClientSession(timeout=timeout) as http:
                url = f"{local.imds_url}/_emulator/spot-notice"
                async with http.post(url, json={"in_seconds": in_seconds}) as response:
                    response.raise_for_status()
        except (aiohttp.ClientError, TimeoutError) as err:
            log.warning("could not give the spot notice", agent_id=instance_id, error=str(err))
        local.reclaim = asyncio.create_task(
            self._reclaim_at(local, deadline), name=f"reclaim {instance_id}"
        )

    async def _reclaim_at(self, local: _LocalAgent, deadline: float) -> None:
        await asyncio.sleep(max(0.0, deadline - self._clock()))
        log.info("reclaiming interrupted agent", agent_id=local.instance.agent_id)
        self._processes.kill(local.agent)

    async def spot_prices(self, placements: Sequence[PlacementKey]) -> dict[PlacementKey, float]:
        """None: local agents cost what the placements say."""
        return {}

    async def close(self) -> None:
        """Stop every agent (draining them) and its IMDS emulator."""
        for local in self._agents.values():
            local.stopping = True
            if local.reclaim is not None:
                local.reclaim.cancel()
        grace = self._settings.drain_grace_seconds + STOP_MARGIN_SECONDS
        agents = {id(local.agent) for local in self._agents.values()}
        await self._processes.stop(lambda child: id(child) in agents, grace)
        for local in self._agents.values():
            for task in local.tasks:
                task.cancel()
                with suppress(asyncio.CancelledError):
                    await task
        self._processes.close()
        self._agents.clear()
