"""The gateway application: tokens, JWKS, websocket and OpenAI routes, health and metrics.

`create_app(settings)` builds it; the HTTP session, registry, key ring, pool view refresh,
agent links and demand publishing live in `cleanup_ctx`.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

import aiohttp
from aiohttp import WSCloseCode, web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway.agent_link import AgentLink
from gateway.auth import Authenticator, Principal
from gateway.authlimit import FailedAuthLimiter
from gateway.demand import Published, current_demand, rows_due
from gateway.dispatch import Dispatcher
from gateway.metrics import GatewayMetrics
from gateway.ratelimit import RateLimiter
from gateway.relay import ClientFrame, RelayOutcome, relay_stream
from gateway.signing import load_key_ring
from spotgate.admission import GatewayConditions, Refusal, gateway_refusal
from spotgate.apikeys import MalformedApiKey, looks_like_api_key, parse_api_key
from spotgate.logging import bound_context, get_logger
from spotgate.openai_api import ChatCompletionRequest, CompletionRequest, completion_id
from spotgate.openai_http import read_body, respond
from spotgate.protocol import (
    DoneFrame,
    ErrorCode,
    ErrorFrame,
    GenerateFrame,
    Timings,
    Usage,
)
from spotgate.registry import Registry
from spotgate.settings import MAX_REQUEST_BYTES, TOKEN_TTL_MAX_SECONDS, GatewaySettings
from spotgate.tokens import GATEWAY_SUBJECT_PREFIX, KeyRing, issue
from spotgate.wsserver import (
    AuthRefused,
    AuthUnavailable,
    FrameSocket,
    Send,
    StreamHandlers,
    bearer_token,
    json_error,
    serve_websocket,
)

log = get_logger(__name__)


@dataclass(eq=False)
class RelayHandle:
    """A client stream relayed by this gateway."""

    task: asyncio.Task[None]

    def end(self, reason: str) -> None:
        """Stop relaying (the client cancelled or went away)."""
        self.task.cancel()


@dataclass
class GatewayState:
    """What the gateway's handlers share."""

    settings: GatewaySettings
    registry: Registry
    ring: KeyRing
    authenticator: Authenticator
    dispatcher: Dispatcher
    session: aiohttp.ClientSession
    gateway_id: str
    public_url: str
    failed_auth: FailedAuthLimiter
    metrics: GatewayMetrics = field(default_factory=GatewayMetrics)
    limiter: RateLimiter = field(default_factory=RateLimiter)
    links: dict[str, AgentLink] = field(default_factory=dict)
    sockets: set[FrameSocket] = field(default_factory=set)
    active_streams: int = 0
    shutting_down: bool = False
    idle: asyncio.Event = field(default_factory=asyncio.Event)

    def agent_token(self) -> tuple[str, float]:
        """A token the gateway presents to agents (refreshed on the link before it expires)."""
        issued = issue(
            self.ring,
            subject=f"{GATEWAY_SUBJECT_PREFIX}{self.gateway_id}",
            issuer=self.public_url,
            now=time.time(),
            ttl_seconds=TOKEN_TTL_MAX_SECONDS,
        )
        return issued.token, float(issued.expires_at)

    def link_for(self, agent_id: str) -> AgentLink | None:
        """The link to an agent in the view, opened lazily."""
        link = self.links.get(agent_id)
        if link is not None and not link.closed:
            return link
        record = self.dispatcher.view.record(agent_id)
        if record is None:
            return None
        link = AgentLink(agent_id, record.url, self.session, self.agent_token)
        self.links[agent_id] = link
        return link

    async def prune_links(self) -> None:
        """Close links to agents that left the registry view and carry no stream."""
        for agent_id, link in list(self.links.items()):
            if self.dispatcher.view.record(agent_id) is None and link.open_streams == 0:
                del self.links[agent_id]
                await link.close()


STATE = web.AppKey("state", GatewayState)


def _refusal(state: GatewayState, frame: GenerateFrame, principal: Principal) -> Refusal | None:
    """Whether this gateway admits the stream now (`spotgate.admission.gateway_refusal`)."""
    conditions = GatewayConditions(
        shutting_down=state.shutting_down,
        max_prompt_chars=state.settings.limits.max_prompt_chars,
        context=state.dispatcher.view.context_limits(frame.model),
    )
    return gateway_refusal(frame, principal.grant, conditions, time.time())


async def admitted_frames(
    state: GatewayState, frame: GenerateFrame, principal: Principal, outcome: RelayOutcome
) -> AsyncGenerator[ClientFrame, None]:
    """A stream's frames for its client: admitted against its key's limits, then relayed."""
    if principal.max_tokens is not None:  # a reply with no max_tokens stops at the key's limit
        frame = frame.model_copy(update={"max_tokens_cap": principal.max_tokens})
    decision = state.limiter.admit(principal.key_id, principal.limits, time.time())
    if not decision.admitted:
        state.metrics.rejections.labels(reason="rate_limited").inc()
        yield ErrorFrame(
            id=frame.id,
            code=ErrorCode.RATE_LIMITED,
            message=decision.reason,
            retry_after=decision.retry_after,
        )
        return
    state.active_streams += 1
    state.idle.clear()
    state.metrics.active_streams.inc()
    try:
        with bound_context(stream_id=frame.id, key_id=principal.key_id):
            frames = relay_stream(
                frame,
                dispatcher=state.dispatcher,
                link_for=state.link_for,
                deadline_seconds=state.settings.queue.deadline_seconds,
                outcome=outcome,
            )
            async with aclosing(frames) as relayed:
                async for out in relayed:
                    yield out
    finally:
        state.active_streams -= 1
        if state.active_streams == 0:
            state.idle.set()
        state.metrics.active_streams.dec()
        used = outcome.prompt_tokens + outcome.completion_tokens
        state.limiter.finish(principal.key_id, used, time.time())
        state.metrics.record(outcome)


def start_stream(
    state: GatewayState, frame: GenerateFrame, principal: Principal, send: Send
) -> RelayHandle:
    """Relay a websocket stream in its own task; its frames go to `send`.

    A stream cancelled by its client still ends with a `done` frame (`cancelled`, with the
    tokens it got), so the client knows where it stopped.
    """
    outcome = RelayOutcome()
    started = time.monotonic()

    async def run() -> None:
        try:
            async with aclosing(admitted_frames(state, frame, principal, outcome)) as frames:
                async for out in frames:
                    await send(out)
        except asyncio.CancelledError:
            elapsed_ms = (time.monotonic() - started) * 1000
            done = DoneFrame(
                id=frame.id,
                finish_reason="cancelled",
                usage=Usage(
                    prompt_tokens=outcome.prompt_tokens,
                    completion_tokens=outcome.relayed_tokens,
                ),
                timings=Timings(
                    queue_ms=outcome.queue_ms,
                    ttft_ms=outcome.ttft_ms if outcome.ttft_ms is not None else elapsed_ms,
                    total_ms=elapsed_ms,
                ),
            )
            with suppress(Exception):  # the socket may be what went away
                await send(done)
            raise

    return RelayHandle(asyncio.create_task(run(), name=f"relay {frame.id}"))


# --- authentication ---------------------------------------------------------------------------


class AuthThrottled(AuthRefused):
    """Too many failed authentications from this client or for this key: 429, wait."""

    code = ErrorCode.RATE_LIMITED

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def client_address(request: web.Request, trusted_proxy_hops: int) -> str:
    """The caller's address: the peer's, or the one the trusted proxies put in X-Forwarded-For.

    Each proxy appends the address it received from, so the entry `trusted_proxy_hops` from
    the end is the first one no client could have written.
    """
    if trusted_proxy_hops > 0:
        forwarded = [part.strip() for part in request.headers.get("X-Forwarded-For", "").split(",")]
        if len(forwarded) >= trusted_proxy_hops and forwarded[-trusted_proxy_hops]:
            return forwarded[-trusted_proxy_hops]
    return request.remote or "unknown"


Result = TypeVar("Result")


def _key_id(credential: str) -> str | None:
    if not looks_like_api_key(credential):
        return None
    try:
        return parse_api_key(credential).key_id
    except MalformedApiKey:
        return None


async def guarded(
    state: GatewayState,
    request: web.Request,
    credential: str,
    check: Callable[[str], Awaitable[Result]],
) -> Result:
    """Run a credential `check` unless this client or key failed too often; count failures."""
    client = client_address(request, state.settings.trusted_proxy_hops)
    key_id = _key_id(credential)
    decision = state.failed_auth.check(client, key_id, time.time())
    if not decision.admitted:
        raise AuthThrottled(decision.reason, decision.retry_after)
    try:
        return await check(credential)
    except AuthUnavailable:
        raise  # the registry could not answer: not the caller's failure
    except AuthRefused:
        state.failed_auth.failed(client, key_id, time.time())
        raise


# --- routes -----------------------------------------------------------------------------------


async def _principal(request: web.Request) -> Principal | web.Response:
    state = request.app[STATE]
    credential = bearer_token(request)
    if credential is None:
        return json_error(ErrorCode.UNAUTHORIZED, "missing 'Authorization: Bearer <key>'")
    try:
        return await guarded(state, request, credential, state.authenticator.authenticate)
    except AuthRefused as err:
        state.metrics.rejections.labels(reason=err.code.value).inc()
        return json_error(err.code, str(err), err.retry_after)


async def token(request: web.Request) -> web.Response:
    """`POST /v1/token`: trade an API key for a short-lived token."""
    state = request.app[STATE]
    credential = bearer_token(request)
    if credential is None:
        return json_error(ErrorCode.UNAUTHORIZED, "missing 'Authorization: Bearer sg-…'")
    try:
        record = await guarded(state, request, credential, state.authenticator.api_key)
    except AuthRefused as err:
        state.metrics.rejections.labels(reason=err.code.value).inc()
        return json_error(err.code, str(err), err.retry_after)
    issued = issue(
        state.ring,
        subject=record.key_id,
        issuer=state.public_url,
        now=time.time(),
        ttl_seconds=state.settings.token.ttl_seconds,
        models=sorted(record.models) or None,
        max_tokens=record.max_tokens,
    )
    ws_url = state.public_url.replace("http", "ws", 1) + "/v1/ws"
    return web.json_response(
        {"token": issued.token, "expires_at": issued.expires_at, "ws_url": ws_url}
    )


async def jwks(request: web.Request) -> web.Response:
    """`GET /.well-known/jwks.json`: the public keys agents verify tokens with."""
    return web.json_response(
        request.app[STATE].ring.jwks(), headers={"Cache-Control": "public, max-age=60"}
    )


async def models(request: web.Request) -> web.Response:
    """`GET /v1/models`: models with ready agents, and those that can scale from zero."""
    state = request.app[STATE]
    names = sorted(state.dispatcher.view.ready_models() | set(state.settings.models))
    data = [{"id": name, "object": "model", "owned_by": "spotgate", "created": 0} for name in names]
    return web.json_response({"object": "list", "data": data})


def origin_allowed(origin: str, host: str | None, allowed: frozenset[str]) -> bool:
    """Whether a browser page at `origin` may open a websocket here.

    Its own origin may (the `Host` it connected to, which a page cannot forge), and so may
    the configured ones; anything else, `null` included, is a foreign page.
    """
    if origin in allowed:
        return True
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and bool(host) and parts.netloc == host


def allowed_origins(settings: GatewaySettings) -> frozenset[str]:
    """The gateway's public origin and the configured `allowed_origins`."""
    own = urlsplit(public_url(settings))
    return frozenset({f"{own.scheme}://{own.netloc}", *settings.allowed_origins})


async def websocket(request: web.Request) -> web.StreamResponse:
    """`GET /v1/ws`: the wire protocol, many streams per socket."""
    state = request.app[STATE]
    origin = request.headers.get("Origin")
    # Browsers always send Origin: refuse pages of other sites before the socket opens.
    if origin is not None and not origin_allowed(
        origin, request.host, allowed_origins(state.settings)
    ):
        state.metrics.rejections.labels(reason=ErrorCode.FORBIDDEN.value).inc()
        return json_error(ErrorCode.FORBIDDEN, "websocket connections from this origin are refused")
    handlers = StreamHandlers[Principal](
        authenticate=lambda credential: guarded(
            state, request, credential, state.authenticator.authenticate
        ),
        refusal=lambda frame, principal: _refusal(state, frame, principal),
        start=lambda frame, principal, send: start_stream(state, frame, principal, send),
    )
    return await serve_websocket(
        request,
        handlers,
        state.settings.limits,
        compress=state.settings.compress,
        sockets=state.sockets,
    )


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """`POST /v1/chat/completions` (SSE when `stream` is true)."""
    return await _openai(request, ChatCompletionRequest, "chat")


async def completions(request: web.Request) -> web.StreamResponse:
    """`POST /v1/completions` (SSE when `stream` is true)."""
    return await _openai(request, CompletionRequest, "text")


async def _openai(
    request: web.Request,
    model: type[ChatCompletionRequest] | type[CompletionRequest],
    kind: str,
) -> web.StreamResponse:
    state = request.app[STATE]
    principal = await _principal(request)
    if isinstance(principal, web.Response):
        return principal
    body = await read_body(request, model, state.settings.http_body_timeout_seconds)
    if isinstance(body, web.Response):
        return body
    cid = completion_id("chat" if kind == "chat" else "text")
    frame = body.to_generate_frame(cid, session=request.headers.get("X-Session-Id"))
    refusal = _refusal(state, frame, principal)
    if refusal is not None:
        return json_error(refusal.code, refusal.message)
    # The handler drives the relay itself (no task, no queue between them): if the client
    # goes away, the failed write ends the handler and `aclosing` cancels the agent's stream.
    async with aclosing(admitted_frames(state, frame, principal, RelayOutcome())) as frames:
        return await respond(
            request,
            frames,
            kind="chat" if kind == "chat" else "text",
            cid=cid,
            model=body.model,
            stream=body.stream,
            include_usage=body.include_usage,
        )


STATIC_DIR = Path(__file__).parent / "static"
CHAT_PAGE_HEADERS = {
    # Model text is rendered as text nodes; the policy is a second wall against injection.
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; connect-src 'self' ws: wss:; "
        "img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


async def chat_page(_request: web.Request) -> web.FileResponse:
    """`GET /`: the browser chat page."""
    return web.FileResponse(STATIC_DIR / "index.html", headers=CHAT_PAGE_HEADERS)


async def chat_config(request: web.Request) -> web.Response:
    """`GET /chat/config.json`: in local mode, the dev key the page offers."""
    key = request.app[STATE].settings.chat_dev_api_key
    return web.json_response(
        {"dev_api_key": key.get_secret_value() if key else None},
        headers={"Cache-Control": "no-store"},
    )


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
    }
    never_refreshed = dispatcher.view.refreshed_at == 0.0
    return web.json_response(body, status=503 if never_refreshed else 200)


async def metrics(request: web.Request) -> web.Response:
    """Prometheus text exposition."""
    state = request.app[STATE]
    state.metrics.observe_view(state.dispatcher.view, state.dispatcher.view.last_error is None)
    return web.Response(
        body=generate_latest(state.metrics.registry),
        headers={"Content-Type": CONTENT_TYPE_LATEST},
    )


# --- app --------------------------------------------------------------------------------------


def public_url(settings: GatewaySettings) -> str:
    """The gateway's own URL: the token issuer and the base of `ws_url`."""
    return (settings.public_url or f"http://{settings.host}:{settings.port}").rstrip("/")


async def _publish_demand(state: GatewayState) -> None:
    published: dict[str, Published] = {}
    while True:
        await asyncio.sleep(state.settings.demand_publish_seconds)
        dispatcher = state.dispatcher
        current = current_demand(
            dispatcher.pending(), dispatcher.outstanding, dispatcher.view, state.settings.models
        )
        now = time.time()
        for model in rows_due(current, published, now, state.registry.demand_ttl_seconds):
            demand = current[model]
            try:
                await state.registry.publish_demand(
                    model, state.gateway_id, pending=demand.pending, active=demand.active
                )
            except Exception as err:  # demand is advisory; routing goes on
                log.warning("demand publish failed", error=str(err))
            else:
                published[model] = Published(demand, now)
        await state.prune_links()


async def _close_sockets(state: GatewayState) -> None:
    """Refuse new streams, give those in flight the grace period, then close with GOING_AWAY."""
    state.shutting_down = True
    if state.active_streams:
        with suppress(TimeoutError):
            await asyncio.wait_for(state.idle.wait(), state.settings.shutdown_grace_seconds)
    for socket in list(state.sockets):
        await socket.close(code=WSCloseCode.GOING_AWAY, message=b"gateway shutting down")


async def drain_sockets(app: web.Application) -> None:
    """Refuse new streams, give those in flight the grace period, then close with GOING_AWAY.

    A stop must call it before `AppRunner.cleanup`, which first makes aiohttp drop whatever
    arrives on open connections: refusals, cancels and pongs would go unanswered.
    """
    await _close_sockets(app[STATE])


def create_app(settings: GatewaySettings) -> web.Application:
    """The gateway application."""
    app = web.Application(client_max_size=MAX_REQUEST_BYTES)

    async def resources(app: web.Application) -> AsyncIterator[None]:
        connector = aiohttp.TCPConnector(limit=settings.agent_connection_limit)
        async with (
            aiohttp.ClientSession(connector=connector) as session,
            Registry.open(settings.shared) as registry,
        ):
            ring = await load_key_ring(settings)
            url = public_url(settings)
            state = GatewayState(
                settings=settings,
                registry=registry,
                ring=ring,
                authenticator=Authenticator(
                    registry, ring, url, settings.token.leeway_seconds, settings.max_streams_per_key
                ),
                dispatcher=Dispatcher(settings.queue, settings.models),
                failed_auth=FailedAuthLimiter(
                    settings.failed_auth_per_client_per_minute,
                    settings.failed_auth_per_key_per_minute,
                ),
                session=session,
                gateway_id=settings.gateway_id or f"gw-{secrets.token_hex(4)}",
                public_url=url,
            )
            app[STATE] = state
            tasks = [
                asyncio.create_task(
                    state.dispatcher.refresh_forever(registry, settings.registry_refresh_seconds),
                    name="registry-view",
                ),
                asyncio.create_task(_publish_demand(state), name="demand"),
            ]
            try:
                yield
            finally:
                await _close_sockets(state)
                for task in tasks:
                    task.cancel()
                    with suppress(asyncio.CancelledError):
                        await task
                for link in list(state.links.values()):
                    await link.close()
                await state.authenticator.close()

    app.cleanup_ctx.append(resources)
    # on_shutdown runs before aiohttp waits for open handlers: long-lived sockets must go now.
    app.on_shutdown.append(drain_sockets)
    app.router.add_get("/", chat_page)
    app.router.add_get("/chat/config.json", chat_config)
    app.router.add_static("/static/", STATIC_DIR)
    app.router.add_post("/v1/token", token)
    app.router.add_get("/.well-known/jwks.json", jwks)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/ws", websocket)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app
