"""The reconcile loop's body: read the world, ask the policy, carry out its actions.

Each pass joins what the provider runs (instances) with what the registry knows (agents:
state, heartbeat, load) and what gateways publish (demand), and carries out each model's
`pool_manager.reconcile.ReconcilePass` (sizing, reaping, placement, the retry after a capacity
refusal), the pure step the simulator runs too. Interruption events are handled before the pass that
follows them, so a replacement is launched in the same loop iteration.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field, replace

from pool_manager.events import PoolEvent
from pool_manager.launches import launch_record, vouched_capacity
from pool_manager.policy import (
    Action,
    AgentPhase,
    Drain,
    HedgedSpotPolicy,
    Launch,
    PlacementKey,
    Policy,
    PolicySettings,
    PoolAgent,
    Sizing,
    Terminate,
)
from pool_manager.provider import CapacityRefused, Instance, Provider, ProviderError
from pool_manager.reconcile import (
    DRAIN_DEADLINE_SECONDS,
    RISKY_PLACEMENT_SECONDS,
    ReconcilePass,
    note_interruption,
    pool_target,
)
from spotgate.logging import get_logger
from spotgate.registry import (
    AgentRecord,
    AgentState,
    Demand,
    Registry,
    RegistryError,
)

SPOT_PRICES_READ_SECONDS = 300.0  # EC2 publishes a new spot price at most every few minutes
STOPPED_INSTANCE_STATES = frozenset({"shutting-down", "terminated", "stopping", "stopped"})

log = get_logger(__name__)

_PHASES: dict[AgentState, AgentPhase] = {
    AgentState.STARTING: "starting",
    AgentState.READY: "ready",
    AgentState.DRAINING: "draining",
    AgentState.GONE: "draining",
}


def pool_agent(instance: Instance, record: AgentRecord | None, now: float) -> PoolAgent:
    """The policy's view of one instance and its registry entry (None: still booting)."""
    if record is None:
        return PoolAgent(
            agent_id=instance.agent_id,
            lifecycle=instance.lifecycle,
            instance_type=instance.instance_type,
            zone=instance.zone,
            phase="starting",
            launched_at=instance.launched_at,
        )
    gone = record.state is AgentState.GONE
    return PoolAgent(
        agent_id=instance.agent_id,
        lifecycle=instance.lifecycle,
        instance_type=instance.instance_type,
        zone=instance.zone,
        phase=_PHASES[record.state],
        launched_at=instance.launched_at,
        active_streams=0 if gone else record.active,
        heartbeat_at=record.heartbeat_at,
        drain_deadline=now if gone else record.drain_deadline,
        ready_at=record.ready_at,
        at_risk=record.rebalance_at is not None,
    )


@dataclass(frozen=True)
class PassReport:
    """What one reconcile pass did (for logs, metrics and tests)."""

    targets: Mapping[str, int]
    actions: Sequence[Action]
    refused: Sequence[Launch]
    agents: Sequence[tuple[str, PoolAgent]]  # (model, agent) once the pass was done


@dataclass
class PoolController:
    """Keeps each model's pool at its target through a provider."""

    registry: Registry
    provider: Provider
    settings: PolicySettings  # the pool's: every placement (spot prices), each model's default
    models: Sequence[str] = ()  # served: sized by demand; any other model's agents are drained
    model_settings: Mapping[str, PolicySettings] = field(default_factory=dict)  # of each model
    risky_placement_seconds: float = RISKY_PLACEMENT_SECONDS
    policy: Policy = field(default_factory=HedgedSpotPolicy)
    clock: Callable[[], float] = time.time
    sizing: dict[str, Sizing] = field(default_factory=dict)
    risky_until: dict[PlacementKey, float] = field(default_factory=dict)
    on_demand_refused_until: dict[PlacementKey, float] = field(default_factory=dict)
    spot_prices: dict[PlacementKey, float] = field(default_factory=dict)
    # Agents whose launch record this run of the manager has written, or cannot write.
    vouched: set[str] = field(default_factory=set)
    unvouched: set[str] = field(default_factory=set)
    _prices_read_at: float | None = None

    async def reconcile(self) -> PassReport:
        """One pass over every model the pool serves or is asked for."""
        now = self.clock()
        await self._read_spot_prices(now)
        records = {r.agent_id: r for r in await self.registry.list_agents(include_expired=True)}
        instances = await self.provider.instances()
        for instance in instances:  # after a restart, or a write that failed, once more
            await self._vouch(instance)
        demand = await self.registry.read_demand()
        fixed = await self.registry.read_pool_targets()
        served = {*self.models, *self.model_settings}
        models = sorted(served | set(demand) | set(fixed) | {i.model for i in instances})
        targets: dict[str, int] = {}
        done: list[Action] = []
        refused: list[Launch] = []
        agents: list[tuple[str, PoolAgent]] = []
        for model in models:
            settings = self._settings_of(model)
            scaled = fixed.get(model) if model in served else None  # `pool scale` of any name
            targets[model] = self._size(model, demand.get(model, Demand()), scaled, now, settings)
            mine = [i for i in instances if i.model == model]
            acted, denied = await self._converge(
                model, targets[model], mine, records, now, settings
            )
            done += acted
            refused += denied
            agents += [(model, pool_agent(i, records.get(i.agent_id), now)) for i in mine]
        return PassReport(targets=targets, actions=done, refused=refused, agents=agents)

    async def handle_event(self, event: PoolEvent) -> None:
        """Act on one EC2 event: an interruption drains the agent and marks its placement."""
        instances = {i.instance_id: i for i in await self.provider.instances()}
        instance = instances.get(event.instance_id)
        if instance is None:
            log.info("event for an instance outside the pool", kind=event.kind)
            return
        agent_id = instance.agent_id
        try:
            if event.kind == "interruption":
                deadline = event.deadline if event.deadline is not None else event.at
                self.risky_until = note_interruption(
                    self.risky_until, instance.placement, self.clock(), self.risky_placement_seconds
                )
                await self.provider.interruption_noticed(instance.instance_id, deadline)
                await self.registry.set_draining(agent_id, deadline)
                log.info("spot interruption: draining", agent_id=agent_id, deadline=deadline)
            elif event.kind == "rebalance":
                await self.registry.record_rebalance(agent_id, event.at)
                log.info("rebalance recommended: replacing first", agent_id=agent_id)
            elif event.state in STOPPED_INSTANCE_STATES:
                await self._forget(agent_id)  # first: an agent never registered has no row
                await self.registry.set_gone(agent_id)
                log.info("instance stopped: agent gone", agent_id=agent_id, state=event.state)
        except RegistryError as err:  # not registered yet, or already gone: nothing to undo
            log.info("event needed no registry change", agent_id=agent_id, error=str(err))

    async def _read_spot_prices(self, now: float) -> None:
        """Spot prices move: read them again every `SPOT_PRICES_READ_SECONDS`.

        A failed read keeps the last ones (or the configured ones): placement still works.
        """
        if (
            self._prices_read_at is not None
            and now - self._prices_read_at < SPOT_PRICES_READ_SECONDS
        ):
            return
        self._prices_read_at = now
        try:
            self.spot_prices = await self.provider.spot_prices(
                [placement.key for placement in self.settings.placements]
            )
        except ProviderError as err:
            log.warning("spot prices unread; placing by the last known", error=str(err))

    def _settings_of(self, model: str) -> PolicySettings:
        """The model's own settings; a model the pool does not serve gets no agents."""
        if model in self.model_settings:
            return self.model_settings[model]
        if model in self.models:
            return self.settings
        return replace(self.settings, min_agents=0, max_agents=0)

    def _size(
        self, model: str, demand: Demand, fixed: int | None, now: float, settings: PolicySettings
    ) -> int:
        sizing = pool_target(
            self.sizing.get(model, Sizing()), demand.pending, demand.active, fixed, now, settings
        )
        self.sizing[model] = sizing
        return sizing.target

    async def _converge(
        self,
        model: str,
        target: int,
        instances: list[Instance],
        records: dict[str, AgentRecord],
        now: float,
        settings: PolicySettings,
    ) -> tuple[list[Action], list[Launch]]:
        step = ReconcilePass(
            policy=self.policy,
            settings=settings,
            now=now,
            target=target,
            agents=[pool_agent(i, records.get(i.agent_id), now) for i in instances],
            risky_until=self.risky_until,
            risky_seconds=self.risky_placement_seconds,
            on_demand_refused_until=self.on_demand_refused_until,
            spot_prices=self.spot_prices,
        )
        done: list[Action] = []
        refused: list[Launch] = []
        while actions := step.next_actions():
            for action in actions:
                if isinstance(action, Launch):
                    try:
                        launched = await self.provider.launch(model, action)
                    except CapacityRefused as err:
                        log.info("launch refused; trying another placement", reason=str(err))
                        step.refused(action)
                        refused.append(action)
                        continue
                    except ProviderError as err:
                        log.warning("launch failed", model=model, error=str(err))
                        continue
                    instances.append(launched)
                    await self._vouch(launched)
                    step.launched(pool_agent(launched, None, now))
                    log.info("launched", agent_id=launched.agent_id, model=model,
                             lifecycle=action.lifecycle, zone=action.zone)  # fmt: skip
                elif isinstance(action, Drain):
                    await self._drain(action, records, now)
                    if (instance := _instance_of(action.agent_id, instances)) is not None:
                        step.drained(pool_agent(instance, records.get(action.agent_id), now))
                else:
                    await self._terminate(action, instances, records)
                    step.terminated(action.agent_id)
                done.append(action)
        self.risky_until = step.risky_until
        self.on_demand_refused_until = step.on_demand_refused_until
        return done, refused

    async def _drain(self, action: Drain, records: dict[str, AgentRecord], now: float) -> None:
        try:
            outcome = await self.registry.set_draining(
                action.agent_id, now + DRAIN_DEADLINE_SECONDS
            )
        except RegistryError as err:
            log.info("drain skipped", agent_id=action.agent_id, error=str(err))
            return
        records[action.agent_id] = outcome.record
        log.info("draining", agent_id=action.agent_id, reason=action.reason)

    async def _terminate(
        self, action: Terminate, instances: list[Instance], records: dict[str, AgentRecord]
    ) -> None:
        instance = _instance_of(action.agent_id, instances)
        if instance is None:
            return
        try:
            await self.provider.terminate(instance.instance_id)
        except ProviderError as err:
            log.warning("terminate failed", agent_id=action.agent_id, error=str(err))
            return
        instances.remove(instance)
        if action.agent_id in records:
            with suppress(RegistryError):  # already gone: nothing routes to it
                await self.registry.set_gone(action.agent_id)
        await self._forget(action.agent_id)
        log.info("terminated", agent_id=action.agent_id, reason=action.reason)

    async def _vouch(self, instance: Instance) -> None:
        """Write the launch record of an instance of the pool, once per run of the manager.

        Gateways route to no agent without one. An instance of a type no placement names any
        more (or of no model) gets none: nothing vouches for what it serves.
        """
        if instance.agent_id in self.vouched or not instance.model:
            return
        placements = self._settings_of(instance.model).placements
        capacity = vouched_capacity(placements, instance.instance_type)
        if capacity is None:
            if instance.agent_id not in self.unvouched:  # once: it is listed every pass
                self.unvouched.add(instance.agent_id)
                log.warning(
                    "no launch record: the instance type is not in the placements",
                    agent_id=instance.agent_id,
                    instance_type=instance.instance_type,
                )
            return
        await self.registry.record_launch(launch_record(instance, capacity))
        self.vouched.add(instance.agent_id)

    async def _forget(self, agent_id: str) -> None:
        """The instance is ended: its launch record goes (its id is never launched again)."""
        await self.registry.forget_launch(agent_id)
        self.vouched.discard(agent_id)
        self.unvouched.discard(agent_id)


def _instance_of(agent_id: str, instances: Sequence[Instance]) -> Instance | None:
    return next((i for i in instances if i.agent_id == agent_id), None)
