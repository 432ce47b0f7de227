"""Browser origins on the websocket handshake: foreign ones refused."""

from __future__ import annotations

import aiohttp

from loadtest.hostile.client import ws_upgrade
from loadtest.hostile.report import Row
from loadtest.hostile.stack import ALLOWED_ORIGIN, HostileStack

FOREIGN_ORIGIN = "https://evil.example"


async def origins(stack: HostileStack) -> Row:
    """Websocket handshakes with Origin headers: foreign refused, own and allowed accepted."""
    row = Row("gateway", "ws Origin: foreign, `null`, own, configured, none (with a valid key)")
    auth = {"Authorization": f"Bearer {stack.keys['bystander'].api_key}"}
    cases = {
        FOREIGN_ORIGIN: 403,
        "null": 403,
        f"http://localhost.evil.example:{stack.gateway_port}": 403,
        stack.gateway_url: 101,
        ALLOWED_ORIGIN: 101,
        None: 101,
    }
    for origin, expected in cases.items():
        headers = auth if origin is None else {**auth, "Origin": origin}
        reply = await ws_upgrade(stack.gateway_url, headers)
        label = f"{origin or 'no Origin'}: {reply.outcome()}"
        wrong = reply.status != expected or reply.problem() is not None
        row.record(label, f"{origin}: {reply.status}, expected {expected}" if wrong else None)
    return row


async def dns_rebinding(stack: HostileStack) -> Row:
    """A foreign name pointed at the gateway: its page is same-origin to itself, not to us."""
    row = Row(
        "gateway",
        "DNS rebinding: a foreign name as Host and Origin (the chat page's config; a ws "
        "handshake with a valid key); GET /v1/models without a key",
    )
    rebound = f"rebound.evil.example:{stack.gateway_port}"
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{stack.gateway_url}/chat/config.json", headers={"Host": rebound}) as config,
    ):
        body = await config.read()
    leaked = b"sg-" in body
    row.record(
        f"config under a foreign name: {config.status}",
        None if config.status == 403 and not leaked else f"config: {config.status} {body!r}",
    )
    auth = {"Authorization": f"Bearer {stack.keys['bystander'].api_key}"}
    reply = await ws_upgrade(
        stack.gateway_url, {**auth, "Host": rebound, "Origin": f"http://{rebound}"}
    )
    row.record(
        f"ws under a foreign name: {reply.outcome()}",
        None if reply.status == 403 else f"ws: {reply.status}, expected 403",
    )
    async with aiohttp.ClientSession() as http, http.get(f"{stack.gateway_url}/v1/models") as r:
        status = r.status
    row.record(f"models without a key: {status}", None if status == 401 else f"models: {status}")
    return row
