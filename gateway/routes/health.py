"""Operations: liveness (`/healthz`), readiness (`/readyz`) and Prometheus `/metrics`."""

from __future__ import annotations

import time

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway.state import STATE


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
    """Add the health, readiness and metrics routes."""
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
