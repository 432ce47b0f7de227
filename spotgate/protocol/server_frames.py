"""The frames a server (gateway or agent) sends: `queued` to `done`, `error`, `moving`, `pong`."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from msgspec import Meta, Struct
from pydantic import Field, NonNegativeFloat, StringConstraints

from spotgate.protocol.chat import ToolCall
from spotgate.protocol.fields import (
    MAX_STREAM_ID_CHARS,
    MAX_TOKEN_ID,
    MAX_TOOLS,
    MIN_LOGPROB,
    Count,
    ErrorCode,
    Milliseconds,
    StreamId,
    WireModel,
)


class QueuedFrame(WireModel):
    """The stream waits for capacity; `position` 0 is next.

    `eta_seconds`: while the pool boots an agent for the model, how long until it expects
    it ready (from the cold starts it has seen); absent when no agent boots. Sent again when
    the place in line or the expectation changes.
    """

    type: Literal["queued"] = "queued"
    id: StreamId
    position: Count
    eta_seconds: NonNegativeFloat | None = None


class StartFrame(WireModel):
    """An agent took the stream; `engine` says whether it is a real model or synthetic."""

    type: Literal["start"] = "start"
    id: StreamId
    agent: str
    engine: Literal["vllm", "synthetic"] | None = None
    # The prompt's tokens as the agent counted them, before it generates: a stream cancelled
    # or cut off before its `done` is charged them all the same (agent → gateway only).
    prompt_tokens: Count | None = None


Logprob = Annotated[float, Meta(ge=MIN_LOGPROB, le=0)]
_StreamId = Annotated[str, Meta(min_length=1, max_length=MAX_STREAM_ID_CHARS)]
_Count = Annotated[int, Meta(ge=0)]
_TokenId = Annotated[int, Meta(ge=0, le=MAX_TOKEN_ID)]


class WireStruct(Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """As `WireModel`, read by msgspec: for the frame each token makes (`delta`).

    Decoding one costs a tenth of a pydantic model's, and a gateway decodes a `delta` per
    token and stream. Unknown fields are refused; unset (None) fields are left out.
    """


class TopLogprob(WireStruct, kw_only=True, frozen=True):
    """One candidate token: its text, the UTF-8 bytes of that text, its log probability."""

    token: str
    logprob: Logprob
    bytes: list[Annotated[int, Meta(ge=0, le=255)]] | None = None


class TokenLogprob(TopLogprob, kw_only=True, frozen=True):
    """A generated token's logprob and the most likely alternatives at its position."""

    top_logprobs: list[TopLogprob]


class DeltaFrame(WireStruct, kw_only=True, frozen=True, tag_field="type", tag="delta"):
    """`n` more tokens of text; `ids` only when the stream asked with `want_ids`.

    `logprobs` (one per token, when the stream asked for them) are OpenAI's chat logprobs.
    `content`: set when the model may call tools of its own accord (`tool_choice: auto`) or
    reasons, the reply content this frame adds; `reasoning`: set when the model reasons (its
    agents have a reasoning parser), the thinking this frame adds. The rest of the reply's
    `text` is markup: the thinking's tags, and tool calls, which the `done` frame's
    `tool_calls` carry as OpenAI's calls.
    """

    type: ClassVar[Literal["delta"]] = "delta"  # the tag, written first
    id: _StreamId
    text: str
    n: _Count
    ids: list[_TokenId] | None = None
    logprobs: list[TokenLogprob] | None = None
    content: str | None = None
    reasoning: str | None = None
    # With `ids`, from a gateway: proof that it delivered every id so far, for `resume`.
    receipt: str | None = None

    def __post_init__(self) -> None:
        if self.ids is not None and len(self.ids) != self.n:
            raise ValueError("'ids' must hold exactly 'n' token ids")
        if self.logprobs is not None and len(self.logprobs) != self.n:
            raise ValueError("'logprobs' must hold exactly 'n' entries")


class Usage(WireModel):
    """Token counts of a finished stream, each token counted once across resumes."""

    prompt_tokens: Count
    completion_tokens: Count
    # Of the completion tokens, those of the model's thinking (None: the model does not reason).
    reasoning_tokens: Count | None = None


class Timings(WireModel):
    """Where a stream's time went."""

    queue_ms: Milliseconds
    ttft_ms: Milliseconds
    total_ms: Milliseconds


class DoneFrame(WireModel):
    """The stream finished; `tool_calls`: those the model made of its own accord, if any."""

    type: Literal["done"] = "done"
    id: StreamId
    finish_reason: Literal["stop", "length", "cancelled"]
    usage: Usage
    timings: Timings
    tool_calls: Annotated[list[ToolCall], Field(min_length=1, max_length=MAX_TOOLS)] | None = None


class ErrorFrame(WireModel):
    """A stream (`id`) or the connection (no `id`) failed; `retry_after` in seconds.

    `param` names the request field at fault, when one is (OpenAI's `param`).
    """

    type: Literal["error"] = "error"
    id: StreamId | None = None
    code: ErrorCode
    message: str
    retry_after: Annotated[float, Field(ge=0)] | None = None
    param: Annotated[str, StringConstraints(max_length=256)] | None = None


class MovingFrame(WireModel):
    """The agent drains and the stream cannot finish in time: move it now (agent → gateway).

    The agent streams on until the gateway cancels the stream, or until the drain's margin,
    where it ends it with `interrupted`. Sent only for a `generate` with `move_early`.
    """

    type: Literal["moving"] = "moving"
    id: StreamId


class PongFrame(WireModel):
    """Answer to `ping`."""

    type: Literal["pong"] = "pong"


EventFrame = Annotated[
    QueuedFrame | StartFrame | DoneFrame | ErrorFrame | MovingFrame | PongFrame,
    Field(discriminator="type"),
]
"""The server frames pydantic reads: all but the `delta`, read by msgspec (`codec`)."""
ServerFrame = EventFrame | DeltaFrame

SERVER_FRAME_TYPES = frozenset({"queued", "start", "delta", "done", "error", "moving", "pong"})
