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

from html import escape
from pathlib import Path

from aiohttp import web

from gateway.chat_vendor import LIBRARY_DIR, STATIC_DIR, LibraryError, check_libraries
from gateway.chat_vendor import load_manifest as load_library_manifest
from gateway.state import STATE, names_this_gateway
from spotgate.logging import get_logger
from spotgate.protocol import ErrorCode
from spotgate.wsserver import json_error

log = get_logger(__name__)

CHAT_PAGE_HEADERS = {
    # Model text reaches the page only through the sanitizer (or as text nodes); the policy
    # is a second wall against injection: scripts and styles from this origin only, no
    # inline script, no eval, images from here or data: only.
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; connect-src 'self' ws: wss:; "
        "img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
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
