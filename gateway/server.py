"""The gateway application: its resources, its background work, and its routes, in order.

`create_app(settings)` builds it. The HTTP session, registry, key ring, pool view refresh,
agent links and demand publishing live in `cleanup_ctx`, and so does the operations listener
(`/readyz`, `/metrics` on `ops_port`); the handlers share a `gateway.state.GatewayState`.
Each concern adds its own routes (`gateway.routes`), wired here by `ROUTES`, one ordered list.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Callable
from contextlib import suppress

import aiohttp
from aiohttp import web

from gateway.auth import Authenticator
from gateway.batch_worker import BatchWorker
from gateway.demand import Published, current_demand, rows_due
from gateway.dispatch import Dispatcher
from gateway.fair_share import FAIR_SHARE_EXCHANGE_SECONDS, waiting_elsewhere
from gateway.limits import LimitStore
from gateway.metrics import GatewayMetrics
from gateway.receipts import ReceiptSigner
from gateway.routes.batches import setup_batches
from gateway.routes.chat_page import setup_chat_page, setup_security_headers
from gateway.routes.files import setup_files
from gateway.routes.health import serve_operations, setup_health
from gateway.routes.openai_compat import setup_openai_compat
from gateway.routes.tokens import setup_tokens
from gateway.routes.websocket import setup_websocket
from gateway.sharedlimits import SharedBuckets
from gateway.signing import load_key_ring, publish_jwks
from gateway.state import STATE, GatewayState, public_url, token_issuer
from gateway.usage import USAGE_FLUSH_SECONDS, UsageMeter
from gateway.vouching import RogueAgents
from spotgate.file_store import FileStore
from spotgate.logging import get_logger
from spotgate.registry import Registry
from spotgate.settings import MAX_REQUEST_BYTES, GatewaySettings
from spotgate.tasks import ended
from spotgate.wsserver import close_going_away

log = get_logger(__name__)

GOING_AWAY_WRITE_SECONDS = 5.0
"""How long streams still open after the drain's grace get to write their `going_away`."""

ROUTES: tuple[Callable[[web.Application], None], ...] = (
    setup_security_headers,
    setup_chat_page,
    setup_tokens,
    setup_websocket,
    setup_openai_compat,
    setup_files,
    setup_batches,
    setup_health,
)
"""What adds the gateway's routes (and the headers on all it answers), in order."""


async def _publish_demand(state: GatewayState) -> None:
    published: dict[str, Published] = {}
    while True:
        await asyncio.sleep(state.settings.demand_publish_seconds)
        dispatcher = state.dispatcher
        current = current_demand(
            dispatcher.pending(),
            dispatcher.outstanding,
            dispatcher.view,
            state.settings.models,
            running_flex=dispatcher.running_flex.counts(),
            backlogs=state.batch_backlogs,
        )
        now = time.time()
        for model in rows_due(current, published, now, state.registry.demand_ttl_seconds):
            demand = current[model]
            try:
                await state.registry.publish_demand(
                    model,
                    state.gateway_id,
                    pending=demand.pending,
                    active=demand.active,
                    backlog=demand.backlog,
                )
            except Exception as err:  # demand is advisory; routing goes on
                log.warning("demand publish failed", error=str(err))
            else:
                published[model] = Published(demand, now)
        await state.prune_links()


async def _share_fair_loads(state: GatewayState) -> None:
    """Take turns with the other replicas' tenants (`gateway.fair_share`), via the store."""
    if state.limits.shared is None:
        return
    dispatcher = state.dispatcher
    while True:
        await asyncio.sleep(FAIR_SHARE_EXCHANGE_SECONDS)
        mine = dispatcher.fair_loads()
        try:
            others = await state.limits.exchange_fair_loads(
                state.gateway_id, mine, time.time(), reading=dispatcher.busy_models()
            )
        except Exception as err:  # a replica's odd entry: on its own until it answers well
            log.warning("fair share exchange failed", error=repr(err))
            others = {}
        if others != dispatcher.fair_share.others:
            dispatcher.fair_share.others = others
            dispatcher.notify()  # a held slot may be this replica's to take now, or not
        for model in waiting_elsewhere(others):
            # An interactive stream waits on another replica, and this one sees no room
            # either: one of its flex streams gives its place, as a waiter here would take it.
            if dispatcher.choose(model, None, ()) is None:
                dispatcher.running_flex.preempt_one(model)


async def _flush_usage(state: GatewayState) -> None:
    while True:
        await asyncio.sleep(USAGE_FLUSH_SECONDS)
        await state.usage.flush(state.registry)


async def _close_sockets(state: GatewayState) -> None:
    """Refuse new streams, give those in flight the grace period, then close with GOING_AWAY.

    Streams still open when the grace is over end with a word: a `going_away` error (an SSE
    error event, a websocket frame), and their agents are told to stop, before the sockets
    close and the gateway exits.
    """
    state.shutting_down = True
    if state.active_streams:
        with suppress(TimeoutError):
            async with asyncio.timeout(state.settings.shutdown_grace_seconds):
                await state.idle.wait()
    if state.active_streams:
        state.dispatcher.close()
        for link in list(state.links.values()):
            link.going_away()
        with suppress(TimeoutError):  # what a client that stopped reading never gets
            async with asyncio.timeout(GOING_AWAY_WRITE_SECONDS):
                await state.idle.wait()
    await close_going_away(state.sockets, b"gateway shutting down")


async def drain_sockets(app: web.Application) -> None:
    """Refuse new streams, give those in flight the grace period, then close with GOING_AWAY.

    A stop must call it before `AppRunner.cleanup`, which first makes aiohttp drop whatever
    arrives on open connections: refusals, cancels and pongs would go unanswered.
    """
    await _close_sockets(app[STATE])


def create_app(
    settings: GatewaySettings, *, clock: Callable[[], float] = time.time
) -> web.Application:
    """The gateway application; `clock` judges client credentials and per-key limits."""
    app = web.Application(client_max_size=MAX_REQUEST_BYTES)

    async def resources(app: web.Application) -> AsyncIterator[None]:
        connector = aiohttp.TCPConnector(limit=settings.agent_connection_limit)
        async with contextlib.AsyncExitStack() as resources:
            session = await resources.enter_async_context(
                aiohttp.ClientSession(connector=connector)
            )
            registry = await resources.enter_async_context(Registry.open(settings.shared))
            files = await resources.enter_async_context(FileStore.open(settings.shared))
            shared = None
            if settings.limit_store.url is not None:
                shared = await resources.enter_async_context(
                    SharedBuckets.open(settings.limit_store)
                )
            ring = await load_key_ring(settings)
            await publish_jwks(settings, ring)
            issuer = token_issuer(settings)
            metrics = GatewayMetrics()
            state = GatewayState(
                settings=settings,
                registry=registry,
                ring=ring,
                authenticator=Authenticator(
                    registry,
                    ring,
                    issuer,
                    settings.token.leeway_seconds,
                    settings.max_streams_per_key,
                    clock,
                ),
                dispatcher=Dispatcher(
                    settings.queue,
                    settings.models,
                    agent_networks=settings.agent_networks,
                    routing=settings.routing,
                    rogues=RogueAgents(metrics.rogue_agents),
                    region=settings.shared.aws.region,
                ),
                session=session,
                gateway_id=settings.gateway_id or f"gw-{secrets.token_hex(4)}",
                public_url=public_url(settings),
                issuer=issuer,
                clock=clock,
                metrics=metrics,
                limits=LimitStore(settings, metrics, shared),
                usage=UsageMeter(metrics),
                receipts=ReceiptSigner(ring),
                files=files,
                uploads=asyncio.Semaphore(settings.batch.uploads_per_gateway),
                downloads=asyncio.Semaphore(settings.batch.downloads_per_gateway),
            )
            app[STATE] = state
            tasks = [
                asyncio.create_task(
                    state.dispatcher.refresh_forever(registry, settings.registry_refresh_seconds),
                    name="registry-view",
                ),
                asyncio.create_task(_publish_demand(state), name="demand"),
                asyncio.create_task(state.limits.maintain_forever(), name="limit-store"),
                asyncio.create_task(_flush_usage(state), name="usage"),
                asyncio.create_task(_share_fair_loads(state), name="fair-share"),
                asyncio.create_task(BatchWorker(state, files).run_forever(), name="batches"),
            ]
            try:
                yield
            finally:
                await _close_sockets(state)
                await ended(tasks)
                # Together: each close is bounded, and an agent gone silent holds up no other's.
                await asyncio.gather(*(link.close() for link in list(state.links.values())))
                await state.usage.flush(registry)  # what the last streams used
                await state.authenticator.close()

    app.cleanup_ctx.append(resources)
    # Readiness and metrics on a port of their own, which the load balancer never forwards.
    app.cleanup_ctx.append(serve_operations)
    # on_shutdown runs before aiohttp waits for open handlers: long-lived sockets must go now.
    app.on_shutdown.append(drain_sockets)
    for setup in ROUTES:
        setup(app)
    return app
