"""Run the agent as a process: serve, drain on SIGTERM/SIGINT, exit marked `gone`."""

from __future__ import annotations

import asyncio
import os
import signal
import time

from aiohttp import web

from gpu_agent import stderr_tail
from gpu_agent.server import RUNTIME, AgentConfigError, create_app
from spotgate.logging import get_logger
from spotgate.process import listening_site, service_main, settle_garbage_collector
from spotgate.settings import AgentSettings

log = get_logger(__name__)


async def serve_agent(settings: AgentSettings) -> None:
    """Serve until drained: the first signal drains, a second one stops at once."""
    listening = asyncio.Event()
    app = create_app(settings, listening=listening)
    runner = web.AppRunner(app, handle_signals=False, keepalive_timeout=settings.keepalive_seconds)
    await runner.setup()
    site = listening_site(runner, settings.host, settings.port, settings.listen_fd)
    runtime = app[RUNTIME]
    try:
        await site.start()
    except OSError as err:  # its port taken: the registry and `spotgate up` say so
        why = os.strerror(err.errno) if err.errno else str(err)
        reason = f"cannot listen on {settings.host}:{settings.port}: {why}"
        await runtime.cannot_serve(reason)
        await runner.cleanup()
        raise AgentConfigError(reason) from err
    listening.set()
    loop = asyncio.get_running_loop()
    signals_seen = 0

    def on_signal(signum: int) -> None:
        nonlocal signals_seen
        signals_seen += 1
        if signals_seen > 1:
            runtime.stopped.set()
            return
        log.info("signal received; draining", signal=signal.Signals(signum).name)
        runtime.spawn(
            runtime.begin_drain(time.time() + settings.drain_grace_seconds), "signal-drain"
        )

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    log.info("agent listening", host=settings.host, port=settings.port, engine=settings.engine)

    async def freeze_once_ready() -> None:
        await runtime.became_ready.wait()  # the engine and its warm-up are in memory by now
        settle_garbage_collector()

    runtime.spawn(freeze_once_ready(), "gc-freeze")
    try:
        await runtime.stopped.wait()
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        await runner.cleanup()


def main() -> int:
    """Run the agent with the settings in the environment (`python -m gpu_agent`)."""
    stderr_tail.install()  # what its engine core processes write, the agent can name
    return service_main("agent", AgentSettings, serve_agent, (AgentConfigError,))
