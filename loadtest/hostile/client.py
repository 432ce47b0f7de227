"""How the battery talks to a service: fresh source addresses, raw requests, judged replies."""

from __future__ import annotations

import base64
import http.client
import itertools
import json
import os
from dataclasses import dataclass
from typing import Any

import aiohttp

MODEL = "synthetic"
STREAM_TOKENS = 16
REQUEST_TIMEOUT_SECONDS = 20.0
PING = '{"type":"ping"}'


_addresses = itertools.count(1)


def fresh_address() -> str:
    """A loopback source address not used before (the gateway counts failures per address)."""
    n = next(_addresses)
    return f"127.{1 + n // 62_500 % 250}.{1 + n // 250 % 250}.{1 + n % 250}"


@dataclass(frozen=True)
class Reply:
    """An HTTP answer, its body parsed as JSON when it is JSON."""

    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def error(self) -> dict[str, Any] | None:
        """OpenAI's `error` object, if the body is one."""
        try:
            document = json.loads(self.body)
        except ValueError:
            return None
        error = document.get("error") if isinstance(document, dict) else None
        return error if isinstance(error, dict) and isinstance(error.get("message"), str) else None

    def outcome(self) -> str:
        """`401 unauthorized` / `200` / `400 text body`: a short label."""
        if self.status < 400:
            return str(self.status)
        error = self.error
        return f"{self.status} {error['code']}" if error else f"{self.status} non-JSON body"

    def problem(self, parser_limit_exceeded: bool = False) -> str | None:
        """Why this answer breaks the rules, or None.

        A 4xx must carry a JSON error (except aiohttp's own 400 for a request beyond its parser
        limits or repeating a singleton header, which never reaches spotgate); a 5xx only as
        503 with `Retry-After`.
        """
        if self.status >= 500 and not (self.status == 503 and "Retry-After" in self.headers):
            return f"{self.status}: {self.body[:120]!r}"
        if self.status >= 400 and self.error is None:
            if self.status == 400 and parser_limit_exceeded:
                return None
            return f"{self.status} without a JSON error body: {self.body[:120]!r}"
        if self.status in (429, 503) and "Retry-After" not in self.headers:
            return f"{self.status} without Retry-After"
        return None


def http_call(
    url: str,
    path: str,
    *,
    method: str = "POST",
    headers: list[tuple[str, str]] = (),  # type: ignore[assignment]
    body: bytes | None = None,
    source: str | None = None,
) -> Reply:
    """One blocking HTTP request, headers exactly as given (for hypothesis in a thread)."""
    host, port = url.removeprefix("http://").split(":")
    address = (source or fresh_address(), 0)
    connection = http.client.HTTPConnection(
        host, int(port), timeout=REQUEST_TIMEOUT_SECONDS, source_address=address
    )
    try:
        connection.putrequest(method, path, skip_accept_encoding=True)
        for name, value in headers:
            connection.putheader(name, value)
        if body is not None:
            connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body)
        response = connection.getresponse()
        return Reply(response.status, dict(response.getheaders()), response.read())
    finally:
        connection.close()


def generate_frame(stream_id: str, max_tokens: int = STREAM_TOKENS) -> str:
    """A valid `generate` frame for a short chat."""
    message = {"role": "user", "content": f"hello {stream_id}"}
    return json.dumps(
        {
            "type": "generate",
            "id": stream_id,
            "model": MODEL,
            "max_tokens": max_tokens,
            "messages": [message],
        }
    )


def chat_body(max_tokens: int = STREAM_TOKENS) -> bytes:
    """A valid chat completion request body."""
    messages = [{"role": "user", "content": "hello"}]
    return json.dumps({"model": MODEL, "max_tokens": max_tokens, "messages": messages}).encode()


def ws_url(base: str) -> str:
    """The `/v1/ws` URL of a service."""
    return base.replace("http://", "ws://", 1) + "/v1/ws"


async def http_attempt(url: str, path: str, credential: str) -> Reply:
    """A request with `Authorization: Bearer <credential>` from a fresh address."""
    connector = aiohttp.TCPConnector(local_addr=(fresh_address(), 0))
    headers = {"Authorization": f"Bearer {credential}", "Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=connector) as session:
        try:
            async with session.post(f"{url}{path}", data=chat_body(), headers=headers) as reply:
                return Reply(reply.status, dict(reply.headers), await reply.read())
        except aiohttp.ClientError as err:
            return Reply(0, {}, f"connection closed: {type(err).__name__}".encode())


async def ws_upgrade(url: str, headers: dict[str, str]) -> Reply:
    """A websocket handshake from a fresh address: 101 when accepted, else the error reply."""
    connector = aiohttp.TCPConnector(local_addr=(fresh_address(), 0))
    upgrade = {
        "Upgrade": "websocket",
        "Connection": "Upgrade",
        "Sec-WebSocket-Key": base64.b64encode(os.urandom(16)).decode(),
        "Sec-WebSocket-Version": "13",
        **headers,
    }
    async with aiohttp.ClientSession(connector=connector) as session:
        try:
            async with session.get(f"{url}/v1/ws", headers=upgrade) as reply:
                body = b"" if reply.status == 101 else await reply.read()
                return Reply(reply.status, dict(reply.headers), body)
        except aiohttp.ClientError as err:
            return Reply(0, {}, f"connection closed: {type(err).__name__}".encode())
