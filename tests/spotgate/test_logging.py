from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator

import pytest
import structlog
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from spotgate.apikeys import new_api_key
from spotgate.logging import (
    PARSER_REFUSAL_EVENT,
    REDACTED,
    bound_context,
    configure_logging,
    get_logger,
)
from spotgate.tokens import KeyRing, SigningKey, issue


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    structlog.reset_defaults()


@pytest.fixture
def captured() -> io.StringIO:
    stream = io.StringIO()
    configure_logging("debug", "json", stream=stream)
    return stream


def records(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_no_key_or_token_reaches_a_log_line(captured: io.StringIO) -> None:
    api_key, _ = new_api_key()
    ring = KeyRing([SigningKey.generate()])
    token = issue(ring, subject="k", issuer="i", now=1.0).token
    pem = ring.signing_key.to_pem()
    log = get_logger("test")

    log.info(f"client sent {api_key}", header=f"Bearer {token}", nested={"deep": [token]})
    log.warning("auth", token="opaque-value", authorization="Basic abc", private_key=pem)
    logging.getLogger("aiohttp.access").info("GET /v1/ws %s %s", api_key, f"bearer {token}")

    output = captured.getvalue()
    for secret in (
        api_key,
        token,
        api_key.split("-", 2)[2],
        "opaque-value",
        "Basic abc",
        "PRIVATE",
    ):
        assert secret not in output
    lines = records(captured)
    assert len(lines) == 3
    assert lines[0]["event"] == f"client sent {REDACTED}"
    assert lines[0]["nested"] == {"deep": [REDACTED]}
    assert lines[1]["token"] == REDACTED
    assert lines[2]["logger"] == "aiohttp.access"
    assert REDACTED in str(lines[2]["event"])


def test_context_fields_are_bound_to_every_line(captured: io.StringIO) -> None:
    log = get_logger("test")
    with bound_context(request_id="r1", stream_id="s1", agent_id="i-1"):
        log.info("relayed", tokens=3)
    log.info("after")

    first, second = records(captured)
    assert (first["request_id"], first["stream_id"], first["agent_id"]) == ("r1", "s1", "i-1")
    assert first["tokens"] == 3
    assert first["level"] == "info"
    assert "request_id" not in second


def test_level_filters_lower_records() -> None:
    stream = io.StringIO()
    configure_logging("warning", "json", stream=stream)
    get_logger("test").info("hidden")
    get_logger("test").error("shown")
    assert [line["event"] for line in records(stream)] == ["shown"]


def test_console_format_is_not_json() -> None:
    stream = io.StringIO()
    configure_logging("info", "console", stream=stream)
    get_logger("test").info("hello", key_id="abc")
    assert "hello" in stream.getvalue()
    with pytest.raises(json.JSONDecodeError):
        json.loads(stream.getvalue())


def test_loggers_made_at_import_time_follow_the_later_configuration() -> None:
    early = get_logger("made.early", component="x")  # as a module-level `log = …` does
    stream = io.StringIO()
    configure_logging("info", "json", stream=stream)

    early.info("after configure")

    [line] = records(stream)
    assert line["event"] == "after configure"
    assert line["component"] == "x"
    assert line["logger"] == "made.early"


async def _raw_request(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    response = await reader.read()
    writer.close()
    return response


@pytest.fixture
async def server_port(aiohttp_server: AiohttpServer) -> int:
    async def fail(_request: web.Request) -> web.Response:
        raise RuntimeError("a handler bug")

    app = web.Application()
    app.router.add_get("/fail", fail)
    server = await aiohttp_server(app)
    assert server.port is not None
    return server.port


async def test_a_request_the_parser_refuses_is_one_warning_without_a_traceback(
    captured: io.StringIO, server_port: int
) -> None:
    header = b"X-Long: " + b"a" * 9000
    response = await _raw_request(
        server_port, b"GET / HTTP/1.1\r\nHost: x\r\n" + header + b"\r\n\r\n"
    )

    assert response.split(b" ", 2)[1] == b"400"
    [line] = [line for line in records(captured) if line["logger"] == "aiohttp.server"]
    assert line["level"] == "warning"
    assert str(line["event"]).startswith(PARSER_REFUSAL_EVENT)
    assert "exception" not in line


async def test_a_handler_error_still_logs_its_traceback_at_error_level(
    captured: io.StringIO, server_port: int
) -> None:
    response = await _raw_request(server_port, b"GET /fail HTTP/1.1\r\nHost: x\r\n\r\n")

    assert response.split(b" ", 2)[1] == b"500"
    [line] = [line for line in records(captured) if line["logger"] == "aiohttp.server"]
    assert line["level"] == "error"
    assert "a handler bug" in str(line["exception"])
