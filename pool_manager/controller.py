"""The reconcile loop's body: read the world, ask the policy, carry out its actions.

Each pass joins what the provider runs (instances) and keeps stopped (each model's warm
pool) with what the registry knows (agents: state, heartbeat, load) and what gateways publish
(demand), and carries out each model's `pool_manager.reconcile.ReconcilePass` (sizing,
reaping, placement, the retry after a capacity refusal, the warm pool), the pure step the
simulator runs too. Interruption events are handled before the pass that follows them, so a
replacement is launched in the same loop iteration.

A warm start reuses the instance and so its agent's id: the pool manager removes the `gone`
entry of its last boot just before starting it, so the new boot registers afresh (nothing
else may remove an entry, and only a `gone` one), and marks the new boot warm once its agent
has registered.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field, replace

from pool_manager.agent_view import pool_agent
from pool_manager.events import PoolEvent
from pool_manager.launches import launch_record, vouched_capacity
from pool_manager.policy import HedgedSpotPolicy, Policy
from pool_manager.pool_view import (
    Action,
    Drain,
    Launch,
    PlacementKey,
    PolicySettings,
    PoolAgent,
    Sizing,
    StartWarm,
    StopToWarm,
    Terminate,
    TerminateWarm,
    WarmAction,
    WarmInstance,
)
from pool_manager.provider import (
    CapacityRefused,
    Instance,
    Provider,
    ProviderError,
    StartRefused,
    StoppedInstance,
)
from pool_manager.reconcile import (
    DRAIN_DEADLINE_SECONDS,
    RISKY_PLACEMENT_SECONDS,
    ReconcilePass,
    model_sizing,
    note_interruption,
)
from pool_manager.sizing import sizing_on_start
from pool_manager.start_failures import LAUNCHES_HELD_LOG_EVENT, StartFailures, note_starts
from spotgate.logging import get_logger
from spotgate.registry import (
    AgentNotFound,
    AgentRecord,
    AgentState,
    Demand,
    Registry,
    RegistryError,
)

SPOT_PRICES_READ_SECONDS = 300.0  # EC2 publishes a new spot price at most every few minutes
STOPPED_INSTANCE_STATES = frozenset({"shutting-down", "terminated", "stopping", "stopped"})

log = get_logger(__name__)


@dataclass(frozen=True)
class PassReport:
    """What one reconcile pass did (for logs, metrics and tests)."""

    targets: Mapping[str, int]
    actions: Sequence[Action | WarmAction]
    refused: Sequence[Launch]
    agents: Sequence[tuple[str, PoolAgent]]  # (model, agent) once the pass was done
    warm: Sequence[tuple[str, WarmInstance]] = ()  # (model, stopped instance) likewise
    warm_started: frozenset[str] = frozenset()  # agents booting or serving after a warm start
    held: Mapping[str, str] = field(default_factory=dict)  # model: why its launches are held


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
    backlog_sizing: dict[str, Sizing] = field(default_factory=dict)  # batch work's spot agents
    risky_until: dict[PlacementKey, float] = field(default_factory=dict)
    on_demand_refused_until: dict[PlacementKey, float] = field(default_factory=dict)
    spot_prices: dict[PlacementKey, float] = field(default_factory=dict)
    # Agents whose launch record this run of the manager has written, or cannot write.
    vouched: set[str] = field(default_factory=set)
    unvouched: set[str] = field(default_factory=set)
    start_failures: dict[str, StartFailures] = field(default_factory=dict)  # of each model
    _prices_read_at: float | None = None

    async def reconcile(self) -> PassReport:
        """One pass over every model the pool serves or is asked for."""
        now = self.clock()
        await self._read_spot_prices(now)
        records = {r.agent_id: r for r in await self.registry.list_agents(include_expired=True)}
        instances = await self.provider.instances()
        stopped = await self.provider.stopped()
        for instance in instances:  # after a restart, or a write that failed, once more
            await self._vouch(instance)
        demand = await self.registry.read_demand()
        fixed = await self.registry.read_pool_targets()
        served = {*self.models, *self.model_settings}
        held = {i.model for i in instances} | {s.model for s in stopped}
        models = sorted(served | set(demand) | set(fixed) | held)
        targets: dict[str, int] = {}
        done: list[Action | WarmAction] = []
        refused: list[Launch] = []
        agents: list[tuple[str, PoolAgent]] = []
        warm_pools: list[tuple[str, WarmInstance]] = []
        warm_started: set[str] = set()
        launches_held: dict[str, str] = {}
        for model in models:
            settings = self._settings_of(model)
            scaled = fixed.get(model) if model in served else None  # `pool scale` of any name
            mine = _Pool(
                [i for i in instances if i.model == model],
                [s for s in stopped if s.model == model],
            )
            if model not in self.sizing:  # this run's first pass: the pool so far was needed
                self.sizing[model] = sizing_on_start(
                    [pool_agent(i, records.get(i.agent_id), now) for i in mine.running],
                    now,
                    settings,
                )
            self.sizing[model], self.backlog_sizing[model] = model_sizing(
                self.sizing.get(model, Sizing()),
                self.backlog_sizing.get(model, Sizing()),
                demand.get(model, Demand()),
                scaled,
                now,
                settings,
            )
            targets[model] = self.sizing[model].target
            # Only the entries of instances it launched: a row anyone wrote holds nothing.
            own = [records[i.agent_id] for i in mine.running if i.agent_id in records]
            if (reason := self._launches_held(model, own, now)) is not None:
                launches_held[model] = reason
            acted, denied = await self._converge(
                model, mine, records, now, settings, held=model in launches_held
            )
            done += acted
            refused += denied
            agents += [(model, pool_agent(i, records.get(i.agent_id), now)) for i in mine.running]
            warm_pools += [(model, s.warm()) for s in mine.stopped]
            warm_started |= {i.agent_id for i in mine.running if i.boot == "warm"}
            await self._record_warm_boots(mine.running, records)
        return PassReport(
            targets=targets,
            actions=done,
            refused=refused,
            agents=agents,
            warm=warm_pools,
            warm_started=frozenset(warm_started),
            held=launches_held,
        )

    def _launches_held(self, model: str, records: Iterable[AgentRecord], now: float) -> str | None:
        """Why the model's launches are held now (its agents keep failing to start), or None.

        `records`: the entries of the model's own instances.
        """
        so_far = self.start_failures.get(model, StartFailures())
        failures = note_starts(so_far, records)
        self.start_failures[model] = failures
        if not failures.is_holding(now) or failures.reason is None:
            return None
        log.warning(
            LAUNCHES_HELD_LOG_EVENT,
            model=model,
            reason=failures.reason,
            failures_in_a_row=failures.in_a_row,
            held_for_seconds=round((failures.held_until() or now) - now),
        )
        return failures.reason

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
                if event.at < instance.launched_at:  # a late word of a boot before this one
                    log.info("stop event older than the instance's start", agent_id=agent_id)
                    return
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
        """The model's own settings; one not served gets no agents, warm pool or batch spot."""
        if model in self.model_settings:
            return self.model_settings[model]
        if model in self.models:
            return self.settings
        return replace(
            self.settings, min_agents=0, max_agents=0, warm_pool_size=0, batch_spot_max_agents=0
        )

    async def _converge(
        self,
        model: str,
        pool: _Pool,
        records: dict[str, AgentRecord],
        now: float,
        settings: PolicySettings,
        *,
        held: bool = False,
    ) -> tuple[list[Action | WarmAction], list[Launch]]:
        """Carry out the model's reconcile pass towards its sizing (and its batch spot)."""
        step = ReconcilePass(
            policy=self.policy,
            settings=settings,
            now=now,
            target=self.sizing[model].target,
            agents=[pool_agent(i, records.get(i.agent_id), now) for i in pool.running],
            risky_until=self.risky_until,
            risky_seconds=self.risky_placement_seconds,
            on_demand_refused_until=self.on_demand_refused_until,
            spot_prices=self.spot_prices,
            warm=[s.warm() for s in pool.stopped],
            launches_held=held,
            batch_spot=self.backlog_sizing[model].target,
        )
        done: list[Action | WarmAction] = []
        refused: list[Launch] = []
        while actions := step.next_round():
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
                    pool.running.append(launched)
                    await self._vouch(launched)
                    step.launched(pool_agent(launched, None, now))
                    log.info("launched", agent_id=launched.agent_id, model=model,
                             lifecycle=action.lifecycle, zone=action.zone,
                             for_warm_pool=action.for_warm_pool)  # fmt: skip
                elif isinstance(action, Drain):
                    await self._drain(action, records, now)
                    if (instance := _instance_of(action.agent_id, pool.running)) is not None:
                        step.drained(pool_agent(instance, records.get(action.agent_id), now))
                elif isinstance(action, Terminate):
                    await self._terminate(action, pool.running, records)
                    step.terminated(action.agent_id)
                elif not await self._carry_out_warm(action, pool, records, step, now):
                    continue
                done.append(action)
        self.risky_until = step.risky_until
        self.on_demand_refused_until = step.on_demand_refused_until
        return done, refused

    async def _carry_out_warm(
        self,
        action: WarmAction,
        pool: _Pool,
        records: dict[str, AgentRecord],
        step: ReconcilePass,
        now: float,
    ) -> bool:
        """Start, stop into or terminate in the model's warm pool; whether it was done."""
        if isinstance(action, StopToWarm):
            instance = _instance_of(action.agent_id, pool.running)
            if instance is None:
                return False
            stopped = await self._stop_to_warm(instance, action.reason, now)
            if stopped is None:
                return False
            pool.running.remove(instance)
            pool.stopped.append(stopped)
            step.stopped(action, stopped.warm())
            return True
        warm = next((s for s in pool.stopped if s.instance_id == action.instance_id), None)
        if warm is None:
            return False
        if isinstance(action, TerminateWarm):
            try:
                await self.provider.terminate(warm.instance_id)
            except ProviderError as err:
                log.warning("terminate failed", instance_id=warm.instance_id, error=str(err))
                return False
            pool.stopped.remove(warm)
            await self._forget(warm.agent_id)  # gone at the stop; after a restart, maybe not
            step.terminated_warm(warm.instance_id)
            log.info("terminated a warm instance", agent_id=warm.agent_id, reason=action.reason)
            return True
        started = await self._start_warm(warm, action, step, records)
        if started is None:
            return False
        pool.stopped.remove(warm)
        pool.running.append(started)
        await self._vouch(started)
        step.started(action, pool_agent(started, None, now))
        log.info("started from the warm pool", agent_id=started.agent_id, reason=action.reason)
        return True

    async def _stop_to_warm(
        self, instance: Instance, reason: str, now: float
    ) -> StoppedInstance | None:
        """Stop an idle (or drained) on-demand agent's instance into the warm pool.

        As a termination: the agent hands back what it still holds as it shuts down, its
        entry goes `gone` and its launch record goes (it is written again at the start).
        """
        if instance.lifecycle == "spot":  # EC2 stops no spot instance that serves
            log.warning("a spot instance is never stopped", agent_id=instance.agent_id)
            return None
        try:
            await self.provider.stop(instance.instance_id)
        except ProviderError as err:
            log.warning("stop failed", agent_id=instance.agent_id, error=str(err))
            return None
        with suppress(RegistryError):  # never registered (booting): nothing routes to it
            await self.registry.set_gone(instance.agent_id)
        await self._forget(instance.agent_id)
        log.info("stopped into the warm pool", agent_id=instance.agent_id, reason=reason)
        return StoppedInstance(
            instance_id=instance.instance_id,
            agent_id=instance.agent_id,
            model=instance.model,
            instance_type=instance.instance_type,
            zone=instance.zone,
            stopped_at=now,
            url=instance.url,
        )

    async def _start_warm(
        self,
        warm: StoppedInstance,
        action: StartWarm,
        step: ReconcilePass,
        records: dict[str, AgentRecord],
    ) -> Instance | None:
        """Start a stopped instance, its last boot's entry removed first (None: it did not)."""
        try:
            with suppress(AgentNotFound):  # a last boot that never wrote `gone` is ended here
                await self.registry.set_gone(warm.agent_id)
            await self.registry.remove_gone(warm.agent_id)
        except RegistryError as err:
            log.warning("warm start skipped", agent_id=warm.agent_id, error=str(err))
            return None
        records.pop(warm.agent_id, None)  # the last boot's: this one has not registered yet
        try:
            return await self.provider.start(warm)
        except StartRefused as err:
            log.info("warm start refused; covering elsewhere", reason=str(err))
            step.start_refused(action)
        except ProviderError as err:
            log.warning("warm start failed", agent_id=warm.agent_id, error=str(err))
        return None

    async def _record_warm_boots(
        self, instances: Sequence[Instance], records: Mapping[str, AgentRecord]
    ) -> None:
        """Mark the boot of each agent started warm as warm, once it has registered."""
        for instance in instances:
            record = records.get(instance.agent_id)
            if (
                instance.boot == "warm"
                and record is not None
                and record.state is not AgentState.GONE
                and record.boot_kind != "warm"
            ):
                try:
                    await self.registry.record_warm_boot(instance.agent_id)
                except RegistryError as err:  # gone meanwhile: nothing left to mark
                    log.info("warm boot not recorded", agent_id=instance.agent_id, error=str(err))

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


@dataclass
class _Pool:
    """One model's instances during a pass: running, and stopped (its warm pool)."""

    running: list[Instance]
    stopped: list[StoppedInstance]


def _instance_of(agent_id: str, instances: Sequence[Instance]) -> Instance | None:
    return next((i for i in instances if i.agent_id == agent_id), None)
