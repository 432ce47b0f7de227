"""Operations: liveness (`/healthz`), readiness (`/readyz`) and Prometheus `/metrics`.

Readiness and metrics name internal hosts and counts, so they are served only on the
operations listener (`ops_port`), an application of its own that the load balancer never
forwards to: no spelling of a path on the traffic port (`/%6Detrics`, `//metrics`) can reach a
route that is not there. Liveness is on both: the load balancer's health check needs it on
the traffic port, and the container's own check reads it on the operations port.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway.state import STATE, GatewayState
from spotgate.process import listening_site

OPS_PORT: web.AppKey[int] = web.AppKey("ops_port", int)
"""The port the gateway's operations listener serves on, once started (`ops_port` 0: any)."""


async def healthz(_request: web.Request) -> web.Response:
    """Liveness."""
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """Readiness: the registry view is current (or stale, still routing on the last one)."""
    state = request.app[STATE]
    dispatcher = state.dispatcher
    stale = dispatcher.view_is_stale(state.settings.registry_refresh_seconds)
    body = {
        "status": "degraded" if stale else "ready",
        "registry": "unreachable" if dispatcher.view.last_error else "ok",
        "registry_error": dispatcher.view.last_error,
        "view_age_seconds": round(time.time() - dispatcher.view.refreshed_at, 3),
        "models": sorted(dispatcher.view.ready_models()),
        "active_streams": state.active_streams,
        "pending": dispatcher.pending(),
        # `shared` across replicas; `local` while the limit store does not answer.
        "limits": state.limits.status,
        "limit_store_error": state.limits.health.error,
    }
    never_refreshed = dispatcher.view.refreshed_at == 0.0
    return web.json_response(body, status=503 if never_refreshed else 200)


async def metrics(request: web.Request) -> web.Response:
    """Prometheus text exposition."""
    state = request.app[STATE]
    state.metrics.observe_view(state.dispatcher.view, state.dispatcher.view.last_error is None)
    state.metrics.prefix_index_blocks.set(state.dispatcher.prefixes.blocks_held())
    return web.Response(
        body=generate_latest(state.metrics.registry),
        headers={"Content-Type": CONTENT_TYPE_LATEST},
    )


def setup_health(app: web.Application) -> None:
    """Add liveness to the traffic port (the load balancer's health check), and nothing else."""
    app.router.add_get("/healthz", healthz)


def operations_app(state: GatewayState) -> web.Application:
    """The operations listener's application: liveness, readiness and metrics of `state`."""
    app = web.Application()
    app[STATE] = state
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app


async def serve_operations(app: web.Application) -> AsyncIterator[None]:
    """Serve the operations listener while the gateway `app` runs (a `cleanup_ctx`).

    It starts after the gateway's resources and stops before they close, so it answers
    through the whole drain: an operator sees the streams still in flight.
    """
    state = app[STATE]
    settings = state.settings
    runner = web.AppRunner(operations_app(state))
    await runner.setup()
    try:
        site = listening_site(runner, settings.host, settings.ops_port, settings.ops_listen_fd)
        await site.start()
        app[OPS_PORT] = int(runner.addresses[0][1])
        yield
    finally:
        await runner.cleanup()
