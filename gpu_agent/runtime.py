"""The agent's life: load the engine, warm it up, register, heartbeat, drain, leave.

An agent writes `ready` only after a real warm-up generation succeeded (ARCHITECTURE.md). On a
spot notice or SIGTERM it marks itself `draining` at once, refuses new streams, lets streams
that can finish do so, hands the rest back with `interrupted` before the deadline, and exits
marked `gone`.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
import time
from collections.abc import Awaitable, Callable, Hashable
from contextlib import aclosing
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from gpu_agent.drain import StreamLoad, plan_hand_back
from gpu_agent.engine import Engine, EngineConfigError, GenerationRequest, PrefixCacheCounts
from gpu_agent.health import EngineCheck, engine_check
from gpu_agent.imds import ImdsClient, ImdsUnavailable, InstanceIdentity, SpotNotice
from gpu_agent.metrics import AgentMetrics
from gpu_agent.streams import StreamProgress
from spotgate import __version__
from spotgate.logging import get_logger, one_line, redact_text
from spotgate.model_store import fetch_model, is_s3_uri, read_manifest
from spotgate.regions import zone_region
from spotgate.registry import (
    AgentGone,
    AgentRecord,
    AgentState,
    BootPhase,
    BootTimeline,
    Registry,
    RegistryError,
)
from spotgate.settings import AgentSettings, model_store_aws
from spotgate.tasks import ended
from spotgate.wsserver import FrameSocket

DRAIN_CHECK_SECONDS = 1.0
WARMUP_PROMPT = "spotgate warm-up"
WARMUP_TOKENS = 2
IDENTITY_TIMEOUT_SECONDS = 3.0
REGISTER_RETRY_SECONDS = (0.5, 1.0, 2.0, 5.0)
"""Waits between registration attempts: soon at first, then every 5 s until it works."""

log = get_logger(__name__)

Phase = Literal["loading", "warming", "ready", "failed", "draining", "stopped"]
EndReason = Literal["cancelled", "interrupted"]
EngineLoader = Callable[[AgentSettings], Awaitable[Engine]]


def _set_event(event: asyncio.Event) -> asyncio.Event:
    event.set()
    return event


@dataclass(eq=False)
class StreamHandle:
    """A stream being served: its task, how far it got, and why it was ended early."""

    task: asyncio.Task[None]
    progress: StreamProgress
    end_reason: EndReason | None = None
    # Sends the stream's `moving` frame: its gateway moves it make-before-break (`move_early`).
    send_moving: Callable[[], Awaitable[None]] | None = None
    told_to_move: bool = False

    def end(self, reason: EndReason) -> None:
        """End the stream early; its task reports `reason` to the client."""
        if self.end_reason is None:
            self.end_reason = reason
            self.task.cancel()

    async def tell_moving(self) -> None:
        """Tell the gateway to move the stream now; it streams on meanwhile (once)."""
        if self.send_moving is None or self.told_to_move or self.end_reason is not None:
            return
        self.told_to_move = True
        await self.send_moving()

    def load(self, key: Hashable) -> StreamLoad:
        """Remaining work and observed rate, for the drain planner."""
        progress = self.progress
        now = time.monotonic()  # the clock `first_token_at` was read from
        rate = None
        if progress.first_token_at is not None and now > progress.first_token_at:
            produced = max(0, progress.completion_tokens)
            rate = produced / (now - progress.first_token_at) if produced else None
        return StreamLoad(
            key,
            progress.max_tokens - progress.completion_tokens,
            rate,
            moves_early=self.send_moving is not None,
            told_to_move=self.told_to_move,
        )


@dataclass
class AgentIdentity:
    """Who the agent registers as."""

    agent_id: str
    lifecycle: Literal["spot", "on-demand", "local"]
    instance_type: str
    zone: str
    region: str


@dataclass
class AgentRuntime:
    """Everything the agent's handlers and background tasks share."""

    settings: AgentSettings
    registry: Registry
    url: str
    imds: ImdsClient | None = None  # where its identity comes from on EC2
    metrics: AgentMetrics = field(default_factory=AgentMetrics)
    engine: Engine | None = None
    identity: AgentIdentity | None = None
    phase: Phase = "loading"
    failure: str | None = None
    drain_deadline: float | None = None
    # What a drain's deadline (epoch seconds, as IMDS gives it) is read against.
    wall_clock: Callable[[], float] = time.time
    registered: bool = False
    streams: dict[Hashable, StreamHandle] = field(default_factory=dict)
    websockets: set[FrameSocket] = field(default_factory=set)
    stopped: asyncio.Event = field(default_factory=asyncio.Event)
    became_ready: asyncio.Event = field(default_factory=asyncio.Event)
    # Set once the agent's socket takes connections: it registers ready only then, so its port
    # found taken is recorded as its failure, not after a registration (the default: a socket
    # bound and listening before the app starts).
    listening: asyncio.Event = field(default_factory=lambda: _set_event(asyncio.Event()))
    # From the agent's own start (its image ready); the instance's launch comes from IMDS.
    boot: BootTimeline = field(default_factory=lambda: BootTimeline(agent_start=time.time()))
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def __post_init__(self) -> None:
        # Read at each scrape, so the counters follow the engine loaded after this.
        self.metrics.prefix_cache = self._prefix_cache

    def _prefix_cache(self) -> PrefixCacheCounts:
        """The loaded engine's prefix-cache counts; zeros before it is loaded."""
        return self.engine.prefix_cache if self.engine is not None else PrefixCacheCounts()

    @property
    def accepting(self) -> bool:
        """Whether new streams are taken."""
        return self.phase == "ready"

    def spawn(self, coroutine: Awaitable[None], name: str) -> asyncio.Task[None]:
        """Run a background task owned by the runtime (cancelled at shutdown)."""

        async def run() -> None:
            await coroutine

        task = asyncio.create_task(run(), name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def stop_tasks(self) -> None:
        """Cancel every background task and wait for them (`spotgate.tasks.ended`)."""
        await ended(list(self._tasks))

    # -- bring-up --

    async def bring_up(self, loader: EngineLoader) -> None:
        """Identity, engine, warm-up; then register as ready and keep heartbeating.

        Each phase's end goes into the boot timeline the agent registers with.
        """
        self.identity = await self._resolve_identity(self.imds)
        try:
            settings = await self._fetch_staged_model()
            self.engine = await loader(settings)
            self._boot_phase_ended("engine_loaded")
            self.phase = "warming"
            await self._warm_up(self.engine)
            self._boot_phase_ended("warmed_up")
        except EngineConfigError as err:  # the operator's to fix: one line, no traceback
            log.error("engine failed to come up", reason=str(err))  # noqa: TRY400
            await self._failed_to_start(self.identity, str(err))
            return
        except Exception as err:
            log.exception("engine failed to come up")
            await self._failed_to_start(self.identity, f"{type(err).__name__}: {err}")
            return
        if self.phase != "warming":  # a drain began while loading
            return
        await self.listening.wait()
        try:
            await self._register_until_done(self.engine, self.identity)
        except AgentGone as err:
            # Its instance was started again with its last boot's entry still `gone` (by hand:
            # the pool manager removes that entry first), which no agent may bring back.
            log.error("cannot register; stopping", reason=str(err))  # noqa: TRY400
            self._stop_as_gone()
            return
        if self.phase != "warming":  # a drain began while the registry was out of reach
            return
        self.phase = "ready"
        self.became_ready.set()
        self.metrics.ready.set(1)
        self._boot_phase_ended("ready")
        log.info("agent ready", agent_id=self.identity.agent_id, url=self.url)
        self.spawn(self._heartbeat_forever(self.identity.agent_id), "heartbeat")
        self.spawn(self._check_engine_forever(self.engine), "engine-check")

    async def _fetch_staged_model(self) -> AgentSettings:
        """The settings to load the engine with, a staged model (`s3://`) ready for it.

        `model_fetch: download` fetches it to disk first; `stream` checks it was staged whole
        and leaves the weights to vLLM's streaming loader. Its name stays what clients ask
        for: `served_model_name`, else the URI.
        """
        settings = self.settings
        if not is_s3_uri(settings.model):
            return settings
        served = settings.served_model_name or settings.model
        if settings.model_fetch == "stream":  # vLLM streams the weights: only check it is whole
            await read_manifest(settings.model, model_store_aws(settings))
            return settings.model_copy(update={"served_model_name": served})
        log.info("fetching the staged model", model=settings.model)
        local = await fetch_model(
            settings.model, Path(settings.model_cache_dir), model_store_aws(settings)
        )
        self._boot_phase_ended("weights_ready")
        log.info("staged model fetched", model=settings.model, directory=str(local))
        return settings.model_copy(update={"model": str(local), "served_model_name": served})

    def _boot_phase_ended(self, phase: BootPhase) -> None:
        self.boot = replace(self.boot, **{phase: time.time()})
        for name, seconds in self.boot.elapsed_seconds().items():
            self.metrics.boot.labels(phase=name).set(seconds)

    async def _resolve_identity(self, imds: ImdsClient | None) -> AgentIdentity:
        settings = self.settings
        found: InstanceIdentity | None = None
        if imds is not None:
            try:
                async with asyncio.timeout(IDENTITY_TIMEOUT_SECONDS):
                    found = await imds.identity()
            except (ImdsUnavailable, TimeoutError) as err:
                log.info("no instance identity from IMDS; using settings", reason=str(err))
        if found is not None:
            if found.launched_at:
                self.boot = replace(self.boot, instance_start=found.launched_at)
            lifecycle: Literal["spot", "on-demand", "local"] = (
                "spot" if found.lifecycle == "spot" else "on-demand"
            )
            return AgentIdentity(
                settings.agent_id or found.agent_id,
                lifecycle,
                found.instance_type,
                found.zone,
                found.region,
            )
        return AgentIdentity(
            settings.agent_id or f"local-{secrets.token_hex(4)}",
            settings.lifecycle,
            settings.instance_type,
            settings.zone,
            zone_region(settings.zone),
        )

    @staticmethod
    async def _warm_up(engine: Engine, tokens: int = WARMUP_TOKENS) -> None:
        """One real generation; raises if the engine produced nothing."""
        request = GenerationRequest(
            request_id=f"warm-up-{secrets.token_hex(4)}",
            prompt_ids=engine.text_prompt_ids(WARMUP_PROMPT),
            max_tokens=tokens,
            temperature=0.0,
        )
        produced = 0
        async with aclosing(engine.generate(request)) as steps:
            async for step in steps:
                produced += len(step.token_ids)
        if produced == 0:
            raise RuntimeError("warm-up generation produced no tokens")

    async def _register(self, engine: Engine, identity: AgentIdentity) -> None:
        await self.registry.register(
            replace(
                self._record(identity, AgentState.READY),
                model=engine.model,
                capacity=engine.capacity,
                engine=engine.kind,
                max_model_len=engine.max_model_len,
                max_token_chars=engine.max_token_chars,
            )
        )
        self.registered = True

    def _record(self, identity: AgentIdentity, state: AgentState) -> AgentRecord:
        """The agent's registry entry, as far as it is known before the engine is."""
        return AgentRecord(
            agent_id=identity.agent_id,
            url=self.url,
            model=self.settings.served_name,
            state=state,
            capacity=0,
            lifecycle=identity.lifecycle,
            instance_type=identity.instance_type,
            region=identity.region,
            zone=identity.zone,
            started_at=time.time(),
            engine=self.settings.engine,
            version=__version__,
            boot=self.boot,  # the registry writes its `ready`
        )

    async def cannot_serve(self, reason: str) -> None:
        """Its port taken, the agent can serve nothing: stop bringing it up, fail saying why."""
        await self.stop_tasks()
        identity = self.identity or await self._resolve_identity(self.imds)
        await self._failed_to_start(identity, reason)

    async def _failed_to_start(self, identity: AgentIdentity, reason: str) -> None:
        """Fail for good: `/healthz` and the registry (its entry `gone`) say why in one line.

        The pool manager reaps an agent gone; `spotgate up` and `pool status` show the line.
        """
        self.phase, self.failure = "failed", redact_text(one_line(reason))
        try:
            await self.registry.register_failed(
                replace(self._record(identity, AgentState.GONE), failure=self.failure)
            )
        except Exception as err:  # the registry out of reach: `/healthz` still says why
            log.warning("could not record the failed start", error=str(err))

    async def _register_until_done(self, engine: Engine, identity: AgentIdentity) -> None:
        """Register; while the registry cannot be written (an outage at boot), try again.

        A refusal (`RegistryError`: the entry exists and is not ours to overwrite) is final.
        """
        for attempt in itertools.count():
            delay = REGISTER_RETRY_SECONDS[min(attempt, len(REGISTER_RETRY_SECONDS) - 1)]
            try:
                await self._register(engine, identity)
            except RegistryError:
                raise
            except Exception as err:  # DynamoDB unreachable or failing: the engine is ready
                self.metrics.registration_failures.inc()
                log.warning("registration failed; trying again", error=str(err), in_seconds=delay)
                await asyncio.sleep(delay)
            else:
                return
            if self.phase != "warming":
                return

    async def _heartbeat_forever(self, agent_id: str) -> None:
        while True:
            await asyncio.sleep(self.settings.heartbeat_seconds)
            failure = self.engine.failure() if self.engine is not None else None
            if failure is not None:  # died while idle: no stream has seen it yet
                await self.engine_failed(failure)
            if self.phase == "failed":
                return  # a ready heartbeat would keep routing work to a dead engine
            try:
                await self.registry.heartbeat(agent_id, active=len(self.streams))
            except AgentGone:
                log.warning("registry says this agent is gone; stopping")
                self._stop_as_gone()
                return
            except Exception as err:  # a registry outage must not stop serving
                log.warning("heartbeat failed", error=str(err))

    def _stop_as_gone(self) -> None:
        """Stop serving: the registry has this agent `gone`, and so routes it nothing."""
        self.phase = "stopped"
        self.stopped.set()

    async def _check_engine_forever(self, engine: Engine) -> None:
        """While ready or draining: fail the agent once its engine stops producing tokens."""
        stall = self.settings.engine_stall_seconds
        while self.phase in ("ready", "draining"):
            await asyncio.sleep(self.settings.engine_check_seconds)
            progress = [handle.progress.last_progress for handle in self.streams.values()]
            check = engine_check(time.monotonic(), progress, stall)
            if check is EngineCheck.PROBE:
                try:
                    async with asyncio.timeout(stall):
                        await self._warm_up(engine, tokens=1)
                except TimeoutError:
                    check = EngineCheck.STALLED
                except Exception as err:  # the engine refused or broke: as good as wedged
                    await self.engine_failed(f"engine probe failed: {err}")
                    return
            if check is EngineCheck.STALLED and self.phase in ("ready", "draining"):
                self.metrics.engine_stalls.inc()
                await self.engine_failed(f"engine produced no token for {stall:g} s (wedged)")
                return

    # -- failure --

    async def engine_failed(self, reason: str) -> None:
        """The engine is gone: hand every stream back with `interrupted` and leave (idempotent).

        The process stays up, reporting the failure on `/healthz`, until the pool manager
        replaces the instance: it reaps an agent marked `gone`, or, if the registry is out of
        reach now, one whose heartbeat stopped.
        """
        if self.phase in ("failed", "stopped"):
            return
        self.phase, self.failure = "failed", reason
        self.metrics.ready.set(0)
        log.error("engine failed; handing streams back and leaving", reason=reason)
        for handle in list(self.streams.values()):
            handle.end("interrupted")
        await self.leave()

    # -- draining --

    async def on_spot_notice(self, notice: SpotNotice) -> None:
        """IMDS announced an interruption: drain by its deadline."""
        self.metrics.interruptions.inc()
        log.warning("spot interruption notice", action=notice.action, deadline=notice.deadline)
        await self.begin_drain(notice.deadline)

    async def on_rebalance(self, at: float) -> None:
        """IMDS recommends rebalancing: record it so the pool can start a replacement early."""
        if self.identity is None or not self.registered:
            return
        try:
            await self.registry.record_rebalance(self.identity.agent_id, at)
        except RegistryError as err:
            log.warning("could not record rebalance", error=str(err))

    async def begin_drain(self, deadline: float) -> None:
        """Stop taking streams and hand back what cannot finish by `deadline` (idempotent)."""
        if self.phase in ("draining", "stopped"):
            return
        self.phase = "draining"
        self.metrics.ready.set(0)
        self.drain_deadline = deadline
        if self.registered and self.identity is not None:
            try:
                outcome = await self.registry.set_draining(self.identity.agent_id, deadline)
                if outcome.record.drain_deadline is not None:
                    self.drain_deadline = min(deadline, outcome.record.drain_deadline)
            except RegistryError as err:
                log.warning("could not mark draining", error=str(err))
        self.spawn(self._drain_until_empty(self.drain_deadline), "drain")

    async def _drain_until_empty(self, deadline: float) -> None:
        while self.streams:
            loads = [handle.load(key) for key, handle in self.streams.items()]
            plan = plan_hand_back(loads, now=self.wall_clock(), deadline=deadline)
            for key in plan.end:
                handle = self.streams.get(key)
                if handle is not None:
                    handle.end("interrupted")
            for key in plan.move:
                handle = self.streams.get(key)
                if handle is not None:
                    await handle.tell_moving()
            await asyncio.sleep(DRAIN_CHECK_SECONDS)
        log.info("drained; leaving")
        await self.leave()
        self.phase = "stopped"
        self.stopped.set()

    async def leave(self) -> None:
        """Mark the agent `gone` (on exit); a registry outage only gets logged."""
        if not self.registered or self.identity is None:
            return
        try:
            await self.registry.set_gone(self.identity.agent_id)
            self.registered = False
        except Exception as err:  # leaving must not fail on a registry outage
            log.warning("could not mark gone", error=str(err))
