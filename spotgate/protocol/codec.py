"""Frames to and from JSON text: `parse_frame`, `encode_frame`, and the size of a frame."""

from __future__ import annotations

import json
import re
from typing import Any, Literal, overload

import msgspec
from pydantic import TypeAdapter, ValidationError

from spotgate.protocol.client_frames import (
    CLIENT_FRAME_TYPES,
    AuthFrame,
    CancelFrame,
    ClientFrame,
    GenerateFrame,
    PingFrame,
)
from spotgate.protocol.fields import MAX_STREAM_ID_CHARS, MAX_TOKEN_ID, ErrorCode
from spotgate.protocol.server_frames import (
    SERVER_FRAME_TYPES,
    DeltaFrame,
    DoneFrame,
    ErrorFrame,
    EventFrame,
    MovingFrame,
    PongFrame,
    QueuedFrame,
    ServerFrame,
    StartFrame,
)
from spotgate.settings import DEFAULT_MAX_FRAME_BYTES, MAX_REQUEST_BYTES

AnyFrame = (
    GenerateFrame
    | CancelFrame
    | AuthFrame
    | PingFrame
    | QueuedFrame
    | StartFrame
    | DeltaFrame
    | DoneFrame
    | ErrorFrame
    | MovingFrame
    | PongFrame
)

_CLIENT_ADAPTER: TypeAdapter[ClientFrame] = TypeAdapter(ClientFrame)
_EVENT_ADAPTER: TypeAdapter[EventFrame] = TypeAdapter(EventFrame)
_DELTA_DECODER = msgspec.json.Decoder(DeltaFrame)
_DELTA_HEADS = ('{"type":"delta",', b'{"type":"delta",')
_ENCODER = msgspec.json.Encoder()

Origin = Literal["client", "server"]


class FrameError(ValueError):
    """A received frame was refused; `frame()` is the `error` frame to answer with."""

    def __init__(
        self,
        message: str,
        *,
        code: ErrorCode = ErrorCode.INVALID_REQUEST,
        id: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.id = id
        self.param = param

    def frame(self) -> ErrorFrame:
        """The `error` frame that tells the sender what was wrong."""
        return ErrorFrame(id=self.id, code=self.code, message=self.message, param=self.param)


@overload
def parse_frame(
    data: str | bytes, *, origin: Literal["client"] = ..., max_bytes: int = ...
) -> ClientFrame: ...


@overload
def parse_frame(
    data: str | bytes, *, origin: Literal["server"], max_bytes: int = ...
) -> ServerFrame: ...


def parse_frame(
    data: str | bytes,
    *,
    origin: Origin = "client",
    max_bytes: int = DEFAULT_MAX_FRAME_BYTES,
) -> ClientFrame | ServerFrame:
    """Parse one text frame sent by a client (default) or a server; raise `FrameError` if bad."""
    if origin == "server" and data[:16] in _DELTA_HEADS and len(data) <= max_bytes // 4:
        return _delta(data)  # ours put `type` first; a str of this length has ≤ max_bytes
    raw = _checked_bytes(data, max_bytes)
    adapter: TypeAdapter[Any] = _CLIENT_ADAPTER if origin == "client" else _EVENT_ADAPTER
    try:
        frame: ClientFrame | ServerFrame = adapter.validate_json(raw)
    except ValidationError as err:
        explained = _explain(raw, err, origin)
        if explained is None:  # a `delta` written in another order
            return _delta(raw)
        raise explained from err
    return frame


def _delta(raw: str | bytes) -> DeltaFrame:
    try:
        frame: DeltaFrame = _DELTA_DECODER.decode(raw)
    except msgspec.ValidationError as err:  # a DecodeError too: first
        message, _, at = str(err).partition(" - at `$")
        where = error_param(tuple(_PATH_PART.findall(at.rstrip("`")))) if at else None
        detail = f"{where}: {message}" if where else message
        raise FrameError(
            f"invalid 'delta' frame — {detail}", id=_valid_stream_id(raw), param=where
        ) from err
    except msgspec.DecodeError as err:
        # msgspec from 0.23 checks a string's bytes itself; before, Python's decoder did.
        if str(err).startswith(_MSGSPEC_NOT_UTF8):
            raise FrameError("frame is not valid UTF-8 text", id=leading_stream_id(raw)) from err
        raise FrameError("frame is not valid JSON") from err
    except UnicodeError as err:  # a lone surrogate in the text, or bytes that are not UTF-8
        raise FrameError("frame is not valid UTF-8 text", id=leading_stream_id(raw)) from err
    return frame


_MSGSPEC_NOT_UTF8 = "Invalid UTF-8"


_PATH_PART = re.compile(r"\w+")


def _valid_stream_id(raw: str | bytes) -> str | None:
    try:
        document = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return _stream_id(document.get("id")) if isinstance(document, dict) else None


def _stream_id(value: object) -> str | None:
    if not (isinstance(value, str) and 0 < len(value) <= MAX_STREAM_ID_CHARS):
        return None
    return value if _is_utf8(value) else None  # a lone surrogate (`"\ud800"`): never sent back


def _checked_bytes(data: str | bytes, max_bytes: int) -> bytes:
    if isinstance(data, str):
        if len(data) > max_bytes:  # each character is at least one byte
            raise FrameError(
                f"frame exceeds the {max_bytes}-byte limit", id=leading_stream_id(data)
            )
        try:
            data = data.encode("utf-8")
        except UnicodeEncodeError as err:
            raise FrameError("frame is not valid UTF-8 text") from err
    if len(data) > max_bytes:
        raise FrameError(
            f"frame of {len(data)} bytes exceeds the {max_bytes}-byte limit",
            id=leading_stream_id(data),
        )
    return data


_LEADING_ID = re.compile(rb'"id"\s*:\s*"([A-Za-z0-9_.:-]{1,%d})"' % MAX_STREAM_ID_CHARS)
LEADING_ID_SEARCH_BYTES = 1024


def leading_stream_id(data: str | bytes) -> str | None:
    """The stream id near the start of a frame too large to parse, so its error names it.

    Frames put `type` and `id` first (ours always do): an oversize `generate` is answered as
    an `error` for its own stream, and the connection's other streams go on.
    """
    head = data[:LEADING_ID_SEARCH_BYTES]
    found = _LEADING_ID.search(head.encode("utf-8", "replace") if isinstance(head, str) else head)
    return found.group(1).decode() if found else None


def _explain(raw: bytes, err: ValidationError, origin: Origin) -> FrameError | None:
    """Turn a validation failure into the most useful one-line reason, with the stream id.

    None: the frame is a server's `delta`, which pydantic does not read.
    """
    try:
        document = json.loads(raw)
    except (ValueError, RecursionError):
        return FrameError("frame is not valid JSON")
    if not isinstance(document, dict):
        return FrameError("frame must be a JSON object")
    stream_id = _stream_id(document.get("id"))
    frame_type = document.get("type")
    if origin == "server" and frame_type == "delta":
        return None
    own, other = (
        (CLIENT_FRAME_TYPES, SERVER_FRAME_TYPES)
        if origin == "client"
        else (SERVER_FRAME_TYPES, CLIENT_FRAME_TYPES)
    )
    if not isinstance(frame_type, str):
        return FrameError("frame has no 'type'", id=stream_id)
    if frame_type in other:
        sender = "a client" if origin == "client" else "a server"
        return FrameError(f"frame type '{frame_type}' is not accepted from {sender}", id=stream_id)
    if frame_type not in own:
        return FrameError(
            f"unknown frame type {json.dumps(frame_type)[:64]}; "
            f"expected one of {', '.join(sorted(own))}",
            id=stream_id,
        )
    first = err.errors(include_url=False, include_input=False)[0]
    where = error_param(first["loc"][1:])
    detail = f"{where}: {first['msg']}" if where else first["msg"]
    return FrameError(f"invalid '{frame_type}' frame — {detail}", id=stream_id, param=where)


def error_param(location: tuple[int | str, ...]) -> str | None:
    """The field a validation error points at, dotted (`messages.0.content`); None: the whole."""
    return ".".join(str(part) for part in location)[:256] or None


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


JSON_CHAR_BYTES = 6
"""The most one character takes in a JSON string (a control character: `\\u0001`)."""
TOKEN_ID_JSON_BYTES = len(f",{MAX_TOKEN_ID}")
FRAME_FIELDS_BYTES = 4096
"""What a gateway adds to a client's request: a stream id, `want_ids`, the resume's fields."""


def max_gateway_frame_bytes(max_model_len: int, max_token_chars: int) -> int:
    """The largest `generate` frame a gateway can send to an agent of this model.

    The client's request (re-encoded, it is no larger than the MAX_REQUEST_BYTES it came in)
    plus a resume of a whole context: its ids, and their text, each token at most
    `max_token_chars` characters.
    """
    resume = max_model_len * (TOKEN_ID_JSON_BYTES + JSON_CHAR_BYTES * max_token_chars)
    return MAX_REQUEST_BYTES + FRAME_FIELDS_BYTES + resume


def encode_frame(frame: AnyFrame) -> str:
    """Serialize a frame to its JSON text, leaving out unset optional fields."""
    if isinstance(frame, DeltaFrame):
        return _ENCODER.encode(frame).decode()
    return frame.model_dump_json(exclude_none=True)


def client_delta(
    delta: DeltaFrame, stream_id: str, *, with_ids: bool, receipt: str | None
) -> DeltaFrame:
    """An agent's delta as a gateway's client is sent it, in the client's stream id.

    Its ids only `with_ids`, and the gateway's `receipt`, never one the agent sent.
    """
    ids = delta.ids if with_ids else None
    return msgspec.structs.replace(delta, id=stream_id, ids=ids, receipt=receipt)


def client_delta_json(
    delta: DeltaFrame, stream_id: str, *, with_ids: bool, receipt: str | None
) -> bytes:
    """`encode_frame` of `client_delta`, as bytes."""
    return _ENCODER.encode(client_delta(delta, stream_id, with_ids=with_ids, receipt=receipt))


FRAME_LINES_SUBPROTOCOL = "spotgate.v1.lines"
"""The websocket subprotocol a receiver asks for to take a server's frames several to a
message, one per line. Encoded JSON holds no raw newline, and a message costs a receiver
several times a frame's parsing: a gateway reading an agent's thousand streams pays per
message."""
