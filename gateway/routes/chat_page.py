"""The browser chat page: `GET /`, its static files, and its local-mode config.

The page renders replies as Markdown with pinned libraries (`gateway.chat_vendor`), loaded
as ES modules through `<link rel="modulepreload" integrity=…>` tags this module writes into
the page from the manifest: the browser refuses a file whose sha384 differs, and the page's
own `import()` of the same URL gets the preloaded (checked) module or an error, never an
unchecked copy. That keeps the policy at `script-src 'self'` with nothing inline: an inline
import map with `integrity` would need its own hash in the policy, changing with every
version. A gateway started without the libraries says so in its log and leaves the tags
out; the page then shows replies as plain text, and says that too.
"""

from __future__ import annotations

import re
from html import escape
from pathlib import Path
from urllib.parse import urlsplit

from aiohttp import web

from gateway.chat_vendor import LIBRARY_DIR, STATIC_DIR, LibraryError, check_libraries
from gateway.chat_vendor import load_manifest as load_library_manifest
from gateway.state import STATE, names_this_gateway
from spotgate.logging import get_logger
from spotgate.protocol import ErrorCode
from spotgate.wsserver import json_error

log = get_logger(__name__)

PAGE_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; connect-src 'self' {websocket}; "
    "img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)
"""The Content-Security-Policy of every response; `{websocket}` is the page's own ws origin.

Model text reaches the page only through the sanitizer (or as text nodes); the policy is a
second wall against injection: scripts and styles from this origin only, no inline script,
no eval, images from here or data: only, connections to this gateway only (a scheme alone,
`wss:`, would let injected script send a conversation to any host), and no framing.
"""
SECURITY_HEADERS = {
    "X-Frame-Options": "DENY",  # `frame-ancestors` for browsers that predate it
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
"""Headers every response carries beside the policy: the page, its files, errors, the API."""
CHAT_PAGE_HEADERS = {"Cache-Control": "no-cache"}
HOST_HEADER = re.compile(r"(?:[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?")
"""A `Host` that is a name or an address and a port: nothing that could end a directive."""
LIBRARY_MARK = "<!-- chat libraries -->"
"""Where the page's `<head>` takes the libraries' tags."""
PAGE: web.AppKey[bytes] = web.AppKey("chat_page", bytes)


def library_tags(directory: Path) -> str:
    """The libraries' preload and stylesheet tags, or "" (logged) when they are not all here."""
    try:
        files = load_library_manifest()
        problems = check_libraries(files, directory)
    except LibraryError as err:
        problems = [str(err)]
    if problems:
        log.warning(
            "chat page: its Markdown libraries are not here, so it shows replies as plain "
            "text; `python -m gateway.chat_vendor` fetches them (make up does)",
            problems=problems,
        )
        return ""
    tags = []
    for file in files:
        href = escape(f"/static/vendor/{file.served}")
        integrity = escape(file.integrity)
        if file.is_style:
            tags.append(f'<link rel="stylesheet" href="{href}" integrity="{integrity}">')
        else:
            role = escape(file.role)
            tags.append(
                f'<link rel="modulepreload" href="{href}" integrity="{integrity}" '
                f'data-library="{role}">'
            )
    return "\n  ".join(tags)


def render_page(directory: Path) -> bytes:
    """`index.html` with the libraries' tags in place."""
    page = (STATIC_DIR / "index.html").read_text()
    return page.replace(LIBRARY_MARK, library_tags(directory), 1).encode()


def websocket_origin(host: str | None, scheme: str, public_url: str) -> str:
    """The ws:// or wss:// origin the page served to `host` connects to: the gateway's own.

    `chat.js` opens its socket on the page's own origin. Under the public URL's name that is
    the public URL's (behind a TLS load balancer the request itself arrives as plain HTTP);
    under a loopback name (local mode) it is the name asked for. A foreign name gets the
    public URL's: the page under it is not this gateway's page.
    """
    public = urlsplit(public_url)
    origin = f"{public.scheme}://{public.netloc}"
    if (
        host is not None
        and HOST_HEADER.fullmatch(host)
        and host.lower() != public.netloc.lower()
        and names_this_gateway(host, public_url)
    ):
        origin = f"{scheme}://{host.lower()}"
    return "ws" + origin.removeprefix("http")


async def add_security_headers(request: web.Request, response: web.StreamResponse) -> None:
    """Give a response the policy and the other security headers, whatever produced it."""
    websocket = websocket_origin(request.host, request.scheme, request.app[STATE].public_url)
    response.headers["Content-Security-Policy"] = PAGE_POLICY.format(websocket=websocket)
    response.headers.update(SECURITY_HEADERS)


def setup_security_headers(app: web.Application) -> None:
    """Put the policy on every response the gateway prepares: pages, static files, errors."""
    # A signal, not a middleware: it sees the static files and aiohttp's own error pages too.
    app.on_response_prepare.append(add_security_headers)


async def chat_page(request: web.Request) -> web.Response:
    """`GET /`: the browser chat page."""
    return web.Response(
        body=request.app[PAGE], content_type="text/html", charset="utf-8", headers=CHAT_PAGE_HEADERS
    )


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
    app[PAGE] = render_page(LIBRARY_DIR)
    app.router.add_get("/", chat_page)
    app.router.add_get("/chat/config.json", chat_config)
    app.router.add_static("/static/", STATIC_DIR)
