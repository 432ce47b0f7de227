"""Run the gateway as a process: serve until SIGTERM or SIGINT, then close sockets cleanly."""

from __future__ import annotations

import asyncio
import signal

from aiohttp import web

from gateway.routes.health import OPS_PORT
from gateway.server import create_app, drain_sockets
from gateway.signing import SigningKeyMissing
from spotgate.logging import get_logger
from spotgate.process import (
    listening_site,
    service_main,
    settle_garbage_collector,
    stop_listening,
)
from spotgate.settings import GatewaySettings

log = get_logger(__name__)


async def serve_gateway(settings: GatewaySettings) -> None:
    """Serve until a stop signal; sockets close with GOING_AWAY so clients reconnect."""
    app = create_app(settings)
    runner = web.AppRunner(app, handle_signals=False, keepalive_timeout=settings.keepalive_seconds)
    await runner.setup()
    site = listening_site(runner, settings.host, settings.port, settings.listen_fd)
    await site.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    log.info("gateway listening", host=settings.host, port=settings.port, ops_port=app[OPS_PORT])
    settle_garbage_collector()
    try:
        await stop.wait()
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        # New connections are refused at once (a load balancer tries another replica); open
        # sockets are still read while they drain.
        await stop_listening(site)
        await drain_sockets(app)
        await runner.cleanup()


def main() -> int:
    """Run the gateway with the settings in the environment (`python -m gateway`)."""
    return service_main("gateway", GatewaySettings, serve_gateway, (SigningKeyMissing,))
