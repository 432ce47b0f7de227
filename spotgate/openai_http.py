"""OpenAI-compatible HTTP responses from a stream of protocol frames (gateway and agents).

A service turns a request into a `generate` frame, runs it, and hands the frames here: they
become one JSON completion, or Server-Sent Events ending in `data: [DONE]`. An error before
the engine takes the request (its `start`) is a proper HTTP status (429 and 503 with
`Retry-After`); an error after it is sent in-band, as vLLM does.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import suppress
from typing import TypeVar

from aiohttp import HttpVersion11, web
from pydantic import BaseModel, ValidationError

from spotgate.openai_api import validation_message
from spotgate.openai_replies import (
    SSE_DONE,
    ChunkEncoder,
    ForcedTools,
    Kind,
    completion_body,
    error_body,
    openai_finish_reason,
    own_tool_calls,
    shown_text,
    sse_event,
    usage_body,
)
from spotgate.openai_response_writer import ResponseWriter
from spotgate.openai_responses import responses_param
from spotgate.protocol import (
    AnyFrame,
    DeltaFrame,
    DoneFrame,
    ErrorCode,
    ErrorFrame,
    StartFrame,
    TokenLogprob,
)
from spotgate.wsserver import json_error, transport_keeps_up

RequestModel = TypeVar("RequestModel", bound=BaseModel)


async def read_body(
    request: web.Request, model: type[RequestModel], timeout_seconds: float
) -> RequestModel | web.Response:
    """The request body as `model`; a 400 naming the first problem, 413 or 408 otherwise."""
    try:
        async with asyncio.timeout(timeout_seconds):
            raw = await request.read()
    except TimeoutError:
        # A sender this slow holds a connection and a handler: let it go with an answer.
        message = f"request body not received within {timeout_seconds:g} s"
        return web.json_response(error_body(ErrorCode.TIMEOUT, message), status=408)
    except web.HTTPRequestEntityTooLarge:
        # aiohttp's own answer would be plain text; every error here is OpenAI's JSON body.
        message = f"request body exceeds {request.client_max_size} bytes"
        return web.json_response(error_body(ErrorCode.INVALID_REQUEST, message), status=413)
    try:
        return model.model_validate_json(raw)
    except ValidationError as err:
        message, where = validation_message(err.errors(include_url=False)[0])
        return json_error(ErrorCode.INVALID_REQUEST, message, param=where)


class SseDeltas:
    """A streamed response's deltas written to its connection at once, while it keeps up.

    The gateway's relay sends a delta here from the agent link's reader (`DirectSend`)
    instead of waking the request's handler to write it, only while the handler waits for
    its next frame. Open once the handler has written the response's headers and opening
    chunk, and only for a reply whose deltas are events of their own (not a forced tool
    call's chat or text completion): each is then one HTTP/1.1 chunk, framed as aiohttp
    frames them, written to the transport in order with the handler's own writes. An
    HTTP/1.0 response is not chunked, and never open. aiohttp's count of the body's bytes
    (`body_length`) leaves these out.
    """

    def __init__(self, request: web.Request) -> None:
        self._transport = request.transport if request.version >= HttpVersion11 else None
        self._encode: Callable[[DeltaFrame], bytes] | None = None

    def open(self, encode: Callable[[DeltaFrame], bytes]) -> None:
        """Send deltas at once from now on, as `encode` makes their events."""
        self._encode = encode

    def close(self) -> None:
        """Send nothing more at once: the response's end is being written."""
        self._encode = None

    def keeps_up(self) -> bool:
        """Whether open, and the connection holds `WRITE_BUFFER_HIGH_BYTES` unsent at most."""
        return self._encode is not None and transport_keeps_up(self._transport)

    def send_delta(
        self, delta: DeltaFrame, stream_id: str, *, with_ids: bool, receipt: str | None
    ) -> None:
        """Write the agent's `delta` as the response's events (no ids or receipts in SSE)."""
        if self._encode is None or self._transport is None:
            raise RuntimeError("deltas sent to an SSE response not open for them")
        if events := self._encode(delta):
            self._transport.write(b"%x\r\n%b\r\n" % (len(events), events))


async def queued_frames(queue: asyncio.Queue[AnyFrame]) -> AsyncIterator[AnyFrame]:
    """Frames put on `queue` by a stream, up to its `done` or `error`."""
    while True:
        frame = await queue.get()
        yield frame
        if isinstance(frame, DoneFrame | ErrorFrame) and getattr(frame, "id", None) is not None:
            return


async def respond(
    request: web.Request,
    frames: AsyncIterator[AnyFrame],
    *,
    kind: Kind,
    cid: str,
    model: str,
    stream: bool,
    include_usage: bool,
    forced: ForcedTools | None = None,
    direct: SseDeltas | None = None,
    service_tier: str | None = None,
) -> web.StreamResponse:
    """The OpenAI response for a stream's frames (`forced`: a reply that must call tools).

    With `direct`, the stream's deltas may be written there instead once the response is
    open (at `start`); `service_tier`: the tier the reply names.
    """
    if not stream:
        return await collected(
            frames, kind=kind, cid=cid, model=model, forced=forced, service_tier=service_tier
        )
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    chunks = ChunkEncoder(kind, cid, model, service_tier)
    started = False
    calls_text: list[str] = []  # a forced reply's text: its tool calls

    async def open_events() -> None:
        await response.prepare(request)  # a StreamResponse sends its headers at once
        chunks.open()  # the role goes with the first text, or the ending
        if forced is not None and forced.name is not None:  # a named call streams its args
            await response.write(chunks.opening() + chunks.tool_calls(forced.calls("") or []))
        if direct is not None and forced is None:
            direct.open(chunks.delta)

    # A client that hangs up is no server error: its stream is cancelled as `frames` closes.
    with suppress(ConnectionResetError):
        async for frame in frames:
            if isinstance(frame, ErrorFrame) and not started:
                return json_error(frame.code, frame.message, frame.retry_after, frame.param)
            if not started and isinstance(frame, StartFrame | DeltaFrame | DoneFrame):
                # At `start` the engine has taken the request: the headers go now, so that
                # the first token goes straight to the client (`direct`).
                started = True
                await open_events()
            if not isinstance(frame, DeltaFrame | DoneFrame | ErrorFrame):
                continue  # queued, start: nothing more to show an OpenAI client
            if isinstance(frame, DeltaFrame):
                if forced is not None:
                    calls_text.append(frame.text)
                    if forced.name is not None and frame.text:
                        await response.write(chunks.tool_arguments(frame.text))
                elif written := chunks.delta(frame):
                    await response.write(written)
            else:
                # The stream's last events and the chunked body's end in one write.
                if direct is not None:
                    direct.close()
                if isinstance(frame, ErrorFrame):
                    ending = sse_event(error_body(frame.code, frame.message, frame.param))
                else:
                    ending = _ending(chunks, frame, forced, "".join(calls_text), include_usage)
                await response.write_eof(chunks.opening() + ending + SSE_DONE)
        if not started:
            return json_error(ErrorCode.INTERNAL, "stream ended without a result")
        await response.write_eof(SSE_DONE)  # nothing when written above
    return response


def _ending(
    chunks: ChunkEncoder,
    done: DoneFrame,
    forced: ForcedTools | None,
    calls_text: str,
    include_usage: bool,
) -> bytes:
    """A finished reply's last chunks: a forced reply's or its own tool calls, finish, usage."""
    finish_reason = openai_finish_reason(done)
    ending = b""
    if forced is not None:
        ending = _forced_ending(chunks, forced, calls_text)
        finish_reason = forced.finish_reason(done, calls_text)
    elif (own := own_tool_calls(done)) is not None:
        ending = chunks.tool_calls(own)
        finish_reason = "tool_calls"
    ending += chunks.finish(finish_reason)
    return ending + chunks.usage(usage_body(done)) if include_usage else ending


def _forced_ending(chunks: ChunkEncoder, forced: ForcedTools, text: str) -> bytes:
    """What a forced reply still owes at its end: `required` calls, whole, or its text if cut."""
    if forced.name is not None:
        return b""  # streamed as it came
    calls = forced.calls(text)
    return chunks.tool_calls(calls) if calls is not None else chunks.content(text)


async def collected(
    frames: AsyncIterator[AnyFrame],
    *,
    kind: Kind,
    cid: str,
    model: str,
    forced: ForcedTools | None = None,
    service_tier: str | None = None,
) -> web.Response:
    """A chat or text completion's one JSON body (`stream: false`), or its error's."""
    text: list[str] = []
    thinking: list[str] | None = None  # a reasoning model's
    logprobs: list[TokenLogprob] | None = None
    async for frame in frames:
        if isinstance(frame, DeltaFrame):
            text.append(shown_text(frame))
            if frame.reasoning is not None:
                thinking = thinking or []
                thinking.append(frame.reasoning)
            if frame.logprobs is not None:
                logprobs = logprobs or []
                logprobs.extend(frame.logprobs)
        elif isinstance(frame, ErrorFrame):
            return json_error(frame.code, frame.message, frame.retry_after, frame.param)
        elif isinstance(frame, DoneFrame):
            reasoning = "".join(thinking) if thinking is not None else None
            body = completion_body(
                kind, cid, model, "".join(text), frame, logprobs, forced, reasoning, service_tier
            )
            return web.json_response(body)
    return json_error(ErrorCode.INTERNAL, "stream ended without a result")


async def respond_response(
    request: web.Request,
    frames: AsyncIterator[AnyFrame],
    writer: ResponseWriter,
    *,
    stream: bool,
    direct: SseDeltas | None = None,
) -> web.StreamResponse:
    """The Responses API's answer to a stream's frames: one `response` object, or its events.

    With `direct`, the stream's deltas after the first may be written there instead.
    """
    if not stream:
        return await collected_response(frames, writer)
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    # A client that hangs up is no server error: its stream is cancelled as `frames` closes.
    with suppress(ConnectionResetError):
        async for frame in frames:
            if isinstance(frame, ErrorFrame) and not response.prepared:
                param = responses_param(frame.param)
                return json_error(frame.code, frame.message, frame.retry_after, param)
            if not isinstance(frame, DeltaFrame | DoneFrame | ErrorFrame):
                continue  # queued / start: nothing to show an OpenAI client
            if not response.prepared:
                await response.prepare(request)
                reasons = isinstance(frame, DeltaFrame) and frame.reasoning is not None
                await response.write(writer.opening(reasons=reasons))
                if direct is not None:  # none is sent before this frame's own events are
                    direct.open(lambda delta: writer.delta(shown_text(delta), delta.reasoning))
            if isinstance(frame, DeltaFrame):
                await response.write(writer.delta(shown_text(frame), frame.reasoning))
            else:  # the last events and the chunked body's end in one write
                if direct is not None:
                    direct.close()
                if isinstance(frame, ErrorFrame):
                    param = responses_param(frame.param)
                    await response.write_eof(writer.error(frame.code, frame.message, param))
                else:
                    await response.write_eof(writer.closing(frame))
        if not response.prepared:
            return json_error(ErrorCode.INTERNAL, "stream ended without a result")
        await response.write_eof()  # nothing when written above
    return response


async def collected_response(
    frames: AsyncIterator[AnyFrame], writer: ResponseWriter
) -> web.Response:
    """The Responses API's one `response` object (`stream: false`), or its error's."""
    async for frame in frames:
        if isinstance(frame, DeltaFrame):
            writer.delta(shown_text(frame), frame.reasoning)
        elif isinstance(frame, ErrorFrame):
            param = responses_param(frame.param)
            return json_error(frame.code, frame.message, frame.retry_after, param)
        elif isinstance(frame, DoneFrame):
            return web.json_response(writer.body("completed", frame))
    return json_error(ErrorCode.INTERNAL, "stream ended without a result")
