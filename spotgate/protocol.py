"""The websocket wire protocol `spotgate.v1` (ARCHITECTURE.md): one model per frame.

Clients speak it to the gateway, the gateway to agents, clients to agents directly. Every
received text frame goes through `parse_frame`, which returns a typed frame or raises
`FrameError` carrying the `error` frame to send back — never anything else.
"""

from __future__ import annotations

import json
import re
from enum import StrEnum
from typing import Annotated, Any, Literal, Self, overload

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    StringConstraints,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from spotgate.settings import ADAPTER_SEPARATOR, DEFAULT_MAX_FRAME_BYTES, MAX_REQUEST_BYTES

PROTOCOL_VERSION = "spotgate.v1"
MAX_STREAM_ID_CHARS = 128
MAX_TOKEN_ID = 2**31 - 1
RECEIPT_MAX_CHARS = 160
"""A resume receipt is a version, a key thumbprint and a MAC: anything longer is forged."""
MAX_SEED = 2**63 - 1
MAX_STOP_SEQUENCES = 16
MAX_TOP_LOGPROBS = 20
"""The most alternatives a token's logprobs carry (OpenAI's limit)."""
MAX_LOGIT_BIAS_ENTRIES = 1024
MIN_LOGPROB = -9999.0
"""A logprob is never below this: an impossible token (-inf) is reported at it, as vLLM does."""


class ErrorCode(StrEnum):
    """Error codes of `error` frames (ARCHITECTURE.md)."""

    UNAUTHORIZED = "unauthorized"
    FORBIDDEN = "forbidden"
    INVALID_REQUEST = "invalid_request"
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
    MODEL_NOT_FOUND = "model_not_found"
    RATE_LIMITED = "rate_limited"
    NO_CAPACITY = "no_capacity"
    TIMEOUT = "timeout"
    INTERRUPTED = "interrupted"
    # This gateway is stopping: send the stream again through another (or after reconnecting).
    GOING_AWAY = "going_away"
    INTERNAL = "internal"


StreamId = Annotated[str, StringConstraints(min_length=1, max_length=MAX_STREAM_ID_CHARS)]
ModelName = Annotated[str, StringConstraints(min_length=1, max_length=256)]


def split_model(name: str) -> tuple[str, str | None]:
    """(the served model, the LoRA adapter or None) a request's `model` names."""
    base, separator, adapter = name.partition(ADAPTER_SEPARATOR)
    return (base, adapter) if separator and adapter else (name, None)


Count = Annotated[int, Field(ge=0)]
TokenId = Annotated[int, Field(ge=0, le=MAX_TOKEN_ID)]
Milliseconds = Annotated[float, Field(ge=0)]


class _Strict(BaseModel):
    """Unknown fields are refused: a misspelt `max_token` is an error, not a silent default."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


MAX_TOOLS = 128
FunctionName = Annotated[str, StringConstraints(min_length=1, max_length=64)]
ToolCallId = Annotated[str, StringConstraints(min_length=1, max_length=256)]


class FunctionCall(_Strict):
    """A function the model called: its name and its arguments as JSON text."""

    name: FunctionName
    arguments: str


def json_chars(value: object) -> int:
    """Characters of `value` as compact JSON, non-ASCII as it is: what a schema weighs."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")))


class ToolCall(_Strict):
    """One tool call of an assistant turn (OpenAI's shape)."""

    id: ToolCallId
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Strict):
    """One chat turn: an assistant's may carry its tool calls, a tool's the call it answers."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str
    tool_calls: Annotated[list[ToolCall], Field(min_length=1, max_length=MAX_TOOLS)] | None = None
    tool_call_id: ToolCallId | None = None
    # An assistant turn's thinking, as a reasoning model wrote it: its chat template decides
    # whether the model sees it again (Qwen3's keeps it only in the turns of a tool loop).
    reasoning_content: str | None = None

    def chars(self) -> int:
        """Characters of the turn's text: content, reasoning, tool calls' ids, names, arguments."""
        calls = sum(
            len(call.id) + len(call.function.name) + len(call.function.arguments)
            for call in self.tool_calls or ()
        )
        reasoning = len(self.reasoning_content or "")
        return len(self.content) + len(self.tool_call_id or "") + calls + reasoning


class FunctionDefinition(_Strict):
    """A function the model may call; `parameters` is the JSON schema of its arguments."""

    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    def chars(self) -> int:
        """Characters of its name, its description and its parameters' schema (as JSON)."""
        schema = json_chars(self.parameters) if self.parameters is not None else 0
        return len(self.name) + len(self.description or "") + schema


class Tool(_Strict):
    """A tool offered to the model (OpenAI's shape; functions only)."""

    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(_Strict):
    """The function `tool_choice` names."""

    name: FunctionName


class NamedToolChoice(_Strict):
    """`tool_choice` naming the one function the model must call."""

    type: Literal["function"] = "function"
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


Penalty = Annotated[float, Field(ge=-2, le=2)]
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]
"""OpenAI's `reasoning_effort`; a chat template that takes it reads it, "none" turns thinking
off (vLLM's `enable_thinking`)."""
Bias = Annotated[float, Field(ge=-100, le=100)]
RepetitionPenalty = Annotated[float, Field(gt=0, le=2)]
"""vLLM's: logits of tokens already in the prompt or the reply divided (or multiplied) by it."""


class JsonSchemaFormat(_Strict):
    """`response_format.json_schema`: the schema the reply must match."""

    model_config = ConfigDict(serialize_by_alias=True, validate_by_name=True)

    name: Annotated[str, StringConstraints(min_length=1, max_length=64)] = "response"
    description: str | None = None
    # `schema` would shadow pydantic's own attribute of that name
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    """OpenAI's `response_format`: plain text, any JSON object, or JSON matching a schema."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_when_asked(self) -> Self:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("'json_schema' is given exactly when type is 'json_schema'")
        return self


def tool_choice_problem(
    tools: list[Tool] | None, choice: ToolChoice | None, response_format: ResponseFormat | None
) -> str | None:
    """What is wrong with a request's `tool_choice`, given its tools and `response_format`."""
    names = {tool.function.name for tool in tools or ()}
    if choice not in (None, "none") and not names:
        return "tool_choice: only with tools"
    if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
        return f"tool_choice names '{choice.function.name}', which is not in tools"
    forced = choice == "required" or isinstance(choice, NamedToolChoice)
    if forced and response_format is not None and response_format.type != "text":
        return "tool_choice: a forced tool call and response_format cannot both shape a reply"
    return None


class Resume(_Strict):
    """What a stream had produced when it moved: the next agent continues after these tokens."""

    token_ids: list[TokenId]
    text: str
    completion_tokens: Count
    # The last `receipt` of the deltas that brought these ids (a client's resume): with it,
    # ids the deployment delivered to this key are not charged again; without, as prompt.
    receipt: Annotated[str, StringConstraints(max_length=RECEIPT_MAX_CHARS)] | None = None

    @model_validator(mode="after")
    def _count_matches_ids(self) -> Self:
        if self.completion_tokens != len(self.token_ids):
            raise ValueError("completion_tokens must equal the number of token_ids")
        return self


class GenerateFrame(_Strict):
    """Start a stream: a chat (`messages`) or a raw `prompt`."""

    type: Literal["generate"] = "generate"
    id: StreamId
    model: ModelName
    messages: Annotated[list[ChatMessage], Field(min_length=1)] | None = None
    prompt: str | None = None
    # None: what the model's context leaves after the prompt (as OpenAI and vLLM do), up to
    # `max_tokens_cap`: the gateway sets that to the API key's limit per request.
    max_tokens: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    max_tokens_cap: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] = 1.0
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    stop: Annotated[list[str], Field(max_length=MAX_STOP_SEQUENCES)] = []
    seed: Annotated[int, Field(ge=0, le=MAX_SEED)] | None = None
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    logit_bias: Annotated[dict[TokenId, Bias], Field(max_length=MAX_LOGIT_BIAS_ENTRIES)] | None = (
        None
    )
    # vLLM's own sampling fields. top_k None: every token; min_tokens: no end of sequence before
    # that many tokens (a stop string still ends it); ignore_eos: only max_tokens or a stop
    # string ends it.
    top_k: Annotated[int, Field(ge=1, le=MAX_TOKEN_ID)] | None = None
    min_p: Annotated[float, Field(ge=0, le=1)] = 0.0
    repetition_penalty: RepetitionPenalty = 1.0
    min_tokens: Annotated[int, Field(ge=0, le=1_000_000)] = 0
    ignore_eos: bool = False
    # None: no logprobs; k: each token's logprob and its k most likely alternatives.
    logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    response_format: ResponseFormat | None = None
    tools: Annotated[list[Tool], Field(min_length=1, max_length=MAX_TOOLS)] | None = None
    # None: "auto" with tools, "none" without (OpenAI's defaults).
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True
    # A reasoning model's thinking: how much (read by chat templates that take it), whether at
    # all (`enable_thinking`, Qwen3's template switch; None: the template's default, or off
    # for an effort of "none"), and whether deltas carry it (`include_reasoning`, vLLM's).
    reasoning_effort: ReasoningEffort | None = None
    enable_thinking: bool | None = None
    include_reasoning: bool = True
    session: Annotated[str, StringConstraints(max_length=256)] | None = None
    want_ids: bool = False
    # What the stream already produced: set by a gateway moving it to another agent, or by a
    # client continuing it through another gateway (the ids and text it received).
    resume: Resume | None = None
    # Whose prefix cache the stream may use (`spotgate.tenancy`): set by a gateway from the
    # client's API key, refused from anyone else.
    tenant: Annotated[str, StringConstraints(min_length=1, max_length=128)] | None = None
    # Set by a gateway that moves streams make-before-break: a draining agent says `moving`
    # and streams on until the gateway cancels or the drain's margin, instead of `interrupted`.
    move_early: bool = False

    @model_validator(mode="after")
    def _messages_or_prompt(self) -> Self:
        if (self.messages is None) == (self.prompt is None):
            raise ValueError("give exactly one of 'messages' or 'prompt'")
        return self

    @model_validator(mode="after")
    def _min_tokens_within_max(self) -> Self:
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError("min_tokens: at most max_tokens")
        return self

    @model_validator(mode="after")
    def _tool_choice_fits_tools(self) -> Self:
        problem = tool_choice_problem(self.tools, self.tool_choice, self.response_format)
        if problem is not None:
            raise ValueError(problem)
        return self

    @property
    def base_model(self) -> str:
        """The served model the stream runs on (`model` less any adapter)."""
        return split_model(self.model)[0]

    @property
    def adapter(self) -> str | None:
        """The LoRA adapter the stream runs with, if its `model` names one."""
        return split_model(self.model)[1]

    def chat_template_kwargs(self) -> dict[str, object]:
        """What a chat template reads of the request beside its turns and tools: its thinking.

        As vLLM passes them: `reasoning_effort` to a template that takes it, and an effort of
        "none" turns thinking off where the request does not say (`enable_thinking`).
        """
        kwargs: dict[str, object] = {}
        thinking = self.enable_thinking
        if self.reasoning_effort is not None:
            kwargs["reasoning_effort"] = self.reasoning_effort
            thinking = self.reasoning_effort != "none" if thinking is None else thinking
        if thinking is not None:
            kwargs["enable_thinking"] = thinking
        return kwargs

    def forced_tools(self) -> list[Tool] | None:
        """The tools a reply must call (a named one, or any with `required`); None: free text."""
        choice = self.tool_choice
        if isinstance(choice, NamedToolChoice):
            return [t for t in self.tools or () if t.function.name == choice.function.name]
        if choice == "required":
            return list(self.tools or ())
        return None

    def prompt_chars_by_field(self) -> dict[str, int]:
        """Characters of each field the engine reads the prompt from, for the size limit.

        All that a chat template renders or a grammar is compiled from counts, so none of it
        can be megabytes beside a short message: the raw prompt, every turn's text and tool
        calls, the tools (names, descriptions, parameter schemas), the reply's JSON schema.
        """
        fields: dict[str, int] = {}
        if self.prompt is not None:
            fields["prompt"] = len(self.prompt)
        if self.messages is not None:
            fields["messages"] = sum(message.chars() for message in self.messages)
        if self.tools is not None:
            fields["tools"] = sum(tool.function.chars() for tool in self.tools)
        if self.response_format is not None and self.response_format.json_schema is not None:
            fields["response_format"] = json_chars(self.response_format.json_schema.schema_)
        return fields

    def prompt_chars(self) -> int:
        """Characters of everything the prompt is made from (`prompt_chars_by_field`)."""
        return sum(self.prompt_chars_by_field().values())


class CancelFrame(_Strict):
    """Stop a stream; the engine aborts the request."""

    type: Literal["cancel"] = "cancel"
    id: StreamId


class AuthFrame(_Strict):
    """Authenticate (browsers, as the first frame) or refresh the token of a live socket."""

    type: Literal["auth"] = "auth"
    token: Annotated[str, StringConstraints(min_length=1, max_length=8192)]


class PingFrame(_Strict):
    """Application-level keep-alive; answered with `pong`."""

    type: Literal["ping"] = "ping"


class QueuedFrame(_Strict):
    """The stream waits for capacity; `position` 0 is next.

    `eta_seconds`: while the pool boots an agent for the model, how long until it expects
    it ready (from the cold starts it has seen); absent when no agent boots. Sent again when
    the place in line or the expectation changes.
    """

    type: Literal["queued"] = "queued"
    id: StreamId
    position: Count
    eta_seconds: NonNegativeFloat | None = None


class StartFrame(_Strict):
    """An agent took the stream; `engine` says whether it is a real model or synthetic."""

    type: Literal["start"] = "start"
    id: StreamId
    agent: str
    engine: Literal["vllm", "synthetic"] | None = None
    # The prompt's tokens as the agent counted them, before it generates: a stream cancelled
    # or cut off before its `done` is charged them all the same (agent → gateway only).
    prompt_tokens: Count | None = None


Logprob = Annotated[float, Field(ge=MIN_LOGPROB, le=0)]


class TopLogprob(_Strict):
    """One candidate token: its text, the UTF-8 bytes of that text, its log probability."""

    token: str
    logprob: Logprob
    bytes: list[Annotated[int, Field(ge=0, le=255)]] | None = None


class TokenLogprob(TopLogprob):
    """A generated token's logprob and the most likely alternatives at its position."""

    top_logprobs: list[TopLogprob]


class DeltaFrame(_Strict):
    """`n` more tokens of text; `ids` only when the stream asked with `want_ids`.

    `logprobs` (one per token, when the stream asked for them) are OpenAI's chat logprobs.
    `content`: set when the model may call tools of its own accord (`tool_choice: auto`) or
    reasons, the reply content this frame adds; `reasoning`: set when the model reasons (its
    agents have a reasoning parser), the thinking this frame adds. The rest of the reply's
    `text` is markup: the thinking's tags, and tool calls, which the `done` frame's
    `tool_calls` carry as OpenAI's calls.
    """

    type: Literal["delta"] = "delta"
    id: StreamId
    text: str
    n: Count
    ids: list[TokenId] | None = None
    logprobs: list[TokenLogprob] | None = None
    content: str | None = None
    reasoning: str | None = None
    # With `ids`, from a gateway: proof that it delivered every id so far, for `resume`.
    receipt: str | None = None

    @model_validator(mode="after")
    def _ids_match_count(self) -> Self:
        if self.ids is not None and len(self.ids) != self.n:
            raise ValueError("'ids' must hold exactly 'n' token ids")
        if self.logprobs is not None and len(self.logprobs) != self.n:
            raise ValueError("'logprobs' must hold exactly 'n' entries")
        return self


class Usage(_Strict):
    """Token counts of a finished stream, each token counted once across resumes."""

    prompt_tokens: Count
    completion_tokens: Count
    # Of the completion tokens, those of the model's thinking (None: the model does not reason).
    reasoning_tokens: Count | None = None


class Timings(_Strict):
    """Where a stream's time went."""

    queue_ms: Milliseconds
    ttft_ms: Milliseconds
    total_ms: Milliseconds


class DoneFrame(_Strict):
    """The stream finished; `tool_calls`: those the model made of its own accord, if any."""

    type: Literal["done"] = "done"
    id: StreamId
    finish_reason: Literal["stop", "length", "cancelled"]
    usage: Usage
    timings: Timings
    tool_calls: Annotated[list[ToolCall], Field(min_length=1, max_length=MAX_TOOLS)] | None = None


class ErrorFrame(_Strict):
    """A stream (`id`) or the connection (no `id`) failed; `retry_after` in seconds.

    `param` names the request field at fault, when one is (OpenAI's `param`).
    """

    type: Literal["error"] = "error"
    id: StreamId | None = None
    code: ErrorCode
    message: str
    retry_after: Annotated[float, Field(ge=0)] | None = None
    param: Annotated[str, StringConstraints(max_length=256)] | None = None


class MovingFrame(_Strict):
    """The agent drains and the stream cannot finish in time: move it now (agent → gateway).

    The agent streams on until the gateway cancels the stream, or until the drain's margin,
    where it ends it with `interrupted`. Sent only for a `generate` with `move_early`.
    """

    type: Literal["moving"] = "moving"
    id: StreamId


class PongFrame(_Strict):
    """Answer to `ping`."""

    type: Literal["pong"] = "pong"


ClientFrame = Annotated[
    GenerateFrame | CancelFrame | AuthFrame | PingFrame, Field(discriminator="type")
]
ServerFrame = Annotated[
    QueuedFrame | StartFrame | DeltaFrame | DoneFrame | ErrorFrame | MovingFrame | PongFrame,
    Field(discriminator="type"),
]
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
_SERVER_ADAPTER: TypeAdapter[ServerFrame] = TypeAdapter(ServerFrame)
CLIENT_FRAME_TYPES = frozenset({"generate", "cancel", "auth", "ping"})
SERVER_FRAME_TYPES = frozenset({"queued", "start", "delta", "done", "error", "moving", "pong"})

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
    raw = _checked_bytes(data, max_bytes)
    adapter: TypeAdapter[Any] = _CLIENT_ADAPTER if origin == "client" else _SERVER_ADAPTER
    try:
        frame: ClientFrame | ServerFrame = adapter.validate_json(raw)
    except ValidationError as err:
        raise _explain(raw, err, origin) from err
    return frame


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


def _explain(raw: bytes, err: ValidationError, origin: Origin) -> FrameError:
    """Turn a validation failure into the most useful one-line reason, with the stream id."""
    try:
        document = json.loads(raw)
    except (ValueError, RecursionError):
        return FrameError("frame is not valid JSON")
    if not isinstance(document, dict):
        return FrameError("frame must be a JSON object")
    stream_id = document.get("id")
    if not (isinstance(stream_id, str) and 0 < len(stream_id) <= MAX_STREAM_ID_CHARS):
        stream_id = None
    elif not _is_utf8(stream_id):
        stream_id = None  # a lone surrogate (`"\ud800"`): no frame can carry it back
    frame_type = document.get("type")
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
    return frame.model_dump_json(exclude_none=True)
