"""The `local` provider: each agent is a subprocess with its own port and IMDS emulator.

It stands in for EC2 in `spotgate up` and the tests. A launch starts an IMDS emulator that
answers with the placement and lifecycle asked for, then an agent (`python -m gpu_agent`)
pointed at it; the agent finds its identity there, warms up and registers, exactly as on an
instance.
Terminating sends SIGTERM (the agent drains, as systemd would make it) and SIGKILLs what
outlasts the drain grace. An interruption notice goes to the agent's IMDS emulator, and the
agent is killed outright at the notice's deadline, as AWS reclaims an instance.

Each instance has a directory of its own under the log directory, its volume: a staged
model is fetched there. Stopping an on-demand instance ends its agent the same way but keeps
the directory and the agent's port (an EC2 instance keeps its volume and private address);
starting it runs a new agent under the same id on them, with an IMDS emulator that says the
instance started then: a warm start, which finds its model already fetched.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field, replace
from pathlib import Path

import aiohttp

from pool_manager.pool_view import Launch, LaunchLifecycle, PlacementKey, PlacementOption
from pool_manager.provider import CapacityRefused, Instance, ProviderError, StoppedInstance
from spotgate.logging import get_logger
from spotgate.process import (
    LISTEN_BACKLOG,
    Child,
    ChildProcesses,
    loopback_socket,
    socket_port,
)
from spotgate.settings import (
    LOCAL_INSTANCE_TYPE,
    AgentSettings,
    LocalPoolSettings,
    PoolModel,
    SharedSettings,
    VllmSettings,
    advertised_url,
    settings_env,
)

LOCAL_PLACEMENTS = (
    PlacementOption(LOCAL_INSTANCE_TYPE, "local-a", 1.0, 3.0),
    PlacementOption(LOCAL_INSTANCE_TYPE, "local-b", 1.0, 3.0),
)
STOP_MARGIN_SECONDS = 10.0  # beyond the agent's own drain grace, before SIGKILL
IMDS_REQUEST_TIMEOUT_SECONDS = 5.0
LAUNCHES_FILE = "local-launches"
"""In the log directory: how many agents this stack's pool managers launched. A pool manager
restarted numbers its agents on from there: the registry refuses an agent id used before."""
NO_SPOT_ZONES_FILE = "no-spot-zones"
"""In the log directory: zones with no spot capacity, one a line, while the file lists them (a
drill): spot launches there are refused as EC2 refuses them (InsufficientInstanceCapacity)."""
INSTANCES_DIR = "instances"
"""In the log directory: one directory per instance (its volume), named by its id."""
MODEL_CACHE_DIR = "models"
"""In an instance's directory: where its agent fetches a staged model."""

log = get_logger(__name__)


@dataclass
class _LocalAgent:
    instance: Instance
    agent: Child
    imds: Child
    imds_url: str
    port: int
    boots: int  # this one included
    stopping: bool = False
    reclaim: asyncio.Task[None] | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


@dataclass
class _StoppedAgent:
    stopped: StoppedInstance
    port: int
    boots: int
    shutdown: asyncio.Task[socket.socket | None]  # its agent draining and exiting; then the
    # port, held (bound, not listening: connections are refused) until it starts again


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
        self._stopped: dict[str, _StoppedAgent] = {}
        self._ending: set[asyncio.Task[socket.socket | None]] = set()  # terminated while stopping
        self._volumes = (Path(settings.log_dir) / INSTANCES_DIR).resolve()
        self._launches = Path(settings.log_dir) / LAUNCHES_FILE
        self._launched = int(self._launches.read_text()) if self._launches.exists() else 0

    async def launch(self, model: str, launch: Launch) -> Instance:
        """Start an IMDS emulator and an agent for `model` in the requested placement."""
        self._served(model)
        if launch.lifecycle == "spot" and launch.zone in self._no_spot_zones():
            raise CapacityRefused(
                launch, f"InsufficientInstanceCapacity: {NO_SPOT_ZONES_FILE} lists the zone"
            )
        self._launched += 1
        self._launches.write_text(str(self._launched))
        agent_id = f"local-{self._launched}"
        volume = self._volumes / agent_id
        shutil.rmtree(volume, ignore_errors=True)  # a new instance's volume is new
        volume.mkdir(parents=True)
        return self._boot(
            model, agent_id, launch.instance_type, launch.zone, launch.lifecycle,
            loopback_socket(), boots=1, for_warm_pool=launch.for_warm_pool,
        )  # fmt: skip

    def _no_spot_zones(self) -> set[str]:
        drill = Path(self._settings.log_dir) / NO_SPOT_ZONES_FILE
        return set(drill.read_text().split()) if drill.exists() else set()

    def _served(self, model: str) -> PoolModel:
        served = next((m for m in self._models if m.name == model), None)
        if served is None:
            names = ", ".join(m.name for m in self._models)
            raise ProviderError(f"the local provider serves {names or 'no model'}, not '{model}'")
        return served

    def _boot(
        self,
        model: str,
        agent_id: str,
        instance_type: str,
        zone: str,
        lifecycle: LaunchLifecycle,
        agent_socket: socket.socket,
        boots: int,
        *,
        for_warm_pool: bool = False,
    ) -> Instance:
        """Run the instance's IMDS emulator and agent, the agent on `agent_socket`."""
        served = self._served(model)
        launched_at = self._clock()  # before either process: its IMDS says so, as EC2's does
        # Bound here to port 0 and handed over: each port is known now and is the child's alone
        # (closed here once it runs: when the child goes, its port refuses connections).
        imds_socket = loopback_socket()
        imds_url = f"http://127.0.0.1:{socket_port(imds_socket)}"
        imds = self._processes.start(
            f"imds-{agent_id}",
            ["gpu_agent.imds_emulator", "--listen-fd", str(imds_socket.fileno()),
             "--instance-id", agent_id, "--instance-type", instance_type,
             "--zone", zone, "--lifecycle", lifecycle,
             "--launched-at", repr(launched_at)],
            {},
            (imds_socket,),
        )  # fmt: skip
        imds_socket.close()
        port = socket_port(agent_socket)
        agent_settings = AgentSettings(
            shared=self._shared,
            agent_id=agent_id,
            port=port,
            listen_fd=agent_socket.fileno(),
            engine=self._settings.engine,
            model=served.source,
            model_cache_dir=str(self._volumes / agent_id / MODEL_CACHE_DIR),
            served_model_name=model,
            # Only what the model's serving sets: the agent's defaults stand for the rest.
            vllm=VllmSettings(**served.serving.model_dump(include=served.serving.model_fields_set)),
            imds_url=imds_url,
            # The placement its IMDS gives too: an agent whose IMDS answers late (a loaded
            # machine) takes its identity from its settings, as one off EC2 does.
            instance_type=instance_type,
            zone=zone,
            lifecycle=lifecycle,
            drain_grace_seconds=self._settings.drain_grace_seconds,
            jwks_url=self._settings.jwks_url,
        )
        env = {**settings_env(agent_settings), **self._settings.agent_env, **served.agent_env}
        # `python -m gpu_agent`, as `spotgate agent` runs it on an instance; a log per boot
        name = f"agent-{agent_id}" if boots == 1 else f"agent-{agent_id}.{boots}"
        agent = self._processes.start(name, ["gpu_agent"], env, (agent_socket,))
        agent_socket.close()
        instance = Instance(
            instance_id=agent_id,
            agent_id=agent_id,
            model=model,
            lifecycle=lifecycle,
            instance_type=instance_type,
            zone=zone,
            launched_at=launched_at,
            url=advertised_url(agent_settings),
            boot="cold" if boots == 1 else "warm",
            for_warm_pool=for_warm_pool,
        )
        self._agents[agent_id] = _LocalAgent(instance, agent, imds, imds_url, port, boots)
        return instance

    async def instances(self) -> list[Instance]:
        """Agents whose process still runs and that were not told to stop."""
        for agent_id, local in list(self._agents.items()):
            if not local.agent.running:  # exited (drained, crashed or reclaimed): it ended
                self._forget(local)
                del self._agents[agent_id]
                shutil.rmtree(self._volumes / agent_id, ignore_errors=True)
        return [local.instance for local in self._agents.values() if not local.stopping]

    def _forget(self, local: _LocalAgent) -> None:
        """Its agent has exited: its IMDS emulator goes, and neither is tracked any more."""
        self._processes.kill(local.imds)
        self._processes.forget(local.agent)
        self._processes.forget(local.imds)

    async def terminate(self, instance_id: str) -> None:
        """SIGTERM the agent (it drains), SIGKILL it after the grace; idempotent.

        A stopped instance's directory goes at once (and its port is let go).
        """
        stopped = self._stopped.pop(instance_id, None)
        if stopped is not None:
            self._ending.add(stopped.shutdown)  # held: a task nothing holds may be collected
            stopped.shutdown.add_done_callback(self._ending.discard)
            stopped.shutdown.add_done_callback(_release_port)
            shutil.rmtree(self._volumes / instance_id, ignore_errors=True)
            return
        local = self._agents.get(instance_id)
        if local is None or local.stopping:
            return
        local.stopping = True
        local.tasks.append(asyncio.create_task(self._stop_agent(local), name=f"stop {instance_id}"))

    async def _stop_agent(self, local: _LocalAgent) -> None:
        grace = self._settings.drain_grace_seconds + STOP_MARGIN_SECONDS
        await self._processes.stop(lambda child: child is local.agent, grace)

    # -- the warm pool --

    async def stop(self, instance_id: str) -> None:
        """End the agent as `terminate` does, keeping the instance's directory and port."""
        local = self._agents.get(instance_id)
        if local is None or local.stopping:
            raise ProviderError(f"stop {instance_id}: no such running instance")
        if local.instance.lifecycle == "spot":  # as EC2 answers: a spot instance cannot stop
            raise ProviderError(f"stop {instance_id}: a spot instance cannot be stopped")
        local.stopping = True
        del self._agents[instance_id]
        if local.reclaim is not None:
            local.reclaim.cancel()
        instance = local.instance
        self._stopped[instance_id] = _StoppedAgent(
            StoppedInstance(
                instance_id=instance_id,
                agent_id=instance.agent_id,
                model=instance.model,
                instance_type=instance.instance_type,
                zone=instance.zone,
                stopped_at=self._clock(),
                url=instance.url,
            ),
            local.port,
            local.boots,
            asyncio.create_task(self._shut_down(local), name=f"stop {instance_id}"),
        )

    async def _shut_down(self, local: _LocalAgent) -> socket.socket | None:
        """The agent drains and exits; then its port is held for its next boot."""
        await self._stop_agent(local)
        self._forget(local)
        return _hold_port(local.port)

    async def start(self, stopped: StoppedInstance) -> Instance:
        """A new agent on the stopped instance's directory and port: a warm start."""
        entry = self._stopped.get(stopped.instance_id)
        if entry is None:
            raise ProviderError(f"start {stopped.instance_id}: no such stopped instance")
        if not entry.shutdown.done():
            raise ProviderError(f"start {stopped.instance_id}: it is still stopping")
        held = entry.shutdown.result()
        try:
            if held is None:  # someone took the port while it was down: try it again
                held = loopback_socket(entry.port)
            else:
                held.listen(LISTEN_BACKLOG)
        except OSError as err:
            raise ProviderError(
                f"start {stopped.instance_id}: its port {entry.port} is taken ({err})"
            ) from err
        del self._stopped[stopped.instance_id]
        return self._boot(
            stopped.model, stopped.agent_id, stopped.instance_type, stopped.zone,
            "on-demand", held, boots=entry.boots + 1,
        )  # fmt: skip

    async def stopped(self) -> list[StoppedInstance]:
        """The instances stopped (or stopping) into the warm pool."""
        return [
            replace(entry.stopped, stopping=not entry.shutdown.done())
            for entry in self._stopped.values()
        ]

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
        # Agents of stopped instances still stopping end now (killed with the rest below).
        for shutdown in [*(entry.shutdown for entry in self._stopped.values()), *self._ending]:
            shutdown.cancel()
            with suppress(asyncio.CancelledError):
                await shutdown
            _release_port(shutdown)
        self._processes.close()
        self._agents.clear()
        self._stopped.clear()


def _hold_port(port: int) -> socket.socket | None:
    """A socket bound to `port`, not listening: the port stays ours, connections are refused.

    As to a stopped instance. None when another process took the port meanwhile.
    """
    held = socket.socket()
    held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        held.bind(("127.0.0.1", port))
    except OSError:
        held.close()
        return None
    return held


def _release_port(shutdown: asyncio.Task[socket.socket | None]) -> None:
    """Let go of a stopped instance's port, once its agent has exited."""
    if shutdown.done() and not shutdown.cancelled() and shutdown.exception() is None:
        held = shutdown.result()
        if held is not None:
            held.close()
