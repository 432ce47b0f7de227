"""Readiness and metrics on the operations port only; the traffic port has no way to them."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import aiohttp
import pytest
from pydantic import ValidationError

from spotgate.settings import GatewaySettings
from tests.gateway.conftest import Gateway
from tests.support.agents import wait_for
from tests.support.metrics import metric_value, scrape

PATH_TRICKS = (
    "/metrics",
    "/readyz",
    "/%6Detrics",  # aiohttp decodes it to /metrics before routing
    "/%6detrics",
    "/%72eadyz",
    "//metrics",
    "/metrics/",
    "/./metrics",
    "/static/../metrics",
    "/%2E/metrics",
    "/metrics?format=prometheus",
    "/METRICS",
)
"""Spellings of the operations paths a load balancer's exact path rule would let through."""


async def raw_get(url: str, path: str) -> tuple[int, bytes]:
    """`GET path` sent exactly as written (a client library would normalise it)."""
    address = urlsplit(url)
    assert address.hostname is not None
    assert address.port is not None
    reader, writer = await asyncio.open_connection(address.hostname, address.port)
    try:
        writer.write(
            f"GET {path} HTTP/1.1\r\nHost: {address.netloc}\r\nConnection: close\r\n\r\n".encode()
        )
        await writer.drain()
        reply = await reader.read()
    finally:
        writer.close()
        await writer.wait_closed()
    head, _, body = reply.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


@pytest.mark.parametrize("path", PATH_TRICKS)
async def test_no_spelling_of_readiness_or_metrics_is_answered_on_the_traffic_port(
    gateway: Gateway, path: str
) -> None:
    status, body = await raw_get(gateway.url, path)
    assert status == 404, (path, body[:200])
    assert b"spotgate_gateway" not in body
    assert b"registry" not in body


async def test_readiness_and_metrics_are_served_on_the_operations_port(gateway: Gateway) -> None:
    assert urlsplit(gateway.ops_url).port != urlsplit(gateway.url).port
    text = await scrape(f"{gateway.ops_url}/metrics")
    assert metric_value(text, "spotgate_gateway_active_streams") == 0
    async with aiohttp.ClientSession() as http:

        async def ready() -> bool:  # once the pool view has been read
            async with http.get(f"{gateway.ops_url}/readyz") as reply:
                body.update(await reply.json())
                return reply.status == 200

        body: dict[str, object] = {}
        await wait_for(ready)
        assert body["status"] == "ready"
        assert body["limits"] == "shared"
        # Liveness on both: the load balancer's health check reads the traffic port.
        for url in (gateway.url, gateway.ops_url):
            async with http.get(f"{url}/healthz") as health:
                assert (health.status, await health.json()) == (200, {"status": "ok"})
        # The operations port serves operations only: no API, no chat page.
        for path in ("/", "/v1/models", "/static/index.html", "/.well-known/jwks.json"):
            async with http.get(f"{gateway.ops_url}{path}") as other:
                assert other.status == 404, path


def test_the_operations_port_cannot_be_the_traffic_port() -> None:
    with pytest.raises(ValidationError, match="ops_port 8080 is the traffic port too"):
        GatewaySettings(port=8080, ops_port=8080)
    assert GatewaySettings(port=0, ops_port=0).ops_port == 0  # both any free port
    assert GatewaySettings().ops_port != GatewaySettings().port
