"""The browser chat page: `GET /`, its static files, and its local-mode config."""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

from gateway.state import STATE, names_this_gateway
from spotgate.protocol import ErrorCode
from spotgate.wsserver import json_error

STATIC_DIR = Path(__file__).parent.parent / "static"
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
    """`GET /chat/config.json`: in local mode, the dev key the page offers (to own names only)."""
    state = request.app[STATE]
    if not names_this_gateway(request.host, state.public_url):
        return json_error(
            ErrorCode.FORBIDDEN, "the chat page's config is served under the gateway's own names"
        )
    key = state.settings.chat_dev_api_key
    return web.json_response(
        {"dev_api_key": key.get_secret_value() if key else None},
        headers={"Cache-Control": "no-store"},
    )


def setup_chat_page(app: web.Application) -> None:
    """Add the chat page, its config and its static files."""
    app.router.add_get("/", chat_page)
    app.router.add_get("/chat/config.json", chat_config)
    app.router.add_static("/static/", STATIC_DIR)
