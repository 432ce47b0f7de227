"""FrameSocket: the frames of one loop turn go out in one write, in order, before any close."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import WSCloseCode, web
from aiohttp.test_utils import TestClient

from spotgate.protocol import FRAME_LINES_SUBPROTOCOL, ErrorCode, ErrorFrame, encode_frame
from spotgate.wsserver import FrameSocket, text_frame
from tests.support.transports import keep_writes

# Each length class of RFC 6455 §5.2: 7-bit, 16-bit and 64-bit payload lengths.
MESSAGES = ["short", "m" * 300, "l" * 70_000]
UNREAD_BYTES = 4 * 1024 * 1024
"""Held unsent by a server whose peer stopped reading: past what loopback's buffers take."""

Act = Callable[[FrameSocket], Awaitable[None]]
ClientFactory = Callable[[web.Application], Awaitable[TestClient[Any, Any]]]


def frame(message: str) -> ErrorFrame:
    """A frame carrying `message`."""
    return ErrorFrame(code=ErrorCode.INTERNAL, message=message)


async def serve(
    aiohttp_client: ClientFactory, act: Act, writes: list[bytes], protocols: tuple[str, ...] = ()
) -> TestClient[Any, Any]:
    """A server whose socket handler runs `act`, keeping its transport's writes in `writes`."""

    async def handler(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(compress=True, protocols=protocols)
        socket = FrameSocket(ws, request, await ws.prepare(request))
        keep_writes(request, writes)
        await act(socket)
        await ws.receive()  # until the client closes
        return ws

    app = web.Application()
    app.router.add_get("/ws", handler)
    return await aiohttp_client(app)


async def received(ws: aiohttp.ClientWebSocketResponse) -> list[str]:
    """The messages of the frames the server sent, until it closes."""
    messages = []
    async for message in ws:
        messages.append(json.loads(message.data)["message"])
    return messages


async def send_messages(socket: FrameSocket) -> None:
    """Send a frame of each of `MESSAGES` in one loop turn, then close."""
    for message in MESSAGES:
        await socket.send(frame(message))
    await socket.close()


async def test_frames_of_one_turn_go_out_in_one_write_in_order(
    aiohttp_client: ClientFactory,
) -> None:
    writes: list[bytes] = []

    client = await serve(aiohttp_client, send_messages, writes)
    async with client.ws_connect("/ws", max_msg_size=0, compress=0) as ws:
        assert await received(ws) == MESSAGES
    expected = sum(len(text_frame(encode_frame(frame(m)).encode())) for m in MESSAGES)
    assert len(writes[0]) == expected  # one write for the three frames; the close frame follows


async def test_a_peer_that_asks_gets_a_turns_frames_as_lines_of_one_bounded_message(
    aiohttp_client: ClientFactory,
) -> None:
    """One message for the turn, split before a frame that would take it past the bound."""
    writes: list[bytes] = []

    client = await serve(
        aiohttp_client, send_messages, writes, protocols=(FRAME_LINES_SUBPROTOCOL,)
    )
    async with client.ws_connect(
        "/ws", max_msg_size=0, compress=0, protocols=(FRAME_LINES_SUBPROTOCOL,)
    ) as ws:
        assert ws.protocol == FRAME_LINES_SUBPROTOCOL
        messages = [message.data async for message in ws]
    lines = [[json.loads(line)["message"] for line in m.split("\n")] for m in messages]
    assert lines == [MESSAGES[:2], MESSAGES[2:]]  # the third alone is past WRITE_BUFFER_HIGH_BYTES


async def test_close_sends_what_is_queued_first(aiohttp_client: ClientFactory) -> None:
    async def act(socket: FrameSocket) -> None:
        await socket.send(frame("last words"))
        await socket.close(code=WSCloseCode.GOING_AWAY, message=b"shutting down")

    client = await serve(aiohttp_client, act, [])
    async with client.ws_connect("/ws", compress=0) as ws:
        assert await received(ws) == ["last words"]
        assert ws.close_code == WSCloseCode.GOING_AWAY


async def test_a_compressed_socket_sends_frame_by_frame(aiohttp_client: ClientFactory) -> None:
    client = await serve(aiohttp_client, send_messages, [])
    async with client.ws_connect("/ws", max_msg_size=0, compress=15) as ws:
        assert ws.compress == 15
        assert await received(ws) == MESSAGES


async def test_a_peer_that_does_not_read_is_cut_off_at_close(
    aiohttp_client: ClientFactory,
) -> None:
    """Its unread frames fill the connection: the close does not wait on it past its bound."""
    closed: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

    async def act(socket: FrameSocket) -> None:
        transport = socket._transport
        assert transport is not None
        while transport.get_write_buffer_size() < UNREAD_BYTES:
            socket.send_now(encode_frame(frame("x" * 60_000)).encode())
            socket.flush()
        await socket.close(within_seconds=0.1)
        closed.set_result(transport.is_closing())

    client = await serve(aiohttp_client, act, [])
    async with client.ws_connect("/ws", compress=0, max_msg_size=0):  # never read
        assert await closed
