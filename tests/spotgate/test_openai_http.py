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
from spotgate.openai_replies import Kind
from spotgate.openai_response_writer import ResponseWriter
from spotgate.openai_responses import ResponsesRequest
from spotgate.protocol import (
    AnyFrame,
    DeltaFrame,
    DoneFrame,
    StartFrame,
    Timings,
    TokenLogprob,
    Usage,
)
from tests.support.transports import keep_writes

ClientFactory = Callable[[web.Application], Awaitable[TestClient[Any, Any]]]
Route = Callable[[web.Request, AsyncIterator[AnyFrame], SseDeltas | None], Awaitable[Any]]

TEXTS = ["Hel", "lo", ', "world"\n', "é"]
DONE = DoneFrame(
    id="s",
    finish_reason="stop",
    usage=Usage(prompt_tokens=3, completion_tokens=len(TEXTS)),
    timings=Timings(queue_ms=0, ttft_ms=1, total_ms=2),
)


def delta(text: str, with_logprobs: bool = False) -> DeltaFrame:
    """The agent's delta of one token carrying `text` (and its logprob)."""
    logprobs = [TokenLogprob(token=text, logprob=-0.5, top_logprobs=[])] if with_logprobs else None
    return DeltaFrame(id="agent-stream", text=text, n=1, logprobs=logprobs)


def completion(kind: Kind, include_usage: bool) -> Route:
    """A streamed chat or text completion."""

    async def route(
        request: web.Request, frames: AsyncIterator[AnyFrame], direct: SseDeltas | None
    ) -> web.StreamResponse:
        return await respond(
            request,
            frames,
            kind=kind,
            cid="cmpl-1",
            model="m",
            stream=True,
            include_usage=include_usage,
            direct=direct,
        )

    return route


chat = completion("chat", include_usage=True)
# With logprobs (`delta`): each text chunk's offsets follow the last's.
text_with_logprobs = completion("text", include_usage=False)


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
    plan: str,
    version: str = "1.1",
    writes: list[bytes] | None = None,
) -> tuple[list[dict[str, Any]], list[bool]]:
    """The response's events, and whether its direct path kept up before each send.

    `plan` says how each delta goes: `d` to `SseDeltas` while the handler waits for its next
    frame if it keeps up, as the gateway's relay sends it (through the handler if not), `h`
    through the handler. `writes`: where the server's writes are kept, if given.
    """
    kept_up: list[bool] = []
    writes = writes if writes is not None else []
    with_logprobs = route is text_with_logprobs

    async def handler(request: web.Request) -> web.StreamResponse:
        direct = SseDeltas(request) if "d" in plan else None
        keep_writes(request, writes)

        async def frames() -> AsyncIterator[AnyFrame]:
            yield StartFrame(id="s", agent="a")
            for text, way in zip(TEXTS, plan, strict=True):
                if way == "d":
                    assert direct is not None
                    kept_up.append(direct.keeps_up())
                    if kept_up[-1]:
                        direct.send_delta(
                            delta(text, with_logprobs), "s", with_ids=False, receipt=None
                        )
                        continue
                yield delta(text, with_logprobs)
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


@pytest.mark.parametrize("plan", ["dddd", "dhdd", "hddd"])
@pytest.mark.parametrize(
    "route",
    [chat, text_with_logprobs, responses],
    ids=["chat completion", "text completion with logprobs", "Responses API"],
)
async def test_deltas_written_at_once_make_the_events_the_handler_writes(
    aiohttp_client: ClientFactory, route: Route, plan: str
) -> None:
    through_handler, _ = await events(aiohttp_client, route, plan="hhhh")
    at_once, kept_up = await events(aiohttp_client, route, plan=plan)

    assert at_once == through_handler
    # A completion opens at `start`: every delta is sent at once, the first too. A Responses
    # API reply opens with its first delta (its first events depend on it).
    expected = [True] * plan.count("d")
    if route is responses and plan[0] == "d":
        expected[0] = False
    assert kept_up == expected


async def test_an_http_1_0_response_is_never_written_at_once(
    aiohttp_client: ClientFactory,
) -> None:
    """Its body is not chunked: aiohttp's own writer frames it."""
    through_handler, _ = await events(aiohttp_client, chat, plan="hhhh", version="1.0")
    at_once, kept_up = await events(aiohttp_client, chat, plan="dddd", version="1.0")

    assert at_once == through_handler
    assert kept_up == [False] * len(TEXTS)


@pytest.mark.parametrize("route", [chat, responses], ids=["chat completion", "Responses API"])
async def test_a_reply_s_last_events_and_the_body_s_end_go_out_in_one_write(
    aiohttp_client: ClientFactory, route: Route
) -> None:
    """The finish, the usage, `[DONE]` (chat) and the final empty chunk: one write, not four."""
    writes: list[bytes] = []
    await events(aiohttp_client, route, plan="dddd", writes=writes)

    last = writes[-1]
    assert last.endswith(b"\r\n0\r\n\r\n")
    if route is chat:
        assert b'"finish_reason":"stop"' in last
        assert b'"usage":' in last
        assert b"data: [DONE]" in last
    else:
        assert b"response.completed" in last


@pytest.mark.parametrize("plan", ["dddd", "hhhh"])
async def test_a_chat_reply_s_role_goes_out_with_its_first_text_in_one_write(
    aiohttp_client: ClientFactory, plan: str
) -> None:
    """The headers go at `start`; the role waits for the first text: no write of its own."""
    writes: list[bytes] = []
    parsed, _ = await events(aiohttp_client, chat, plan=plan, writes=writes)

    assert parsed[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    with_role = [write for write in writes if b'"role":"assistant"' in write]
    assert len(with_role) == 1
    assert b'"content":"Hel"' in with_role[0]
