"""Run the pool manager as a process: the reconcile loop, fed by interruption events.

Each iteration waits for EC2 events on the SQS queue (long polling, at most one loop
interval), acts on them, then reconciles, so an interruption's replacement is launched in
the same iteration. Without a queue it reconciles every `loop_seconds`. On SIGTERM the
local provider drains and stops its agents (they are its children); EC2 instances keep
serving while the manager restarts.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from dataclasses import replace

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from pool_manager.cold_starts import ColdStarts
from pool_manager.controller import PoolController
from pool_manager.ec2_provider import Ec2Provider
from pool_manager.events import InterruptionQueue
from pool_manager.local_provider import LOCAL_PLACEMENTS, LocalProvider
from pool_manager.metrics import PoolMetrics, stopped_volume_dollars_per_hour
from pool_manager.pool_view import PolicySettings, policy_settings_of
from pool_manager.provider import Provider
from pool_manager.regional_provider import RegionalProvider
from spotgate.logging import get_logger
from spotgate.process import service_main
from spotgate.regions import unknown_regions, zone_region
from spotgate.registry import PoolForecast, Registry
from spotgate.settings import PoolSettings

log = get_logger(__name__)


def model_policy_settings(settings: PoolSettings) -> dict[str, PolicySettings]:
    """Each served model's policy settings: the pool's, with the model's own where it has some."""
    pool = policy_settings(settings)
    models: dict[str, PolicySettings] = {}
    for model in settings.models:
        types = set(model.instance_types)
        placements = tuple(p for p in pool.placements if not types or p.instance_type in types)
        idle = model.scale_to_zero_idle_seconds
        warm = model.warm_pool_size
        models[model.name] = replace(
            pool,
            placements=placements,
            min_agents=pool.min_agents if model.min_agents is None else model.min_agents,
            max_agents=pool.max_agents if model.max_agents is None else model.max_agents,
            scale_down_idle_seconds=pool.scale_down_idle_seconds if idle is None else idle,
            warm_pool_size=pool.warm_pool_size if warm is None else warm,
        )
    return models


def policy_settings(settings: PoolSettings) -> PolicySettings:
    """The policy's plain-data view of the pool settings (local placements by default)."""
    local = not settings.placements and settings.provider == "local"
    return policy_settings_of(settings, LOCAL_PLACEMENTS if local else None)


class ForecastPublisher:
    """Writes the pool's forecasts to the registry.

    A booting model's every pass (so it does not expire), a model's removal once nothing of
    it boots.
    """

    def __init__(self, registry: Registry) -> None:
        self._registry = registry
        self._published: set[str] = set()

    async def publish(self, forecasts: dict[str, PoolForecast | None]) -> None:
        """Publish this pass's forecasts."""
        for model, forecast in forecasts.items():
            if forecast is None and model not in self._published:
                continue
            await self._registry.publish_forecast(model, forecast)
            if forecast is None:
                self._published.discard(model)
            else:
                self._published.add(model)


class UnknownRegion(ValueError):
    """A region (or a placement's zone) that no EC2 partition has."""


@asynccontextmanager
async def open_provider(settings: PoolSettings) -> AsyncIterator[Provider]:
    """The configured provider; the local one stops its agents when the block ends."""
    if settings.provider == "ec2":
        if unknown := unknown_regions(settings.pool_regions):
            # Zones written by hand: the placements' zones name the regions when none are set.
            zones = [p.zone for p in settings.placements if zone_region(p.zone) in unknown]
            raise UnknownRegion(
                f"no EC2 region is called {', '.join(unknown)} (zones {', '.join(zones)})"
            )
        async with AsyncExitStack() as regions:
            yield RegionalProvider(
                {
                    region: await regions.enter_async_context(
                        Ec2Provider.open(settings.shared.in_region(region), settings)
                    )
                    for region in settings.pool_regions
                }
            )
        return
    local = LocalProvider(settings.shared, settings.local, settings.models)
    try:
        yield local
    finally:
        await local.close()


POOL_METRICS = web.AppKey("pool_metrics", PoolMetrics)
HEALTHY_WITHIN_LOOPS = 3  # /healthz fails once no pass finished for this many loop intervals


def create_app(settings: PoolSettings, metrics: PoolMetrics) -> web.Application:
    """`/healthz` (the loop is alive) and `/metrics` (Prometheus)."""
    app = web.Application()
    app[POOL_METRICS] = metrics

    async def healthz(request: web.Request) -> web.Response:
        """200 while reconcile passes keep finishing, 503 once they stall."""
        last = request.app[POOL_METRICS].last_pass_at
        fresh = time.time() - last <= HEALTHY_WITHIN_LOOPS * max(settings.loop_seconds, 1.0)
        body = {"status": "ok" if fresh else "stalled", "last_pass": last}
        return web.json_response(body, status=200 if fresh else 503)

    async def metrics_text(request: web.Request) -> web.Response:
        """Prometheus text exposition."""
        exposition = generate_latest(request.app[POOL_METRICS].registry)
        return web.Response(body=exposition, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics_text)
    return app


@asynccontextmanager
async def serving(settings: PoolSettings, metrics: PoolMetrics) -> AsyncIterator[None]:
    """Serve `/healthz` and `/metrics` on the configured port (none when it is 0)."""
    if settings.port == 0:
        yield
        return
    runner = web.AppRunner(create_app(settings, metrics), handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, settings.host, settings.port).start()
    try:
        yield
    finally:
        await runner.cleanup()


async def run_pool(
    settings: PoolSettings, stop: asyncio.Event, metrics: PoolMetrics | None = None
) -> None:
    """Reconcile until `stop` is set."""
    metrics = metrics or PoolMetrics(
        placements=settings.placements,
        stopped_dollars_per_hour=stopped_volume_dollars_per_hour(
            settings.volume_gib, settings.volume_price_per_gib_month
        ),
        stopped_dollars_per_hour_by_model={
            model.name: stopped_volume_dollars_per_hour(
                model.volume_gib, settings.volume_price_per_gib_month
            )
            for model in settings.models
            if model.volume_gib is not None
        },
    )
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(serving(settings, metrics))
        registry = await stack.enter_async_context(Registry.open(settings.shared))
        provider = await stack.enter_async_context(open_provider(settings))
        queue = None
        if settings.interruption_queue_url:
            queue = await stack.enter_async_context(
                InterruptionQueue.open(settings.shared, settings.interruption_queue_url)
            )
        controller = PoolController(
            registry=registry,
            provider=provider,
            settings=policy_settings(settings),
            model_settings=model_policy_settings(settings),
            risky_placement_seconds=settings.risky_placement_seconds,
        )
        cold_starts = ColdStarts(default_seconds=settings.cold_start_seconds)
        forecasts = ForecastPublisher(registry)
        log.info(
            "pool manager running",
            provider=settings.provider,
            models=[model.name for model in settings.models],
        )
        while not stop.is_set():
            started = time.monotonic()
            try:
                if queue is not None:
                    wait = min(settings.event_wait_seconds, int(settings.loop_seconds))
                    for event, receipt in await queue.receive(wait_seconds=wait):
                        if event is not None:
                            await controller.handle_event(event)
                            metrics.record_event(event)
                        await queue.delete(receipt)
                report = await controller.reconcile()
                now = time.time()
                metrics.record_pass(report, now)
                if isinstance(provider, RegionalProvider):
                    metrics.record_regions(provider.regions, provider.failing)
                metrics.record_boots(cold_starts.observe(report.agents, report.warm_started))
                booting = cold_starts.forecasts(
                    report.agents, list(report.targets), now, report.warm_started
                )
                await forecasts.publish(booting)
                if report.actions:
                    log.info(
                        "reconciled", targets=dict(report.targets), actions=len(report.actions)
                    )
            except Exception as err:  # an AWS hiccup must not stop the pool's upkeep
                log.warning("reconcile pass failed; retrying", error=str(err))
            remaining = settings.loop_seconds - (time.monotonic() - started)
            if remaining > 0:
                with suppress(TimeoutError):
                    async with asyncio.timeout(remaining):
                        await stop.wait()


async def serve_pool(settings: PoolSettings) -> None:
    """Run until SIGTERM or SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        await run_pool(settings, stop)
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)


def main() -> int:
    """Run the pool manager with the settings in the environment (`python -m pool_manager`)."""
    return service_main("pool manager", PoolSettings, serve_pool, (UnknownRegion,))
