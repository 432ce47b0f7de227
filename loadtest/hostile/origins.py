"""Browser origins on the websocket handshake: foreign ones refused."""

from __future__ import annotations

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
