"""`GET /v1/ws`: the wire protocol, many streams per socket, from clients and trusted origins."""

from __future__ import annotations

from urllib.parse import urlsplit

from aiohttp import web

from gateway.auth import Principal
from gateway.guard import guarded
from gateway.state import STATE, names_this_gateway, public_url
from gateway.streams import start_stream, stream_refusal
from spotgate.protocol import ErrorCode
from spotgate.settings import GatewaySettings
from spotgate.wsserver import StreamHandlers, json_error, serve_websocket


def origin_allowed(origin: str, host: str | None, allowed: frozenset[str], own_url: str) -> bool:
    """Whether a browser page at `origin` may open a websocket here.

    Its own origin may (the `Host` it connected to, which a page cannot forge, when that
    names the gateway: a rebound foreign name does not), and so may the configured ones;
    anything else, `null` included, is a foreign page.
    """
    if origin in allowed:
        return True
    parts = urlsplit(origin)
    return (
        parts.scheme in ("http", "https")
        and parts.netloc == host
        and names_this_gateway(host, own_url)
    )


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
        origin, request.host, allowed_origins(state.settings), state.public_url
    ):
        state.metrics.rejections.labels(reason=ErrorCode.FORBIDDEN.value).inc()
        return json_error(ErrorCode.FORBIDDEN, "websocket connections from this origin are refused")
    handlers = StreamHandlers[Principal](
        authenticate=lambda credential: guarded(
            state, request, credential, state.authenticator.authenticate
        ),
        refusal=lambda frame, principal: stream_refusal(state, frame, principal),
        start=lambda frame, principal, socket: start_stream(state, frame, principal, socket),
    )
    return await serve_websocket(
        request,
        handlers,
        state.settings.limits,
        compress=state.settings.compress,
        sockets=state.sockets,
    )


def setup_websocket(app: web.Application) -> None:
    """Add the websocket route."""
    app.router.add_get("/v1/ws", websocket)
