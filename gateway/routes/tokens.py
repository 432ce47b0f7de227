"""Tokens: `POST /v1/token` trades an API key for one, the JWKS lets agents verify them."""

from __future__ import annotations

from aiohttp import web

from gateway.guard import authenticated
from gateway.state import STATE
from spotgate.tokens import issue


async def token(request: web.Request) -> web.Response:
    """`POST /v1/token`: trade an API key for a short-lived token."""
    state = request.app[STATE]
    missing = "missing 'Authorization: Bearer sg-…'"
    record = await authenticated(request, state.authenticator.api_key, missing)
    if isinstance(record, web.Response):
        return record
    issued = issue(
        state.ring,
        subject=record.key_id,
        issuer=state.issuer,
        now=state.clock(),
        ttl_seconds=state.settings.token.ttl_seconds,
        models=sorted(record.models) or None,
        max_tokens=record.max_tokens,
        tenant=record.tenant,
    )
    ws_url = state.public_url.replace("http", "ws", 1) + "/v1/ws"
    return web.json_response(
        {"token": issued.token, "expires_at": issued.expires_at, "ws_url": ws_url},
        headers={"Cache-Control": "no-store"},  # a credential: no cache along the way keeps it
    )


async def jwks(request: web.Request) -> web.Response:
    """`GET /.well-known/jwks.json`: the public keys agents verify tokens with."""
    return web.json_response(
        request.app[STATE].ring.jwks(), headers={"Cache-Control": "public, max-age=60"}
    )


def setup_tokens(app: web.Application) -> None:
    """Add the token and JWKS routes."""
    app.router.add_post("/v1/token", token)
    app.router.add_get("/.well-known/jwks.json", jwks)
