"""The server side of a `spotgate.v1` websocket, shared by the gateway and the agents.

One loop per socket: authentication (an `Authorization` header, or for browsers an `auth`
frame within a few seconds), the socket limits of ARCHITECTURE.md (frame size, heartbeat, idle
timeout, streams per connection), ping/pong, token refresh, cancel, and a clear `error` frame
for every bad input while the socket's other streams live on. What a stream *does* is the
service's business: it hands in an `authenticate` and a `start` function.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from contextlib import suppress
from dataclasses import dataclass
from typing import Generic, Literal, Protocol, TypeVar

from aiohttp import WSCloseCode, WSMsgType, web
from aiohttp.abc import AbstractStreamWriter

from spotgate.admission import Refusal
from spotgate.openai_replies import ERROR_STATUS, error_body
from spotgate.protocol import (
    FRAME_LINES_SUBPROTOCOL,
    AnyFrame,
    AuthFrame,
    CancelFrame,
    ErrorCode,
    ErrorFrame,
    FrameError,
    GenerateFrame,
    PingFrame,
    PongFrame,
    encode_frame,
    parse_frame,
)
from spotgate.settings import SocketLimits

Principal = TypeVar("Principal")
Send = Callable[[AnyFrame], Awaitable[None]]
WRITE_BUFFER_HIGH_BYTES = 64 * 1024
"""Unsent bytes a socket may hold before its senders wait for the peer to read."""
SOCKET_CLOSE_SECONDS = 5.0
"""How long closing a socket waits on its peer: one that does not read is cut off after it."""
TEXT_FRAME_FIN = 0x81  # RFC 6455 §5.2: FIN bit, opcode 1 (text); server frames are unmasked


class AuthRefused(Exception):
    """A credential was refused; the message is safe to show the client."""

    code = ErrorCode.UNAUTHORIZED
    retry_after: float | None = None


class AuthUnavailable(AuthRefused):
    """The credential cannot be checked right now (the registry is unreachable)."""

    code = ErrorCode.NO_CAPACITY
    retry_after = 5.0


def transport_keeps_up(transport: asyncio.Transport | None, pending_bytes: int = 0) -> bool:
    """Whether a connection takes more now: open, with `WRITE_BUFFER_HIGH_BYTES` unsent at most.

    `pending_bytes`: what its sender holds for it, not yet written.
    """
    return (
        transport is not None
        and not transport.is_closing()
        and pending_bytes + transport.get_write_buffer_size() <= WRITE_BUFFER_HIGH_BYTES
    )


def text_frame(payload: bytes) -> bytes:
    """`payload` as one unmasked websocket text frame (RFC 6455 §5.2)."""
    length = len(payload)
    if length < 126:
        header = bytes((TEXT_FRAME_FIN, length))
    elif length < 1 << 16:
        header = bytes((TEXT_FRAME_FIN, 126)) + length.to_bytes(2, "big")
    else:
        header = bytes((TEXT_FRAME_FIN, 127)) + length.to_bytes(8, "big")
    return header + payload


class FrameSocket:
    """A server websocket whose frames go out together, in one write per event-loop turn.

    A socket carrying many streams (an agent's link to the gateway, a client's socket to the
    gateway) would otherwise cost a write, a system call and a packet per token. Frames sent
    in one turn of the loop are written at its end, in order; a sender waits only when the
    peer stops reading. A socket with per-message compression sends frame by frame. A peer
    that asked for `FRAME_LINES_SUBPROTOCOL` gets a turn's frames as one message, a line
    each, of at most `WRITE_BUFFER_HIGH_BYTES` unless one frame alone is larger.
    """

    def __init__(
        self, ws: web.WebSocketResponse, request: web.Request, writer: AbstractStreamWriter
    ) -> None:
        self.ws = ws
        self._transport = request.transport
        self._writer = writer
        self._lines = ws.ws_protocol == FRAME_LINES_SUBPROTOCOL
        # Kept: `asyncio.get_running_loop()` makes a system call (getpid) each time, before 3.12.
        self._loop = asyncio.get_running_loop()
        self._pending: list[bytes] = []  # websocket frames, or with `_lines` their lines
        self._pending_bytes = 0

    async def send(self, frame: AnyFrame) -> None:
        """Queue a frame for this loop turn's write; wait if the peer is not reading."""
        if self.ws.closed:
            return
        if self.ws.compress or self._transport is None:
            with suppress(ConnectionResetError):
                await self.ws.send_str(encode_frame(frame))
            return
        self.send_now(encode_frame(frame).encode())
        if self._transport.get_write_buffer_size() > WRITE_BUFFER_HIGH_BYTES:
            await self._writer.drain()

    def keeps_up(self) -> bool:
        """Whether a frame may be sent now without waiting (`WRITE_BUFFER_HIGH_BYTES` unsent)."""
        return (
            not self.ws.closed
            and not self.ws.compress
            and transport_keeps_up(self._transport, self._pending_bytes)
        )

    def send_now(self, data: bytes) -> None:
        """Queue a frame's JSON (`encode_frame`'s) for this turn's write, without waiting."""
        if self._transport is None:
            raise RuntimeError("the socket has no transport")
        if self._lines:
            # Each line counts the newline after it: with this frame the message would be
            # `_pending_bytes + len(data)` bytes, kept within the bound.
            if self._pending and self._pending_bytes + len(data) > WRITE_BUFFER_HIGH_BYTES:
                self.flush()
            self._pending_bytes += 1
        else:
            data = text_frame(data)
        self._pending.append(data)
        self._pending_bytes += len(data)
        if len(self._pending) == 1:
            self._loop.call_soon(self.flush)
        if self._pending_bytes > WRITE_BUFFER_HIGH_BYTES:  # a sender that never lets the loop turn
            self.flush()

    def flush(self) -> None:
        """Write every queued frame now."""
        frames, self._pending, self._pending_bytes = self._pending, [], 0
        if frames and self._transport is not None and not self._transport.is_closing():
            self._transport.write(
                text_frame(b"\n".join(frames)) if self._lines else b"".join(frames)
            )

    async def close(
        self,
        code: int = WSCloseCode.OK,
        message: bytes = b"",
        within_seconds: float = SOCKET_CLOSE_SECONDS,
    ) -> None:
        """Send what is queued, then close; a peer not done within `within_seconds` is cut off.

        aiohttp's close waits without a bound for a peer that stopped reading to take what
        is unsent: such a client would hold a gateway's stop, and every socket closed after
        its own.
        """
        self.flush()
        try:
            async with asyncio.timeout(within_seconds):
                await self.ws.close(code=code, message=message)
        except TimeoutError:
            if self._transport is not None:
                self._transport.abort()


async def close_going_away(sockets: Iterable[FrameSocket], message: bytes) -> None:
    """Close every socket with GOING_AWAY, together: one cut off at its bound delays no other."""
    await asyncio.gather(
        *(socket.close(code=WSCloseCode.GOING_AWAY, message=message) for socket in list(sockets))
    )


class StreamControl(Protocol):
    """A running stream as the socket loop needs it."""

    task: asyncio.Task[None]

    def end(self, reason: Literal["cancelled"]) -> None:
        """Stop the stream early (`cancelled` by the client)."""
        ...


@dataclass
class StreamHandlers(Generic[Principal]):
    """What a service plugs into the socket loop."""

    authenticate: Callable[[str], Awaitable[Principal]]
    refusal: Callable[[GenerateFrame, Principal], Refusal | None]  # `spotgate.admission`
    start: Callable[[GenerateFrame, Principal, FrameSocket], StreamControl]
    # Streams one socket may run at once; None: the socket limit of the settings.
    max_streams: Callable[[Principal], int | None] = lambda _principal: None
    # The largest frame a principal authenticated by header may send; None: the settings'.
    max_frame_bytes: Callable[[Principal], int | None] = lambda _principal: None


OVERSIZE_ANSWERED_BYTES = 1024 * 1024
"""A frame up to this much over its limit is still read, to answer it with an `error` for its
stream; past that aiohttp closes the socket (1009), and every stream on it ends."""


def receive_limit(frame_limit: int) -> int:
    """The aiohttp `max_msg_size` of a socket whose frames may have `frame_limit` bytes."""
    return frame_limit + max(frame_limit, OVERSIZE_ANSWERED_BYTES)


def bearer_token(request: web.Request) -> str | None:
    """The credential of an `Authorization: Bearer …` header."""
    scheme, _, credential = request.headers.get("Authorization", "").partition(" ")
    return credential.strip() if scheme.lower() == "bearer" and credential.strip() else None


def json_error(
    code: ErrorCode,
    message: str,
    retry_after: float | None = None,
    param: str | None = None,
) -> web.Response:
    """An OpenAI-style error response, with `Retry-After` when there is a wait."""
    status, _type = ERROR_STATUS[code]
    headers = {"Retry-After": str(max(1, round(retry_after)))} if retry_after is not None else None
    return web.json_response(error_body(code, message, param), status=status, headers=headers)


async def serve_websocket(
    request: web.Request,
    handlers: StreamHandlers[Principal],
    limits: SocketLimits,
    *,
    compress: bool = False,
    sockets: set[FrameSocket] | None = None,
) -> web.StreamResponse:
    """Run one client socket until it closes."""
    principal: Principal | None = None
    token = bearer_token(request)
    if token is not None:
        try:
            principal = await handlers.authenticate(token)
        except AuthRefused as err:
            return json_error(err.code, str(err), err.retry_after)
    frame_limit = limits.max_frame_bytes
    if principal is not None:
        frame_limit = handlers.max_frame_bytes(principal) or frame_limit
    ws = web.WebSocketResponse(
        heartbeat=limits.heartbeat_seconds,
        max_msg_size=receive_limit(frame_limit),
        compress=compress,
        protocols=(FRAME_LINES_SUBPROTOCOL,),
    )
    socket = FrameSocket(ws, request, await ws.prepare(request))
    if sockets is not None:
        sockets.add(socket)
    streams: dict[str, StreamControl] = {}
    send = socket.send

    try:
        if principal is None:
            principal = await _first_frame_auth(ws, handlers, limits.auth_timeout_seconds)
            if principal is None:
                return ws
        while not ws.closed:
            try:
                message = await ws.receive(timeout=limits.idle_timeout_seconds)
            except TimeoutError:
                if streams:
                    continue
                await send(ErrorFrame(code=ErrorCode.TIMEOUT, message="idle timeout"))
                break
            if message.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED):
                break
            if message.type == WSMsgType.ERROR:
                await send(ErrorFrame(code=ErrorCode.INVALID_REQUEST, message=str(ws.exception())))
                break
            if message.type != WSMsgType.TEXT:
                await send(
                    ErrorFrame(code=ErrorCode.INVALID_REQUEST, message="send JSON text frames")
                )
                continue
            try:
                frame = parse_frame(message.data, max_bytes=frame_limit)
            except FrameError as err:
                await send(err.frame())
                continue
            principal = await _handle(frame, principal, handlers, limits, streams, socket)
    finally:
        for stream in list(streams.values()):
            stream.end("cancelled")
        if sockets is not None:
            sockets.discard(socket)
        if not ws.closed:
            await socket.close()
    return ws


async def _first_frame_auth(
    ws: web.WebSocketResponse, handlers: StreamHandlers[Principal], timeout_seconds: float
) -> Principal | None:
    """Browsers send `{"type":"auth","token":…}` first; anything else closes the socket."""
    try:
        message = await ws.receive(timeout=timeout_seconds)
        frame = parse_frame(message.data) if message.type == WSMsgType.TEXT else None
        if not isinstance(frame, AuthFrame):
            raise AuthRefused("authenticate first: send an 'auth' frame")
        return await handlers.authenticate(frame.token)
    except TimeoutError:
        refused = ErrorFrame(code=ErrorCode.UNAUTHORIZED, message="no 'auth' frame in time")
    except FrameError as err:
        refused = ErrorFrame(code=ErrorCode.UNAUTHORIZED, message=str(err))
    except AuthRefused as err:
        refused = ErrorFrame(code=err.code, message=str(err), retry_after=err.retry_after)
    with suppress(ConnectionResetError):  # the first frame may already have closed the socket
        await ws.send_str(encode_frame(refused))
    close_code = (
        WSCloseCode.TRY_AGAIN_LATER
        if refused.code == ErrorCode.NO_CAPACITY
        else WSCloseCode.POLICY_VIOLATION
    )
    await ws.close(code=close_code)
    return None


async def _handle(
    frame: GenerateFrame | CancelFrame | AuthFrame | PingFrame,
    principal: Principal,
    handlers: StreamHandlers[Principal],
    limits: SocketLimits,
    streams: dict[str, StreamControl],
    socket: FrameSocket,
) -> Principal:
    """Act on one frame; returns the socket's principal (refreshed by an `auth` frame)."""
    send = socket.send
    if isinstance(frame, PingFrame):
        await send(PongFrame())
    elif isinstance(frame, AuthFrame):
        try:
            principal = await handlers.authenticate(frame.token)
        except AuthRefused as err:
            await send(ErrorFrame(code=err.code, message=str(err), retry_after=err.retry_after))
    elif isinstance(frame, CancelFrame):
        stream = streams.get(frame.id)
        if stream is not None:
            stream.end("cancelled")
    else:
        refusal = _refusal(frame, principal, handlers, limits, streams)
        if refusal is not None:
            await send(
                ErrorFrame(
                    id=frame.id, code=refusal.code, message=refusal.message, param=refusal.param
                )
            )
            return principal
        stream = handlers.start(frame, principal, socket)
        streams[frame.id] = stream
        stream_id = frame.id

        def forget(_task: asyncio.Task[None]) -> None:
            if streams.get(stream_id) is stream:
                del streams[stream_id]

        stream.task.add_done_callback(forget)
    return principal


def _refusal(
    frame: GenerateFrame,
    principal: Principal,
    handlers: StreamHandlers[Principal],
    limits: SocketLimits,
    streams: dict[str, StreamControl],
) -> Refusal | None:
    if frame.id in streams:
        return Refusal(ErrorCode.INVALID_REQUEST, f"stream id '{frame.id}' is already running")
    cap = handlers.max_streams(principal) or limits.max_streams_per_connection
    if len(streams) >= cap:
        return Refusal(ErrorCode.RATE_LIMITED, f"at most {cap} streams per connection")
    return handlers.refusal(frame, principal)
