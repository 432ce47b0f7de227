"""The agent's HTTP surface: `/v1/ws`, `/v1/chat/completions`, health, readiness, metrics.

`create_app(settings)` builds the aiohttp application; resources (HTTP session, registry,
the runtime and its background tasks) live in `cleanup_ctx`. Every request carries a JWT
that is verified locally (`gpu_agent.auth`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gpu_agent.auth import HttpJwks, JwksSource, SsmJwks, TokenVerifier
from gpu_agent.engine import EngineBusy, EngineFailed, EngineRequestError, ReplyBroken
from gpu_agent.engine_loader import load_engine
from gpu_agent.imds import ImdsClient, watch_notices
from gpu_agent.runtime import AgentRuntime, EngineLoader, StreamHandle
from gpu_agent.streams import StreamProgress, StreamRefused, check_request, generate_frames
from spotgate.admission import AgentConditions, Refusal, agent_refusal, agent_unavailable
from spotgate.logging import bound_context, get_logger
from spotgate.openai_api import ChatCompletionRequest
from spotgate.openai_http import queued_frames, read_body, respond
from spotgate.openai_replies import ForcedTools, completion_id
from spotgate.protocol import (
    AnyFrame,
    DeltaFrame,
    DoneFrame,
    ErrorCode,
    ErrorFrame,
    GenerateFrame,
    MovingFrame,
    max_gateway_frame_bytes,
)
from spotgate.registry import Registry
from spotgate.settings import MAX_REQUEST_BYTES, AgentSettings, advertised_url
from spotgate.tasks import ended
from spotgate.tenancy import agent_tenant, frame_tenant_refusal, is_gateway
from spotgate.tokens import (
    GATEWAY_SUBJECT_PREFIX,
    Claims,
    KeyFormatError,
    TokenError,
    VerifyKey,
)
from spotgate.wsserver import (
    AuthRefused,
    FrameSocket,
    Send,
    StreamHandlers,
    bearer_token,
    close_going_away,
    json_error,
    serve_websocket,
)

MAX_GATEWAY_LINK_STREAMS = 100_000
"""Streams one gateway link may carry: far above any engine's batch (vLLM queues the rest)."""

log = get_logger(__name__)

SETTINGS = web.AppKey("settings", AgentSettings)
RUNTIME = web.AppKey("runtime", AgentRuntime)
VERIFIER = web.AppKey("verifier", TokenVerifier)
HTTP_SESSION = web.AppKey("http_session", aiohttp.ClientSession)


class AgentConfigError(ValueError):
    """The settings cannot run an agent (e.g. no way to verify tokens)."""


def token_issuer(settings: AgentSettings) -> str:
    """The `iss` tokens must carry: set explicitly, or the origin of the JWKS URL."""
    if settings.token_issuer:
        return settings.token_issuer
    if settings.jwks_url:
        parts = urlsplit(settings.jwks_url)
        return f"{parts.scheme}://{parts.netloc}"
    raise AgentConfigError(
        "set SPOTGATE_AGENT_TOKEN_ISSUER (with a pinned key or a JWKS parameter) or "
        "SPOTGATE_AGENT_JWKS_URL"
    )


def jwks_source(settings: AgentSettings, session: aiohttp.ClientSession) -> JwksSource | None:
    """Where the gateway's public keys are read: its SSM parameter, or its JWKS URL."""
    if settings.jwks_parameter:
        return SsmJwks(settings.jwks_parameter, settings.shared.aws)
    if settings.jwks_url:
        return HttpJwks(settings.jwks_url, session)
    return None


# --- helpers ----------------------------------------------------------------------------------


async def _authenticate(request: web.Request) -> Claims | web.Response:
    token = bearer_token(request)
    if token is None:
        return json_error(ErrorCode.UNAUTHORIZED, "missing 'Authorization: Bearer <token>'")
    try:
        return await request.app[VERIFIER].verify(token)
    except TokenError as err:
        return json_error(ErrorCode.UNAUTHORIZED, f"token refused: {err.reason}")


def _conditions(runtime: AgentRuntime) -> AgentConditions:
    """What admission needs to know about this agent now."""
    engine = runtime.engine
    return AgentConditions(
        phase=runtime.phase,
        accepting=runtime.accepting,
        engine_loaded=engine is not None,
        token_leeway_seconds=runtime.settings.token_leeway_seconds,
        streams=len(runtime.streams),
        capacity=engine.capacity if engine is not None else None,
    )


# --- health -----------------------------------------------------------------------------------


async def healthz(request: web.Request) -> web.Response:
    """Liveness: the process answers (the engine may still be loading)."""
    runtime = request.app[RUNTIME]
    status = 503 if runtime.phase == "failed" else 200
    return web.json_response({"status": runtime.phase, "failure": runtime.failure}, status=status)


async def readyz(request: web.Request) -> web.Response:
    """Readiness: 200 only while the agent takes new streams."""
    runtime = request.app[RUNTIME]
    engine = runtime.engine
    body = {
        "status": runtime.phase,
        "agent_id": runtime.identity.agent_id if runtime.identity else None,
        "model": engine.model if engine else None,
        "engine": engine.kind if engine else runtime.settings.engine,
        "active_streams": len(runtime.streams),
        "drain_deadline": runtime.drain_deadline,
    }
    return web.json_response(body, status=200 if runtime.accepting else 503)


async def metrics(request: web.Request) -> web.Response:
    """Prometheus text exposition."""
    runtime = request.app[RUNTIME]
    runtime.metrics.active_streams.set(len(runtime.streams))
    body = generate_latest(runtime.metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


# --- streams ----------------------------------------------------------------------------------


async def _serve_stream(
    runtime: AgentRuntime,
    frame: GenerateFrame,
    claims: Claims,
    handle_slot: list[StreamHandle],
    send: Send,
) -> None:
    """Run one stream, sending its frames; end it cleanly however it ends."""
    engine = runtime.engine
    metrics = runtime.metrics
    progress = handle_slot[0].progress
    outcome = "completed"
    try:
        if engine is None:
            raise StreamRefused(ErrorCode.NO_CAPACITY, "engine not loaded")
        check_request(frame, engine, claims, runtime.settings.limits.max_prompt_chars)
        # Its prefix cache is the tenant's own: the gateway's word for its client, else the token's.
        frame = frame.model_copy(update={"tenant": agent_tenant(frame, claims)})
        first = True
        async with aclosing(
            generate_frames(
                frame,
                engine,
                agent_id=runtime.identity.agent_id if runtime.identity else "",
                progress=progress,
                key_max_tokens=claims.mtk,
            )
        ) as frames:
            async for out in frames:
                if isinstance(out, DeltaFrame):
                    metrics.tokens.inc(out.n)
                    if first and progress.first_token_at is not None:
                        metrics.ttft.observe(progress.first_token_at - progress.started_at)
                        first = False
                await send(out)
    except StreamRefused as err:
        outcome = err.code.value
        await send(ErrorFrame(id=frame.id, code=err.code, message=err.message, param=err.param))
    except EngineBusy as err:
        outcome = ErrorCode.NO_CAPACITY.value
        await send(ErrorFrame(id=frame.id, code=ErrorCode.NO_CAPACITY, message=str(err)))
    except EngineRequestError as err:
        outcome = "invalid_request"
        await send(
            ErrorFrame(
                id=frame.id, code=ErrorCode.INVALID_REQUEST, message=str(err), param=err.param
            )
        )
    except ReplyBroken as err:
        outcome = "internal"
        log.warning("reply broken", stream_id=frame.id, reason=str(err))
        await send(ErrorFrame(id=frame.id, code=ErrorCode.INTERNAL, message=str(err)))
    except EngineFailed as err:
        handle_slot[0].end_reason = outcome = "interrupted"  # already ending: not cancelled again
        runtime.spawn(runtime.engine_failed(str(err)), "engine-failed")
        await _report_early_end(frame, progress, "interrupted", send)
    except asyncio.CancelledError:
        reason = handle_slot[0].end_reason
        if reason is None:
            raise  # shutdown, not ours to report
        outcome = reason
        await _report_early_end(frame, progress, reason, send)
    except Exception:
        outcome = "internal"
        log.exception("stream failed", stream_id=frame.id)
        await send(ErrorFrame(id=frame.id, code=ErrorCode.INTERNAL, message="generation failed"))
    finally:
        metrics.streams.labels(outcome=outcome).inc()


async def _report_early_end(
    frame: GenerateFrame,
    progress: StreamProgress,
    reason: str,
    send: Send,
) -> None:
    if reason == "interrupted":
        await send(
            ErrorFrame(
                id=frame.id,
                code=ErrorCode.INTERRUPTED,
                message="this agent is going away; resume the stream elsewhere",
                retry_after=0,
            )
        )
        return
    elapsed_ms = (time.monotonic() - progress.started_at) * 1000
    await send(
        DoneFrame.model_validate(
            {
                "id": frame.id,
                "finish_reason": "cancelled",
                "usage": {"prompt_tokens": 0, "completion_tokens": progress.completion_tokens},
                "timings": {"queue_ms": 0, "ttft_ms": elapsed_ms, "total_ms": elapsed_ms},
            }
        )
    )


def _start_stream(
    runtime: AgentRuntime,
    key: tuple[int, str],
    frame: GenerateFrame,
    claims: Claims,
    send: Send,
) -> StreamHandle:
    slot: list[StreamHandle] = []
    progress = StreamProgress()

    async def run() -> None:
        with bound_context(stream_id=frame.id):
            await _serve_stream(runtime, frame, claims, slot, send)

    def forget(_task: asyncio.Task[None]) -> None:
        # A callback, not a `finally`: a task cancelled before it first runs skips its body.
        runtime.streams.pop(key, None)

    async def send_moving() -> None:
        await send(MovingFrame(id=frame.id))

    handle = StreamHandle(
        asyncio.create_task(run(), name=f"stream {frame.id}"),
        progress,
        send_moving=send_moving if frame.move_early else None,
    )
    slot.append(handle)
    runtime.streams[key] = handle
    handle.task.add_done_callback(forget)
    return handle


# --- websocket --------------------------------------------------------------------------------


def _stream_handlers(runtime: AgentRuntime, verifier: TokenVerifier) -> StreamHandlers[Claims]:
    async def authenticate(token: str) -> Claims:
        try:
            return await verifier.verify(token)
        except TokenError as err:
            raise AuthRefused(f"token refused: {err.reason}") from err

    def refusal(frame: GenerateFrame, claims: Claims) -> Refusal | None:
        tenant_refusal = frame_tenant_refusal(frame, from_gateway=is_gateway(claims))
        if tenant_refusal is not None:
            return tenant_refusal
        return agent_refusal(claims.grant, _conditions(runtime), time.time())

    def start(frame: GenerateFrame, claims: Claims, socket: FrameSocket) -> StreamHandle:
        return _start_stream(runtime, (id(socket), frame.id), frame, claims, socket.send)

    def max_streams(claims: Claims) -> int | None:
        # A gateway multiplexes all its clients over one link: the engine is its limit.
        if claims.sub.startswith(GATEWAY_SUBJECT_PREFIX):
            return MAX_GATEWAY_LINK_STREAMS
        return None

    def max_frame_bytes(claims: Claims) -> int | None:
        # A gateway's link carries any request a client may send it, and resumes.
        engine = runtime.engine
        if claims.sub.startswith(GATEWAY_SUBJECT_PREFIX) and engine is not None:
            return max_gateway_frame_bytes(engine.max_model_len, engine.max_token_chars)
        return None

    return StreamHandlers(authenticate, refusal, start, max_streams, max_frame_bytes)


async def websocket(request: web.Request) -> web.StreamResponse:
    """`/v1/ws`: the wire protocol, many streams per socket."""
    runtime = request.app[RUNTIME]
    handlers = _stream_handlers(runtime, request.app[VERIFIER])
    return await serve_websocket(
        request, handlers, runtime.settings.limits, sockets=runtime.websockets
    )


# --- OpenAI HTTP ------------------------------------------------------------------------------


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """`POST /v1/chat/completions`, streamed as SSE when `stream` is true."""
    runtime = request.app[RUNTIME]
    authenticated = await _authenticate(request)
    if isinstance(authenticated, web.Response):
        return authenticated
    body = await read_body(
        request, ChatCompletionRequest, runtime.settings.http_body_timeout_seconds
    )
    if isinstance(body, web.Response):
        return body
    unavailable = agent_unavailable(_conditions(runtime))
    if unavailable is not None:
        return json_error(unavailable.code, unavailable.message, retry_after=1)
    cid = completion_id()
    queue: asyncio.Queue[AnyFrame] = asyncio.Queue()
    frame = body.to_generate_frame(cid)
    handle = _start_stream(runtime, (id(request), cid), frame, authenticated, queue.put)
    try:
        return await respond(
            request,
            queued_frames(queue),
            kind="chat",
            cid=cid,
            model=body.model,
            stream=body.stream,
            include_usage=body.include_usage,
            forced=ForcedTools.of(frame),
        )
    finally:
        handle.end("cancelled")


# --- app --------------------------------------------------------------------------------------


def create_app(
    settings: AgentSettings,
    *,
    engine_loader: EngineLoader = load_engine,
    owns_engine: bool = True,
    listening: asyncio.Event | None = None,
) -> web.Application:
    """The agent application; `engine_loader` may hand in an engine shared across apps.

    `listening`: set by the caller once the app's socket takes connections (None: it does
    before the app starts); the agent registers ready only then.
    """
    issuer = token_issuer(settings)
    if not (settings.jwks_parameter or settings.jwks_url or settings.pinned_public_key):
        raise AgentConfigError(
            "set SPOTGATE_AGENT_JWKS_PARAMETER, SPOTGATE_AGENT_JWKS_URL or "
            "SPOTGATE_AGENT_PINNED_PUBLIC_KEY"
        )
    if settings.pinned_public_key:  # one line, not a traceback from inside the app's start
        try:
            VerifyKey.from_pem(settings.pinned_public_key)
        except KeyFormatError as err:
            raise AgentConfigError(f"SPOTGATE_AGENT_PINNED_PUBLIC_KEY: {err}") from err
    app = web.Application(client_max_size=MAX_REQUEST_BYTES)
    app[SETTINGS] = settings

    async def http_session(app: web.Application) -> AsyncIterator[None]:
        connector = aiohttp.TCPConnector(limit=64)
        async with aiohttp.ClientSession(connector=connector) as session:
            app[HTTP_SESSION] = session
            yield

    async def runtime_ctx(app: web.Application) -> AsyncIterator[None]:
        session = app[HTTP_SESSION]
        verifier = TokenVerifier(
            issuer=issuer,
            leeway_seconds=settings.token_leeway_seconds,
            pinned_public_key=settings.pinned_public_key,
            jwks=jwks_source(settings, session),
        )
        await verifier.refresh()
        app[VERIFIER] = verifier
        imds = ImdsClient(session, settings.imds_url)
        async with Registry.open(settings.shared) as registry:
            runtime = AgentRuntime(
                settings=settings, registry=registry, url=advertised_url(settings), imds=imds
            )
            if listening is not None:
                runtime.listening = listening
            app[RUNTIME] = runtime
            runtime.spawn(verifier.refresh_forever(), "jwks-refresh")
            runtime.spawn(runtime.bring_up(engine_loader), "bring-up")
            runtime.spawn(
                watch_notices(
                    imds,
                    poll_seconds=settings.imds_poll_seconds,
                    on_interruption=runtime.on_spot_notice,
                    on_rebalance=runtime.on_rebalance,
                ),
                "imds-watch",
            )
            try:
                yield
            finally:
                await _shut_down(runtime, owns_engine)

    async def hand_back_and_close(app: web.Application) -> None:
        # on_shutdown runs before aiohttp waits for open handlers: long-lived sockets must go now.
        await _hand_back_streams(app[RUNTIME])

    app.cleanup_ctx.append(http_session)
    app.cleanup_ctx.append(runtime_ctx)
    app.on_shutdown.append(hand_back_and_close)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/ws", websocket)
    app.router.add_post("/v1/chat/completions", chat_completions)
    return app


async def _hand_back_streams(runtime: AgentRuntime) -> None:
    """End open streams with `interrupted` and close sockets with GOING_AWAY."""
    for handle in list(runtime.streams.values()):
        handle.end("interrupted")
    await ended([handle.task for handle in runtime.streams.values()], cancel=False)
    await close_going_away(runtime.websockets, b"agent shutting down")


async def _shut_down(runtime: AgentRuntime, owns_engine: bool) -> None:
    """Hand back what is left, stop background work, leave the registry."""
    await _hand_back_streams(runtime)
    await runtime.stop_tasks()
    await runtime.leave()
    runtime.phase = "stopped"
    if owns_engine and runtime.engine is not None:
        await runtime.engine.close()
