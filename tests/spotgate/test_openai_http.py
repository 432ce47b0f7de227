"""SSE responses: deltas written at once (`SseDeltas`) make the events the handler would."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from spotgate.openai_http import SseDeltas, respond, respond_response
from spotgate.openai_response_writer import ResponseWriter
from spotgate.openai_responses import ResponsesRequest
from spotgate.protocol import AnyFrame, DeltaFrame, DoneFrame, StartFrame, Timings, Usage

ClientFactory = Callable[[web.Application], Awaitable[TestClient[Any, Any]]]
Route = Callable[[web.Request, AsyncIterator[AnyFrame], SseDeltas | None], Awaitable[Any]]

TEXTS = ["Hel", "lo", ', "world"\n', "é"]
DONE = DoneFrame(
    id="s",
    finish_reason="stop",
    usage=Usage(prompt_tokens=3, completion_tokens=len(TEXTS)),
    timings=Timings(queue_ms=0, ttft_ms=1, total_ms=2),
)


def delta(text: str) -> DeltaFrame:
    """The agent's delta of one token carrying `text`."""
    return DeltaFrame(id="agent-stream", text=text, n=1)


async def chat(
    request: web.Request, frames: AsyncIterator[AnyFrame], direct: SseDeltas | None
) -> web.StreamResponse:
    """A streamed chat completion, with its usage."""
    return await respond(
        request,
        frames,
        kind="chat",
        cid="chatcmpl-1",
        model="m",
        stream=True,
        include_usage=True,
        direct=direct,
    )


async def responses(
    request: web.Request, frames: AsyncIterator[AnyFrame], direct: SseDeltas | None
) -> web.StreamResponse:
    """A streamed Responses API reply."""
    body = ResponsesRequest.model_validate({"model": "m", "input": "hi", "stream": True})
    writer = ResponseWriter(body, "resp_1", None)
    return await respond_response(request, frames, writer, stream=True, direct=direct)


async def events(
    aiohttp_client: ClientFactory,
    route: Route,
    *,
    at_once: bool,
    version: str = "1.1",
    writes: list[bytes] | None = None,
) -> tuple[list[dict[str, Any]], list[bool]]:
    """The response's events, and whether its direct path kept up before and after each send.

    `writes`: where the server's writes to the connection are kept, if given.
    `at_once`: every delta after the first is sent through `SseDeltas` while the handler
    waits for its next frame, as the gateway's relay does; otherwise through the handler.
    """
    kept_up: list[bool] = []
    writes = writes if writes is not None else []

    async def handler(request: web.Request) -> web.StreamResponse:
        direct = SseDeltas(request) if at_once else None
        transport = request.transport
        assert transport is not None
        write = transport.write

        def kept(data: bytes | bytearray | memoryview) -> None:
            writes.append(bytes(data))
            write(data)

        transport.write = kept  # type: ignore[method-assign]

        async def frames() -> AsyncIterator[AnyFrame]:
            yield StartFrame(id="s", agent="a")
            if direct is not None:
                kept_up.append(direct.keeps_up())
            yield delta(TEXTS[0])
            for text in TEXTS[1:]:
                if direct is not None and direct.keeps_up():
                    kept_up.append(True)
                    direct.send_delta(delta(text), "s", with_ids=False, receipt=None)
                else:
                    kept_up.append(False)
                    yield delta(text)
            yield DONE

        response: web.StreamResponse = await route(request, frames(), direct)
        return response

    app = web.Application()
    app.router.add_post("/", handler)
    client = await aiohttp_client(app)
    if version == "1.1":
        async with client.post("/") as reply:  # aiohttp's client reads the chunks strictly
            assert reply.status == 200
            body = await reply.text()
    else:  # read to the connection's close, as an HTTP/1.0 response ends
        reader, writer = await asyncio.open_connection(client.host, client.port)
        writer.write(b"POST / HTTP/1.0\r\nContent-Length: 0\r\n\r\n")
        head, _, raw = (await reader.read()).partition(b"\r\n\r\n")
        writer.close()
        assert head.startswith(b"HTTP/1.0 200 "), head
        body = raw.decode()
    payloads = [
        line.removeprefix("data: ")
        for line in body.splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]
    # An item's id is drawn at random for each response.
    parsed = [json.loads(re.sub(r'"msg_[0-9a-f]+"', '"msg_"', payload)) for payload in payloads]
    for event in parsed:
        event.pop("created", None)  # the second it was made
        event.get("response", {}).pop("created_at", None)
    return parsed, kept_up


@pytest.mark.parametrize("route", [chat, responses], ids=["chat completion", "Responses API"])
async def test_deltas_written_at_once_make_the_events_the_handler_writes(
    aiohttp_client: ClientFactory, route: Route
) -> None:
    through_handler, _ = await events(aiohttp_client, route, at_once=False)
    at_once, kept_up = await events(aiohttp_client, route, at_once=True)

    assert at_once == through_handler
    # Not before the response's first chunk (its headers go out with it); then each delta.
    assert kept_up == [False, True, True, True]


async def test_an_http_1_0_response_is_never_written_at_once(
    aiohttp_client: ClientFactory,
) -> None:
    """Its body is not chunked: aiohttp's own writer frames it."""
    through_handler, _ = await events(aiohttp_client, chat, at_once=False, version="1.0")
    at_once, kept_up = await events(aiohttp_client, chat, at_once=True, version="1.0")

    assert at_once == through_handler
    assert kept_up == [False] * len(TEXTS)


@pytest.mark.parametrize("route", [chat, responses], ids=["chat completion", "Responses API"])
async def test_a_reply_s_last_events_and_the_body_s_end_go_out_in_one_write(
    aiohttp_client: ClientFactory, route: Route
) -> None:
    """The finish, the usage, `[DONE]` (chat) and the final empty chunk: one write, not four."""
    writes: list[bytes] = []
    await events(aiohttp_client, route, at_once=True, writes=writes)

    last = writes[-1]
    assert last.endswith(b"\r\n0\r\n\r\n")
    if route is chat:
        assert b'"finish_reason":"stop"' in last
        assert b'"usage":' in last
        assert b"data: [DONE]" in last
    else:
        assert b"response.completed" in last
