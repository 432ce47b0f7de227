"""Hostile input against a live gateway and agent: no crash, nobody gets in, no secret logged.

    python -m loadtest.hostile [--examples 500] [--slow-connections 200] [--write FILE]

The stack is real processes: an AWS emulator (moto server, in this process), the gateway and
one synthetic agent that verifies tokens against the gateway's JWKS, both logging JSON at
debug level to files. Each class of input is thrown at both services: hypothesis-generated
websocket frames, HTTP bodies and headers; forged, oversized, expired and retired JWTs; API
key guessing; foreign browser origins; slow senders; a client that never reads. Every
answer is checked (a 4xx has OpenAI's JSON error body, nothing is a 5xx, a socket either
lives on or closes with a documented code), and at the end every captured log line is
searched for the API keys, the tokens and the signing keys used. One table row per class.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hmac
import http.client
import inspect
import itertools
import json
import os
import secrets
import shutil
import socket
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import websockets
import websockets.sync.client
from aiohttp import web
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from pydantic import SecretStr

from loadtest.bench.report import machine_facts, write_section
from loadtest.chaos import REPORT_TITLE
from spotgate.apikeys import parse_api_key, secret_matches
from spotgate.logging import PARSER_REFUSAL_EVENT
from spotgate.process import Child, ChildProcesses, free_port, serving_on_loopback
from spotgate.protocol import DoneFrame, ErrorFrame, FrameError, PongFrame, parse_frame
from spotgate.registry import CreatedApiKey, Registry
from spotgate.settings import (
    AgentSettings,
    GatewaySettings,
    QueueSettings,
    SharedSettings,
    SyntheticSettings,
    TokenSettings,
)
from spotgate.tokens import AGENT_AUDIENCE, SigningKey
from stack.children import start_service
from stack.emulator import AwsEmulator

MODEL = "synthetic"
STREAM_TOKENS = 16
FUZZ_KEY_MAX_TOKENS = 64  # keeps fuzzed requests that happen to be valid short
TOKENS_PER_SECOND = 20_000.0  # fast enough that a client that never reads falls behind at once
SLOW_SENDER_TIMEOUT_SECONDS = 3.0  # the stack's keep-alive (header) and body timeouts
TIMEOUT_SLACK_SECONDS = 3.0
REQUEST_TIMEOUT_SECONDS = 20.0
FLOOD_STREAMS = 16
FLOOD_SECONDS = 8.0
FLOOD_MAX_TOKENS = 1_000_000
FLOOD_ENDINGS = frozenset({"timeout", "length"})
"""How an unread stream may end: stopped for its unread backlog, or finished."""
MAX_RSS_GROWTH_MB = 150.0
MAX_OTHER_CLIENT_SECONDS = 5.0
RSS_SAMPLE_SECONDS = 0.25
MAX_FRAME_BYTES = 64 * 1024
AIOHTTP_MAX_FIELD_BYTES = 8190  # aiohttp's parser refuses longer header lines with a plain 400
AIOHTTP_MAX_HEADERS = 128
# Headers aiohttp's parser refuses to see twice in a request (a plain 400, before spotgate).
AIOHTTP_SINGLETON_HEADERS = frozenset(
    {
        "content-length",
        "content-location",
        "content-range",
        "content-type",
        "etag",
        "host",
        "max-forwards",
        "server",
        "transfer-encoding",
        "user-agent",
    }
)
ALLOWED_ORIGIN = "https://chat.example"
FOREIGN_ORIGIN = "https://evil.example"
FAILED_AUTH_PER_CLIENT = 20  # the gateway's defaults, which the battery checks
FAILED_AUTH_PER_KEY = 60
DOCUMENTED_CLOSE_CODES = {1007: "invalid UTF-8", 1009: "frame too big"}
PING = '{"type":"ping"}'
COMMAND = "python -m loadtest.hostile --write docs/reliability.md"


# --- bookkeeping ------------------------------------------------------------------------------


@dataclass
class Row:
    """One line of the report: what was thrown at which service, and what came back."""

    target: str
    inputs: str
    tried: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def record(self, outcome: str, problem: str | None = None) -> None:
        """Count one input's outcome; a problem fails the row."""
        self.tried += 1
        self.outcomes[outcome] += 1
        if problem is not None:
            self.problems.append(problem)

    @property
    def passed(self) -> bool:
        """No input met a problem."""
        return not self.problems

    def cells(self) -> str:
        """`target | inputs | tried | outcome | result` cells of the report."""
        ranked = sorted(self.outcomes.items(), key=lambda item: (-item[1], item[0]))
        outcome = "; ".join([*(f"{n}× {what}" for what, n in ranked), *self.notes])
        result = "pass" if self.passed else f"**FAIL**: {self.problems[0][:200]}"
        return f"{self.target} | {self.inputs} | {self.tried} | {outcome} | {result}"


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


# --- the stack --------------------------------------------------------------------------------


class HostileStack:
    """The emulator, the gateway and one synthetic agent as processes, logging JSON to files."""

    def __init__(self, directory: Path) -> None:
        self.emulator = AwsEmulator()
        self.log_dir = directory / "logs"
        self.processes = ChildProcesses(self.log_dir)
        self.gateway_port = free_port()
        self.gateway_url = f"http://127.0.0.1:{self.gateway_port}"
        self.agent_url = f"http://127.0.0.1:{free_port()}"
        self.signing_key = SigningKey.generate()
        self.keys: dict[str, CreatedApiKey] = {}
        self.secrets: set[str] = set()  # what no log line may contain
        self.gateway: Child | None = None
        self.agent: Child | None = None
        self._http: aiohttp.ClientSession | None = None

    @property
    def http(self) -> aiohttp.ClientSession:
        """A session for the battery's own well-behaved calls."""
        if self._http is None:
            raise RuntimeError("the stack is not started")
        return self._http

    async def __aenter__(self) -> HostileStack:
        self.emulator.start()
        self._http = aiohttp.ClientSession()
        async with Registry.open(self.emulator.settings()) as registry:
            await registry.create_tables()
            for name in ("fuzz", "reader", "victim", "bystander"):
                limit = FUZZ_KEY_MAX_TOKENS if name == "fuzz" else None
                created = await registry.create_key(name, max_tokens=limit)
                self.keys[name] = created
                self.secrets.add(created.api_key)
                self.secrets.add(parse_api_key(created.api_key).secret)
        await self.start_gateway("gateway")
        agent = AgentSettings(
            shared=self._shared(),
            engine="synthetic",
            served_model_name=MODEL,
            agent_id="hostile-agent",
            port=int(self.agent_url.rsplit(":", 1)[1]),
            jwks_url=f"{self.gateway_url}/.well-known/jwks.json",
            imds_url="http://127.0.0.1:9",
            heartbeat_seconds=1,
            keepalive_seconds=SLOW_SENDER_TIMEOUT_SECONDS,
            http_body_timeout_seconds=SLOW_SENDER_TIMEOUT_SECONDS,
            synthetic=SyntheticSettings(
                tokens_per_second=TOKENS_PER_SECOND,
                ttft_seconds=0.01,
                # Room for the flood's replies: a smaller context would refuse them outright.
                max_model_len=2 * FLOOD_MAX_TOKENS,
            ),
        )
        self.agent = start_service(self.processes, "agent", agent)
        await self.wait_routable()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.processes.stop(lambda _child: True, 30)
        self.processes.close()
        if self._http is not None:
            await self._http.close()
        self.emulator.stop()

    def _shared(self) -> SharedSettings:
        return self.emulator.settings().model_copy(
            update={"log_format": "json", "log_level": "debug"}  # the most a log could say
        )

    async def start_gateway(self, name: str) -> None:
        """Run the gateway with the current signing key; wait until it answers."""
        pem = self.signing_key.to_pem()
        self.secrets.update(line for line in pem.splitlines() if "-----" not in line)
        gateway = GatewaySettings(
            shared=self._shared(),
            port=self.gateway_port,
            public_url=self.gateway_url,
            token=TokenSettings(signing_key_pem=SecretStr(pem), ttl_seconds=900),
            models=(MODEL,),
            queue=QueueSettings(deadline_seconds=5),
            allowed_origins=(ALLOWED_ORIGIN,),
            keepalive_seconds=SLOW_SENDER_TIMEOUT_SECONDS,
            http_body_timeout_seconds=SLOW_SENDER_TIMEOUT_SECONDS,
        )
        self.gateway = start_service(self.processes, name, gateway)
        async with asyncio.timeout(60):
            while True:
                self.processes.check()
                with suppress(aiohttp.ClientError):
                    async with self.http.get(f"{self.gateway_url}/healthz") as reply:
                        if reply.status == 200:
                            return
                await asyncio.sleep(0.2)

    async def rotate_signing_key(self) -> None:
        """Restart the gateway with a new signing key and without the old one (retired)."""
        gateway = self.gateway
        if gateway is None:
            raise RuntimeError("the gateway is not started")
        await self.processes.stop(lambda child: child is gateway, 30)
        self.processes.children.remove(gateway)  # its log stays, for the secrets search
        self.signing_key = SigningKey.generate()
        await self.start_gateway("gateway-rotated")
        await self.wait_routable()

    async def wait_routable(self) -> None:
        """Until a short chat through the gateway completes (the agent is ready and linked)."""
        headers = {"Authorization": f"Bearer {self.keys['bystander'].api_key}"}
        async with asyncio.timeout(90):
            while True:
                self.processes.check()
                with suppress(aiohttp.ClientError):
                    async with self.http.post(
                        f"{self.gateway_url}/v1/chat/completions", data=chat_body(), headers=headers
                    ) as reply:
                        if reply.status == 200:
                            return
                await asyncio.sleep(0.5)

    async def token(self, key: str) -> str:
        """A token for the named API key, from `POST /v1/token`."""
        headers = {"Authorization": f"Bearer {self.keys[key].api_key}"}
        async with self.http.post(f"{self.gateway_url}/v1/token", headers=headers) as reply:
            token: str = (await reply.json())["token"]
        self.secrets.add(token)
        return token

    def pid(self, child: Child | None) -> int:
        """The process id of a running child."""
        if child is None or not child.running:
            raise RuntimeError("that process is not running")
        return child.process.pid

    def log_lines(self) -> list[tuple[str, str]]:
        """(file name, line) of everything every process wrote."""
        return [
            (path.name, line)
            for path in sorted(self.log_dir.glob("*.log"))
            for line in path.read_text(errors="replace").splitlines()
        ]


def ws_url(base: str) -> str:
    """The `/v1/ws` URL of a service."""
    return base.replace("http://", "ws://", 1) + "/v1/ws"


# --- websocket frames (hypothesis) ------------------------------------------------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=12,
)
FRAME_FIELDS = (
    "id",
    "model",
    "messages",
    "prompt",
    "max_tokens",
    "temperature",
    "top_p",
    "stop",
    "seed",
    "session",
    "want_ids",
    "resume",
    "token",
)
FRAME_LIKE = st.fixed_dictionaries(
    {"type": st.sampled_from(["generate", "cancel", "auth", "ping", "delta", "done", "x"])},
    optional={
        name: JSON_VALUES | st.sampled_from([MODEL, "s1", 1, -1, 10**30, "\ud800", [], {}])
        for name in FRAME_FIELDS
    },
)


def _invalid_utf8(data: bytes) -> bytes:
    return b"\xff\xfe" + data + b"\xc3"


WS_PAYLOADS: st.SearchStrategy[tuple[str | bytes, bool]] = st.one_of(
    FRAME_LIKE.map(lambda frame: (json.dumps(frame), True)),
    JSON_VALUES.map(lambda value: (json.dumps(value), True)),
    st.text(max_size=200).map(lambda text: (text, True)),
    st.integers(MAX_FRAME_BYTES - 200, MAX_FRAME_BYTES + 4096).map(
        lambda n: (
            json.dumps({"type": "generate", "id": "h", "model": MODEL, "prompt": "x" * n}),
            True,
        )
    ),
    st.integers(10, 30_000).map(lambda depth: ("[" * depth + "]" * depth, True)),
    st.binary(max_size=200).map(lambda data: (_invalid_utf8(data), True)),
    st.binary(max_size=200).map(lambda data: (data, False)),
)


class WsProbe:
    """One socket to a service, reopened when the server closes it (blocking, for a thread)."""

    def __init__(self, url: str, credential: str, row: Row) -> None:
        self._url = url
        self._credential = credential
        self._row = row
        self._ws: websockets.sync.client.ClientConnection | None = None
        self._ids = itertools.count()

    def _socket(self) -> websockets.sync.client.ClientConnection:
        if self._ws is None:
            host, port = self._url.removeprefix("ws://").split("/")[0].split(":")
            sock = socket.create_connection((host, int(port)), source_address=(fresh_address(), 0))
            self._ws = websockets.sync.client.connect(
                self._url,
                sock=sock,
                additional_headers={"Authorization": f"Bearer {self._credential}"},
                max_size=None,
                compression=None,
                proxy=None,
                open_timeout=REQUEST_TIMEOUT_SECONDS,
                close_timeout=2,
                legacy=True,  # held open across hypothesis examples, not in a `with` block
            )
        return self._ws

    def close(self) -> None:
        """Close the socket if open."""
        if self._ws is not None:
            self._ws.close()
            self._ws = None

    def exchange(self, data: str | bytes, text: bool) -> None:
        """Send one payload and a ping; record what came back before the pong."""
        ws = self._socket()
        seen: list[Any] = []
        try:
            ws.send(data, text=text)
            ws.send(PING)
            while True:
                raw = ws.recv(timeout=REQUEST_TIMEOUT_SECONDS)
                try:
                    frame = parse_frame(raw, origin="server", max_bytes=16 * 1024 * 1024)
                except FrameError as err:
                    self._row.record("invalid server frame", f"server sent {raw[:80]!r}: {err}")
                    return
                if isinstance(frame, PongFrame):
                    break
                seen.append(frame)
        except websockets.ConnectionClosed as err:
            self._ws = None
            code = err.rcvd.code if err.rcvd is not None else None
            if code is None and len(data) > MAX_FRAME_BYTES:
                # Refused (1009) while still being written: the close frame may be lost.
                self._row.record("connection dropped (frame over 64 KiB)")
                return
            reason = DOCUMENTED_CLOSE_CODES.get(code or 0)
            problem = None if reason else f"closed with {code} after {str(data)[:80]!r}"
            self._row.record(f"close {code} ({reason or 'undocumented'})", problem)
            return
        except TimeoutError:
            self._row.record("no pong", f"no pong after {str(data)[:80]!r}")
            return
        codes = sorted({frame.code.value for frame in seen if isinstance(frame, ErrorFrame)})
        what = (
            f"error frame {'/'.join(codes)}" if codes else "stream frames" if seen else "no reply"
        )
        self._row.record(f"{what}, socket lives")

    def generate_works(self, reopened: bool = False) -> str | None:
        """A valid stream on this socket (reopened if it was closed); why not, or None."""
        ws = self._socket()
        stream_id = f"check-{next(self._ids)}"
        deadline = time.monotonic() + REQUEST_TIMEOUT_SECONDS
        try:
            ws.send(generate_frame(stream_id))
            while time.monotonic() < deadline:
                frame = parse_frame(ws.recv(timeout=REQUEST_TIMEOUT_SECONDS), origin="server")
                if getattr(frame, "id", None) != stream_id:
                    continue
                if isinstance(frame, DoneFrame):
                    return None
                if isinstance(frame, ErrorFrame):
                    return f"valid generate refused: {frame.code.value} {frame.message}"
        except websockets.ConnectionClosed as err:
            # An earlier oversized or invalid frame may close the socket only now (documented).
            self._ws = None
            code = err.rcvd.code if err.rcvd is not None else None
            if (code is None or code in DOCUMENTED_CLOSE_CODES) and not reopened:
                return self.generate_works(reopened=True)
            return f"socket closed with {code} under a valid generate"
        return "valid generate did not finish"


def hypothesis_settings(examples: int) -> settings:
    """Generation only (no shrinking: a failure is reported as found), no example database."""
    return settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )


def fuzz_websocket(target: str, url: str, credential: str, examples: int) -> Row:
    """Hypothesis frames on one socket; every so often, and at the end, a valid stream."""
    row = Row(
        target,
        "ws frames (hypothesis): JSON of wrong shapes and types, non-JSON text, "
        "unicode, nesting depth, frames near/over 64 KiB, invalid UTF-8, binary",
    )
    probe = WsProbe(url, credential, row)
    checks = itertools.count(1)

    @hypothesis_settings(examples)
    @given(WS_PAYLOADS)
    def run(payload: tuple[str | bytes, bool]) -> None:
        probe.exchange(*payload)
        if next(checks) % 25 == 0 and (problem := probe.generate_works()) is not None:
            row.problems.append(problem)

    run()
    for problem in (probe.generate_works(), WsProbe(url, credential, row).generate_works()):
        if problem is not None:
            row.problems.append(problem)
    probe.close()
    row.notes.append("a valid stream after every 25 inputs and on a fresh socket: done")
    return row


# --- HTTP bodies and headers (hypothesis) -----------------------------------------------------

MESSAGE_LIKE = st.fixed_dictionaries(
    {},
    optional={
        "role": st.sampled_from(["user", "system", "assistant", "tool", "root"]) | JSON_VALUES,
        "content": st.text(max_size=100) | JSON_VALUES,
    },
)
REQUEST_LIKE = st.fixed_dictionaries(
    {},
    optional={
        "model": st.sampled_from([MODEL, "unknown"]) | JSON_VALUES,
        "messages": st.lists(MESSAGE_LIKE, max_size=3) | JSON_VALUES,
        "prompt": st.text(max_size=100) | JSON_VALUES,
        "max_tokens": st.integers(-5, 10**7) | JSON_VALUES,
        "stream": st.booleans() | JSON_VALUES,
        "temperature": st.floats() | JSON_VALUES,
        "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}) | JSON_VALUES,
        "stop": JSON_VALUES,
        "n": JSON_VALUES,
    },
)
HTTP_BODIES: st.SearchStrategy[bytes] = st.one_of(
    REQUEST_LIKE.map(lambda body: json.dumps(body).encode()),
    JSON_VALUES.map(lambda value: json.dumps(value).encode()),
    st.binary(max_size=500),
    st.text(max_size=500).map(str.encode),
    st.integers(10, 100_000).map(lambda depth: b"[" * depth + b"]" * depth),
    st.sampled_from([1_000_000, 4 * 1024 * 1024 + 1]).map(
        lambda n: b'{"model":"' + b"x" * n + b'"}'
    ),
)
LATIN1_TEXT = st.text(
    alphabet=st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"),
    max_size=300,
)
HEADER_NAMES = st.text(alphabet="abcdefghijklmnopqrstuvwxyzXY-", min_size=1, max_size=20)


def fuzz_bodies(target: str, url: str, paths: list[str], credential: str, examples: int) -> Row:
    """Hypothesis bodies, authenticated, to each path: no 5xx, every 4xx a JSON error."""
    row = Row(
        target,
        f"HTTP bodies (hypothesis) to {', '.join(paths)}: JSON of wrong shapes, "
        "binary, text, nesting depth, 1 MB and 4 MiB + 1",
    )
    source = fresh_address()
    headers = [("Authorization", f"Bearer {credential}"), ("Content-Type", "application/json")]

    @hypothesis_settings(examples)
    @given(HTTP_BODIES, st.sampled_from(paths))
    def run(body: bytes, path: str) -> None:
        reply = http_call(url, path, headers=headers, body=body, source=source)
        row.record(f"{reply.outcome()}", reply.problem())

    run()
    return row


def fuzz_headers(target: str, url: str, path: str, credential: str, examples: int) -> Row:
    """Hypothesis headers with a valid body: Authorization variants, huge and many headers."""
    row = Row(
        target,
        f"HTTP headers (hypothesis) to {path}: Authorization variants, "
        "Content-Type, values up to 20 KB, up to 200 headers",
    )
    authorizations = st.one_of(
        st.just(f"Bearer {credential}"),
        st.sampled_from(
            [
                "",
                "Bearer",
                "Bearer  ",
                f"bearer {credential}",
                "Basic dXNlcjpwYXNz",
                "Bearer sg-",
                f"Bearer {credential}x",
                "Bearer " + "A" * 9000,
            ]
        ),
        LATIN1_TEXT.map(lambda text: f"Bearer {text}"),
        LATIN1_TEXT,
    )
    content_types = st.sampled_from(["application/json", "text/plain", "", "multipart/form-data"])

    @hypothesis_settings(examples)
    @given(
        authorizations,
        content_types | LATIN1_TEXT,
        st.lists(st.tuples(HEADER_NAMES, LATIN1_TEXT), max_size=200),
        st.integers(0, 20_000),
    )
    def run(authorization: str, content_type: str, extra: list[tuple[str, str]], huge: int) -> None:
        headers = [
            ("Authorization", authorization.strip()),
            ("Content-Type", content_type.strip()),
            ("X-Huge", "v" * huge),
            *((name, value.strip()) for name, value in extra),
        ]
        sent = ["host", *(name.lower() for name, _value in headers), "content-length"]
        repeated = {name for name in AIOHTTP_SINGLETON_HEADERS if sent.count(name) > 1}
        beyond_parser = (
            len(headers) + 3 > AIOHTTP_MAX_HEADERS
            or bool(repeated)
            or any(len(name) + len(value) + 2 > AIOHTTP_MAX_FIELD_BYTES for name, value in headers)
        )
        reply = http_call(url, path, headers=headers, body=chat_body(4))
        outcome = reply.outcome()
        if beyond_parser and reply.status == 400 and reply.error is None:
            outcome = "400 from aiohttp's parser (request beyond its limits, or a repeated header)"
        row.record(outcome, reply.problem(parser_limit_exceeded=beyond_parser))

    run()
    return row


# --- JWT attacks ------------------------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def compact(header: dict[str, Any], payload: dict[str, Any], sign: Callable[[bytes], bytes]) -> str:
    """A compact JWS with any header and any signature function."""
    signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(payload).encode())}"
    return f"{signing_input}.{_b64(sign(signing_input.encode()))}"


def claims(issuer: str, subject: str, now: float, **changes: Any) -> dict[str, Any]:
    """Claims a spotgate token would carry, with `changes`."""
    base = {
        "iss": issuer,
        "aud": AGENT_AUDIENCE,
        "sub": subject,
        "iat": int(now),
        "nbf": int(now),
        "exp": int(now) + 300,
        "jti": secrets.token_urlsafe(8),
    }
    return {**base, **changes}


def attack_tokens(
    stack: HostileStack, foreign_jwks_url: str, foreign: SigningKey
) -> dict[str, list[str]]:
    """Forged tokens by attack, all naming a real key id as their subject."""
    now = time.time()
    trusted = stack.signing_key
    payload = claims(stack.gateway_url, stack.keys["fuzz"].record.key_id, now)
    raw_public = base64.urlsafe_b64decode(trusted.verify_key.to_jwk()["x"] + "=")
    public_forms = [
        raw_public,
        trusted.verify_key.to_pem().encode(),
        trusted.verify_key.to_jwk()["x"].encode(),
        json.dumps(trusted.verify_key.to_jwk()).encode(),
    ]
    foreign_jwk = foreign.verify_key.to_jwk()
    ed_foreign = foreign.private_key.sign
    ed_trusted = trusted.private_key.sign
    kid = trusted.kid

    def hs(secret: bytes, digest: str) -> Callable[[bytes], bytes]:
        return lambda data: hmac.new(secret, data, digest).digest()

    return {
        "alg none (none, None, NONE; with and without the trusted kid)": [
            compact({"alg": alg, "typ": "JWT", **extra}, payload, lambda _data: b"")
            for alg in ("none", "None", "NONE")
            for extra in ({}, {"kid": kid})
        ],
        "HS256/HS512 keyed with the public key (raw, PEM, JWK x, JWK JSON)": [
            compact({"alg": alg, "kid": kid}, payload, hs(form, digest))
            for form in public_forms
            for alg, digest in (("HS256", "sha256"), ("HS512", "sha512"))
        ],
        "kid injection (../../etc/passwd, SQL, foreign JWKS URL, 5000 chars, NUL, object; "
        "jku, x5u and embedded jwk headers)": [
            *(
                compact({"alg": "EdDSA", "kid": bad}, payload, ed_foreign)
                for bad in (
                    "../../etc/passwd",
                    "' OR '1'='1' --",
                    foreign_jwks_url,
                    "k" * 5000,
                    "\x00",
                    {"$ne": ""},
                )
            ),
            compact(
                {"alg": "EdDSA", "kid": foreign.kid, "jku": foreign_jwks_url}, payload, ed_foreign
            ),
            compact(
                {"alg": "EdDSA", "kid": foreign.kid, "x5u": foreign_jwks_url}, payload, ed_foreign
            ),
            compact({"alg": "EdDSA", "kid": foreign.kid, "jwk": foreign_jwk}, payload, ed_foreign),
        ],
        "trusted kid, foreign signature": [
            compact({"alg": "EdDSA", "kid": kid}, payload, ed_foreign),
            compact({"alg": "EdDSA", "kid": kid, "jwk": foreign_jwk}, payload, ed_foreign),
        ],
        "huge tokens, signed by the trusted key (9 KB, 64 KB, 1 MB)": [
            compact({"alg": "EdDSA", "kid": kid}, {**payload, "pad": "p" * size}, ed_trusted)
            for size in (9_000, 64_000, 1_000_000)
        ],
        "expired, wrong audience, wrong issuer (trusted key)": [
            compact(
                {"alg": "EdDSA", "kid": kid}, claims(stack.gateway_url, "x", now - 3600), ed_trusted
            ),
            compact({"alg": "EdDSA", "kid": kid}, {**payload, "aud": "someone-else"}, ed_trusted),
            compact(
                {"alg": "EdDSA", "kid": kid}, {**payload, "iss": "https://evil.example"}, ed_trusted
            ),
        ],
    }


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


async def first_frame_auth(url: str, credential: str) -> str:
    """A browser-style `auth` first frame; what the server answered."""
    sock_url = ws_url(url)
    try:
        async with websockets.connect(
            sock_url,
            max_size=None,
            proxy=None,
            compression=None,
            close_timeout=2,
            local_addr=(fresh_address(), 0),
        ) as ws:
            await ws.send(json.dumps({"type": "auth", "token": credential}))
            await ws.send(PING)
            reply = json.loads(await asyncio.wait_for(ws.recv(), REQUEST_TIMEOUT_SECONDS))
            if reply.get("type") == "pong":
                return "accepted"
            await asyncio.wait_for(ws.wait_closed(), REQUEST_TIMEOUT_SECONDS)
            return f"error frame {reply.get('code')}, close {ws.close_code}"
    except websockets.ConnectionClosed as err:
        # Closed while the client was still writing a huge frame, the close frame may be lost.
        return f"close {err.rcvd.code}" if err.rcvd else "connection dropped"


def judge_refusal(row: Row, where: str, reply: Reply, *, huge: bool) -> None:
    """A forged token must be refused: 401 with a JSON error (or the parser's 400 if huge)."""
    outcome = f"{where}: {reply.outcome()}"
    if reply.status in (101, 200):
        row.record(outcome, f"{where} accepted a forged token")
    elif reply.status == 401 and reply.error is not None:
        row.record(f"{where}: 401 {reply.error['message']}")
    elif huge and (reply.status in (0, 400)):
        row.record(f"{where}: {reply.status or 'connection closed'} (header beyond 8 KiB limit)")
    else:
        row.record(outcome, f"{where} answered {reply.status} {reply.body[:80]!r}")


async def try_token(row: Row, stack: HostileStack, token: str) -> None:
    """One token against both services: HTTP, websocket header and websocket first frame."""
    huge = len(token) > AIOHTTP_MAX_FIELD_BYTES
    for service, url in (("gateway", stack.gateway_url), ("agent", stack.agent_url)):
        judge_refusal(
            row,
            f"{service} http",
            await http_attempt(url, "/v1/chat/completions", token),
            huge=huge,
        )
        auth = {"Authorization": f"Bearer {token}"}
        judge_refusal(row, f"{service} ws", await ws_upgrade(url, auth), huge=huge)
        frame = await first_frame_auth(url, token)
        big_frame = len(token) > MAX_FRAME_BYTES
        ok = frame.endswith("close 1008") or (
            big_frame and frame in ("close 1009", "connection dropped")
        )
        row.record(f"{service} auth frame: {frame}", None if ok else f"{service}: {frame}")


@asynccontextmanager
async def foreign_jwks_server(foreign: SigningKey) -> AsyncIterator[tuple[str, list[str]]]:
    """An attacker's JWKS on loopback; the list records every fetch (there must be none)."""
    fetched: list[str] = []

    async def jwks(request: web.Request) -> web.Response:
        fetched.append(request.path)
        return web.json_response({"keys": [foreign.verify_key.to_jwk()]})

    app = web.Application()
    app.router.add_get("/{tail:.*}", jwks)
    async with serving_on_loopback(app) as url:
        yield f"{url}/.well-known/jwks.json", fetched


async def jwt_attacks(stack: HostileStack) -> list[Row]:
    """Forged tokens against gateway and agent, one row per attack."""
    foreign = SigningKey.generate()
    rows = []
    async with foreign_jwks_server(foreign) as (url, fetched):
        for attack, tokens in attack_tokens(stack, url, foreign).items():
            row = Row("gateway + agent", f"JWT: {attack}")
            for token in tokens:
                await try_token(row, stack, token)
            rows.append(row)
        if fetched:
            rows[2].problems.append(f"a service fetched the attacker's JWKS: {fetched}")
        else:
            rows[2].notes.append("the attacker's JWKS server was never contacted")
    return rows


async def replay_after_rotation(stack: HostileStack) -> Row:
    """A valid token, replayed after the key that signed it was retired from the gateway."""
    row = Row(
        "gateway + agent",
        "JWT: valid token replayed after its signing key was retired "
        "(gateway restarted with a new key only)",
    )
    old = await stack.token("fuzz")
    before = await ws_upgrade(stack.agent_url, {"Authorization": f"Bearer {old}"})
    if before.status != 101:
        row.problems.append(f"the token did not work before rotation: {before.outcome()}")
    await stack.rotate_signing_key()
    await try_token(row, stack, old)
    fresh = await stack.token("fuzz")
    after = await ws_upgrade(stack.agent_url, {"Authorization": f"Bearer {fresh}"})
    if after.status != 101:
        row.problems.append(f"a token of the new key was refused: {after.outcome()}")
    row.notes.append("tokens of the new key: accepted")
    return row


# --- API key guessing -------------------------------------------------------------------------


async def token_attempt(stack: HostileStack, api_key: str, source: str) -> Reply:
    """`POST /v1/token` with an API key from a given address."""
    connector = aiohttp.TCPConnector(local_addr=(source, 0))
    headers = {"Authorization": f"Bearer {api_key}"}
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.post(f"{stack.gateway_url}/v1/token", headers=headers) as reply,
    ):
        return Reply(reply.status, dict(reply.headers), await reply.read())


def wrong_key(key_id: str) -> str:
    """An API key for `key_id` with a random (wrong) secret."""
    return f"sg-{key_id}-{secrets.token_urlsafe(32)}"


async def guess(
    row: Row,
    stack: HostileStack,
    key: Callable[[], str],
    source: Callable[[], str],
    count: int,
    budget_per_minute: int,
) -> None:
    """`count` wrong keys: the budget (and what refilled meanwhile) answer 401, the rest 429."""
    started = time.monotonic()
    replies = [await token_attempt(stack, key(), source()) for _ in range(count)]
    refilled = (time.monotonic() - started) * budget_per_minute / 60
    for reply in replies:
        row.record(reply.outcome(), reply.problem())
    refused = sum(reply.status == 401 for reply in replies)
    limited = sum(reply.status == 429 for reply in replies)
    expected = min(count, budget_per_minute)
    if not expected <= refused <= expected + refilled + 1 or refused + limited != count:
        row.problems.append(
            f"{refused} × 401 and {limited} × 429 for a budget of {budget_per_minute}/min"
        )


async def key_guessing(stack: HostileStack, tries: int) -> list[Row]:
    """Wrong secrets from one address, random key ids, one key id from many addresses."""
    fuzz_id = stack.keys["fuzz"].record.key_id
    one = fresh_address()
    same_id = Row(
        "gateway",
        f"API key: wrong secrets for one real key id, one address "
        f"(budget {FAILED_AUTH_PER_CLIENT}/min per address)",
    )
    await guess(
        same_id, stack, lambda: wrong_key(fuzz_id), lambda: one, tries, FAILED_AUTH_PER_CLIENT
    )
    locked = await token_attempt(stack, stack.keys["fuzz"].api_key, one)
    elsewhere = await token_attempt(stack, stack.keys["fuzz"].api_key, fresh_address())
    same_id.notes.append(
        f"the right key from that address: {locked.outcome()}, from another: {elsewhere.outcome()}"
    )
    if locked.status != 429 or elsewhere.status != 200:
        same_id.problems.append("the lockout is not per address")

    two = fresh_address()
    random_ids = Row("gateway", "API key: random key ids and secrets, one address")
    await guess(
        random_ids,
        stack,
        lambda: wrong_key(secrets.token_hex(6)),
        lambda: two,
        tries,
        FAILED_AUTH_PER_CLIENT,
    )

    victim = stack.keys["victim"]
    many = Row(
        "gateway",
        f"API key: wrong secrets for one key id, a new address each time "
        f"(budget {FAILED_AUTH_PER_KEY}/min per key id)",
    )
    await guess(
        many,
        stack,
        lambda: wrong_key(victim.record.key_id),
        fresh_address,
        FAILED_AUTH_PER_KEY + tries // 2,
        FAILED_AUTH_PER_KEY,
    )
    owner = await token_attempt(stack, victim.api_key, fresh_address())
    other = await token_attempt(stack, stack.keys["bystander"].api_key, fresh_address())
    many.notes.append(
        f"the key's owner meanwhile: {owner.outcome()} (documented); another key: {other.outcome()}"
    )
    if owner.status != 429 or other.status != 200:
        many.problems.append("the lockout is not per key id")

    compare = Row("gateway", "API key compare: constant time (code check)")
    checks = {
        "secret_matches uses hmac.compare_digest": "hmac.compare_digest"
        in inspect.getsource(secret_matches),
        "Registry.verify_key compares unknown key ids against a decoy hash": "secret_matches("
        in inspect.getsource(Registry.verify_key),
    }
    for check, holds in checks.items():
        compare.record(f"{check}: {'yes' if holds else 'no'}", None if holds else check)
    return [same_id, random_ids, many, compare]


# --- browser origins --------------------------------------------------------------------------


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


# --- slow senders -----------------------------------------------------------------------------


async def slow_headers(host: str, port: int) -> float | None:
    """Send a request's headers one byte a second; seconds until the server hangs up."""
    reader, writer = await asyncio.open_connection(host, port, local_addr=(fresh_address(), 0))
    started = time.monotonic()
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    closed = asyncio.ensure_future(reader.read())
    try:
        while time.monotonic() - started < SLOW_SENDER_TIMEOUT_SECONDS + TIMEOUT_SLACK_SECONDS:
            done, _ = await asyncio.wait({closed}, timeout=1.0)
            if done:
                return time.monotonic() - started
            writer.write(b"a")
    except ConnectionError:
        return time.monotonic() - started
    else:
        return None
    finally:
        closed.cancel()
        writer.close()


async def slow_body(host: str, port: int, path: str, credential: str) -> tuple[float, bytes]:
    """Send headers promising 1000 bytes and one byte a second; seconds and the answer."""
    reader, writer = await asyncio.open_connection(host, port, local_addr=(fresh_address(), 0))
    started = time.monotonic()
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {credential}\r\n"
        "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{".encode()
    )
    answer = asyncio.ensure_future(reader.read(4096))
    try:
        while time.monotonic() - started < SLOW_SENDER_TIMEOUT_SECONDS + TIMEOUT_SLACK_SECONDS:
            done, _ = await asyncio.wait({answer}, timeout=1.0)
            if done:
                return time.monotonic() - started, answer.result()
            writer.write(b" ")
        return time.monotonic() - started, b""
    except ConnectionError:
        return time.monotonic() - started, b""
    finally:
        answer.cancel()
        writer.close()


async def normal_latencies(url: str, headers: dict[str, str], stop: asyncio.Event) -> list[float]:
    """Short chats one after another until `stop`; each one's seconds (inf if it failed)."""
    latencies = []
    async with aiohttp.ClientSession() as session:
        while not stop.is_set():
            started = time.monotonic()
            try:
                async with session.post(
                    f"{url}/v1/chat/completions", data=chat_body(), headers=headers
                ) as reply:
                    await reply.read()
                    ok = reply.status == 200
            except aiohttp.ClientError:
                ok = False
            latencies.append(time.monotonic() - started if ok else float("inf"))
            await asyncio.sleep(0.1)
    return latencies


async def slowloris(target: str, url: str, credential: str, connections: int) -> Row:
    """Many header-dripping and body-stalling connections while a normal client is timed."""
    row = Row(
        target,
        f"slow senders: {connections} connections sending headers at 1 byte/s, "
        f"{connections} sending a body at 1 byte/s",
    )
    host, port = url.removeprefix("http://").split(":")
    stop = asyncio.Event()
    normal = asyncio.ensure_future(
        normal_latencies(url, {"Authorization": f"Bearer {credential}"}, stop)
    )
    path = "/v1/chat/completions"
    headers_done = [slow_headers(host, int(port)) for _ in range(connections)]
    bodies_done = [slow_body(host, int(port), path, credential) for _ in range(connections)]
    header_times = await asyncio.gather(*headers_done)
    body_results = await asyncio.gather(*bodies_done)
    stop.set()
    latencies = await normal
    limit = SLOW_SENDER_TIMEOUT_SECONDS + TIMEOUT_SLACK_SECONDS
    for seconds in header_times:
        if seconds is None:
            row.record("headers: still open", f"a header dripper outlived {limit:.0f} s")
        else:
            row.record(f"headers: closed by the server after {round(seconds)} s")
    for seconds, answer in body_results:
        status = answer.split(b"\r\n", 1)[0].decode(errors="replace")
        json_error = b'"error"' in answer
        label = f"body: {status or 'no answer'}{' (JSON error)' if json_error else ''}"
        ok = status.endswith("408 Request Timeout") and json_error and seconds < limit
        row.record(f"{label} after {round(seconds)} s", None if ok else f"body: {label}")
    served = [seconds for seconds in latencies if seconds != float("inf")]
    failed = len(latencies) - len(served)
    if served:
        row.notes.append(
            f"meanwhile {len(served)} normal chats: median "
            f"{statistics.median(served) * 1000:.0f} ms, max {max(served) * 1000:.0f} ms"
        )
    if failed or not served or max(served) > MAX_OTHER_CLIENT_SECONDS:
        row.problems.append(f"normal chats during the attack: {failed} failed, {served[-3:]}")
    return row


# --- a client that never reads ----------------------------------------------------------------


async def never_reads(target: str, url: str, credential: str, pid: int) -> Row:
    """Long streams on a socket nobody reads: the server's memory stays bounded."""
    row = Row(
        target,
        f"a client that never reads: {FLOOD_STREAMS} streams of up to "
        f"{FLOOD_MAX_TOKENS:,} tokens at {TOKENS_PER_SECOND:,.0f} tokens/s each",
    )
    process = psutil.Process(pid)
    baseline = process.memory_info().rss
    peak = baseline
    stop = asyncio.Event()
    headers = {"Authorization": f"Bearer {credential}"}
    async with websockets.connect(
        ws_url(url),
        additional_headers=headers,
        max_queue=1,
        proxy=None,
        compression=None,
        close_timeout=1,
        ping_interval=None,
    ) as ws:
        for n in range(FLOOD_STREAMS):
            await ws.send(generate_frame(f"flood-{n}", FLOOD_MAX_TOKENS))
        normal = asyncio.ensure_future(normal_latencies(url, headers, stop))
        started = time.monotonic()
        while time.monotonic() - started < FLOOD_SECONDS:
            peak = max(peak, process.memory_info().rss)
            await asyncio.sleep(RSS_SAMPLE_SECONDS)  # sampling memory, not synchronising
        stop.set()
        latencies = await normal
        growth_mb = (peak - baseline) / 1e6
        ends: Counter[str] = Counter()
        with suppress(TimeoutError, websockets.ConnectionClosed):
            async with asyncio.timeout(REQUEST_TIMEOUT_SECONDS):
                while sum(ends.values()) < FLOOD_STREAMS:
                    frame = json.loads(await ws.recv())
                    if frame["type"] in ("done", "error"):
                        ends[frame.get("code") or frame.get("finish_reason") or "?"] += 1
    row.record(
        f"peak RSS growth {growth_mb:.0f} MB",
        None if growth_mb < MAX_RSS_GROWTH_MB else f"RSS grew {growth_mb:.0f} MB",
    )
    row.notes.append(
        f"reading afterwards for up to {REQUEST_TIMEOUT_SECONDS:.0f} s: "
        + (
            ", ".join(f"{n}× ended {why}" for why, n in ends.items())
            or "streams still going (paused while unread)"
        )
    )
    served = [seconds for seconds in latencies if seconds != float("inf")]
    if served:
        row.notes.append(
            f"another client meanwhile: {len(served)} chats, max {max(served) * 1000:.0f} ms"
        )
    if len(served) != len(latencies) or not served or max(served) > MAX_OTHER_CLIENT_SECONDS:
        row.problems.append(f"another client was held up: {latencies[-3:]}")
    refused = sorted(why for why in ends if why not in FLOOD_ENDINGS)
    if refused:
        row.problems.append(f"flood streams were refused, not streamed: {', '.join(refused)}")
    return row


# --- logs ---------------------------------------------------------------------------------------


def _masked(line: str, secrets: set[str]) -> str:
    """The line with every secret in it replaced by `<secret>` (longest first)."""
    for secret in sorted(secrets, key=len, reverse=True):
        line = line.replace(secret, "<secret>")
    return line


def log_rows(stack: HostileStack) -> list[Row]:
    """No secret in any log line; no unhandled error; both services still running."""
    lines = stack.log_lines()
    files = sorted({name for name, _line in lines})
    leaks = Row(
        "all processes",
        f"secrets in logs: {len(stack.secrets)} API keys, secret "
        "halves, issued tokens and signing key lines searched for",
    )
    leaked = [(name, line) for name, line in lines for secret in stack.secrets if secret in line]
    leaks.record(
        f"{len(lines)} lines in {', '.join(files)}: {len(leaked)} secrets",
        f"{leaked[0][0]} logs a secret: {_masked(leaked[0][1], stack.secrets)[:400]}"
        if leaked
        else None,
    )
    redacted = sum("[redacted]" in line for _name, line in lines)
    leaks.notes.append(f"{redacted} lines carry `[redacted]` where a credential was")
    crashes = Row(
        "all processes",
        "unhandled errors: tracebacks, aiohttp's 'Error handling request', critical lines; exits",
    )
    bad = [
        (name, line)
        for name, line in lines
        if "Traceback" in line or "Error handling request" in line or '"critical"' in line
    ]
    crashes.record(f"{len(bad)} such lines", f"{bad[0][0]}: {bad[0][1][:300]}" if bad else None)
    refused = sum(PARSER_REFUSAL_EVENT in line for _name, line in lines)
    crashes.notes.append(f"{refused} warnings (no traceback) for requests aiohttp's parser refused")
    try:
        stack.processes.check()
        crashes.notes.append("gateway and agent running at the end")
    except Exception as err:
        crashes.problems.append(str(err))
    return [leaks, crashes]


# --- the battery ------------------------------------------------------------------------------


async def run_battery(
    examples: int, slow_connections: int, guesses: int, keep_logs: Path | None = None
) -> list[Row]:
    """Every class of hostile input against one stack, then the logs (copied to `keep_logs`)."""
    with tempfile.TemporaryDirectory(prefix="spotgate-hostile-") as scratch:
        async with HostileStack(Path(scratch)) as stack:
            gateway, agent = stack.gateway_url, stack.agent_url
            fuzz_key = stack.keys["fuzz"].api_key
            agent_token = await stack.token("fuzz")
            rows = [
                await asyncio.to_thread(
                    fuzz_websocket, "gateway", ws_url(gateway), fuzz_key, examples
                ),
                await asyncio.to_thread(
                    fuzz_websocket, "agent", ws_url(agent), agent_token, examples
                ),
                await asyncio.to_thread(
                    fuzz_bodies,
                    "gateway",
                    gateway,
                    ["/v1/chat/completions", "/v1/completions", "/v1/token"],
                    fuzz_key,
                    examples,
                ),
                await asyncio.to_thread(
                    fuzz_bodies, "agent", agent, ["/v1/chat/completions"], agent_token, examples
                ),
                await asyncio.to_thread(
                    fuzz_headers, "gateway", gateway, "/v1/chat/completions", fuzz_key, examples
                ),
                await asyncio.to_thread(
                    fuzz_headers, "agent", agent, "/v1/chat/completions", agent_token, examples
                ),
            ]
            rows += await jwt_attacks(stack)
            rows += await key_guessing(stack, guesses)
            rows.append(await origins(stack))
            rows.append(await slowloris("gateway", gateway, fuzz_key, slow_connections))
            rows.append(await slowloris("agent", agent, agent_token, slow_connections))
            reader_key = stack.keys["reader"].api_key
            rows.append(await never_reads("gateway", gateway, reader_key, stack.pid(stack.gateway)))
            reader_token = await stack.token("reader")
            rows.append(await never_reads("agent", agent, reader_token, stack.pid(stack.agent)))
            rows.append(await replay_after_rotation(stack))
            rows += log_rows(stack)
        if keep_logs is not None:
            shutil.copytree(stack.log_dir, keep_logs, dirs_exist_ok=True)
    return rows


def render(rows: list[Row], examples: int) -> str:
    """The results table for `docs/reliability.md`."""
    lines = [
        "## Hostile input (local stack, synthetic engine)",
        "",
        f"Command: `{COMMAND}` ({examples} hypothesis examples per fuzzed class).",
        "The gateway and one synthetic agent run as processes logging JSON at debug level; the "
        "agent verifies tokens against the gateway's JWKS. Every 4xx must carry OpenAI's JSON "
        "error body (aiohttp's own plain 400 for a request beyond its parser limits — a header "
        "line over 8190 bytes, more than 128 headers, a repeated Host or Content-Type — never "
        "reaches spotgate), nothing may be a 5xx, a socket lives on after a bad frame (one "
        "over 64 KiB included: an error for its stream) or closes with 1009 (more than 1 MiB "
        "over) or 1007 (invalid UTF-8), and no log line may hold a secret. Failed "
        "authentications come "
        "from a new loopback address each, except where the row says otherwise. The stack runs "
        f"with {SLOW_SENDER_TIMEOUT_SECONDS:.0f} s keep-alive and body timeouts (defaults: 75 s "
        "and 30 s).",
        f"Machine: {machine_facts()}.",
        "",
        "| target | input | tried | outcome | result |",
        "|---|---|---|---|---|",
        *(f"| {row.cells().replace(chr(10), ' ')} |" for row in rows),
    ]
    return "\n".join(lines)


def main() -> None:
    """Run the battery and print (and optionally write) the table."""
    parser = argparse.ArgumentParser(description="spotgate hostile input battery")
    parser.add_argument("--examples", type=int, default=500)
    parser.add_argument("--slow-connections", type=int, default=200)
    parser.add_argument("--guesses", type=int, default=40)
    parser.add_argument("--write", type=Path)
    parser.add_argument("--keep-logs", type=Path, help="copy the processes' logs here")
    args = parser.parse_args()
    rows = asyncio.run(
        run_battery(args.examples, args.slow_connections, args.guesses, args.keep_logs)
    )
    section = render(rows, args.examples)
    print(section)
    if args.write:
        if not args.write.exists():
            args.write.write_text(REPORT_TITLE)
        write_section(args.write, "hostile", section)
    if not all(row.passed for row in rows):
        raise SystemExit("hostile input found a problem")


if __name__ == "__main__":
    main()
