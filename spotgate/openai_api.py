"""OpenAI-compatible request and response models, shared by the gateway and the agents.

Requests take every field OpenAI's SDK sends: each is honoured, accepted as bookkeeping that
changes no reply (`metadata`, `store`…), or refused by name with a 400 (OpenAI itself refuses
an unknown field the same way), so no setting is silently ignored. `to_generate_frame` maps a
request onto the wire protocol, so every surface runs the same generation path.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import ErrorDetails

from spotgate.protocol import (
    MAX_LOGIT_BIAS_ENTRIES,
    MAX_SEED,
    MAX_STOP_SEQUENCES,
    MAX_TOKEN_ID,
    MAX_TOOLS,
    MAX_TOP_LOGPROBS,
    Bias,
    ChatMessage,
    DeltaFrame,
    DoneFrame,
    ErrorCode,
    GenerateFrame,
    Penalty,
    ReasoningEffort,
    RepetitionPenalty,
    ResponseFormat,
    TokenLogprob,
    Tool,
    ToolCall,
    ToolCallId,
    ToolChoice,
    error_param,
    tool_choice_problem,
)

LEGACY_DEFAULT_MAX_TOKENS = 16
"""OpenAI's default for `/v1/completions`."""
MAX_LEGACY_LOGPROBS = 5
"""The most alternatives `/v1/completions` returns per token (OpenAI's limit)."""

# HTTP status and OpenAI error type for each protocol error code.
ERROR_STATUS: dict[ErrorCode, tuple[int, str]] = {
    ErrorCode.UNAUTHORIZED: (401, "authentication_error"),
    ErrorCode.FORBIDDEN: (403, "permission_error"),
    ErrorCode.INVALID_REQUEST: (400, "invalid_request_error"),
    ErrorCode.CONTEXT_LENGTH_EXCEEDED: (400, "invalid_request_error"),
    ErrorCode.MODEL_NOT_FOUND: (404, "invalid_request_error"),
    ErrorCode.RATE_LIMITED: (429, "rate_limit_error"),
    ErrorCode.NO_CAPACITY: (503, "service_unavailable"),
    ErrorCode.TIMEOUT: (504, "timeout"),
    ErrorCode.INTERRUPTED: (503, "service_unavailable"),
    ErrorCode.GOING_AWAY: (503, "service_unavailable"),
    ErrorCode.INTERNAL: (500, "internal_error"),
}


class StreamOptions(BaseModel):
    """`stream_options`: whether the last chunk carries usage."""

    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


MAX_SESSION_CHARS = 256
"""The longest `user` used as the routing session as it is; a longer one is hashed."""

NO_EFFECT_VALUES: dict[str, tuple[object, ...]] = {
    "audio": (None,),
    "functions": (None, []),
    "function_call": (None, "none"),
    "modalities": (None, ["text"]),
    "prediction": (None,),
    "verbosity": (None, "medium"),
    "web_search_options": (None,),
    "moderation": (None,),
    "echo": (None, False),
    "best_of": (None, 1),
    "suffix": (None, ""),
    "background": (None, False),
    "background_options": (None,),
    "conversation": (None,),
    "context_management": (None,),
    "include": (None, []),
    "max_tool_calls": (None,),
    "prompt": (None,),
    "prompt_cache_options": (None,),
    "top_logprobs": (None, 0),
    "truncation": (None, "disabled"),
    "image": (None,),
    "access_programs": (None,),
}
"""Fields of OpenAI's requests spotgate does not serve, with the values that ask for nothing:
those are taken; any other value is a 400 naming the field."""
REFUSAL_REASONS: dict[str, str] = {
    "audio": "the models here read and write text only",
    "modalities": "the models here write text only",
    "image": "the models here read text only",
    "functions": "the legacy function-calling fields are not supported: send 'tools'",
    "function_call": "the legacy function-calling fields are not supported: send 'tool_choice'",
    "web_search_options": "there is no built-in web search here",
    "background": "responses are not stored here, so none runs in the background",
    "conversation": "responses are not stored here: send the whole conversation in 'input'",
    "prompt": "stored prompts are not supported: send the instructions and input",
    "include": "no extra output items are available here",
    "top_logprobs": "not supported by the Responses API here: use chat completions' logprobs",
    "truncation": "the input is never truncated here: a request too long is refused instead",
}


def unsupported_field_message(field: str) -> str:
    """Why a field the request models refuse is not served (OpenAI's words for an unknown one)."""
    reason = REFUSAL_REASONS.get(field)
    if reason is None and field in NO_EFFECT_VALUES:
        reason = "not supported here"
    return f"{field}: {reason}" if reason else f"Unrecognized request argument supplied: {field}"


def validation_message(error: ErrorDetails) -> tuple[str, str | None]:
    """A 400's message and `param` for the first problem pydantic found in a request body."""
    where = error_param(error["loc"])
    if error["type"] == "extra_forbidden" and where is not None and "." not in where:
        return unsupported_field_message(where), where
    return (f"{where}: {error['msg']}" if where else str(error["msg"])), where


class ContentPart(BaseModel):
    """One part of a message's `content` array: text is read, other kinds are named in a 400."""

    model_config = ConfigDict(extra="ignore")

    type: Annotated[str, Field(max_length=64)]
    text: str | None = None


class RequestMessage(BaseModel):
    """A chat turn as OpenAI's SDK sends it: text or parts, any role, tool calls and answers."""

    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: Annotated[str, Field(max_length=256)] | None = None
    tool_calls: Annotated[list[ToolCall], Field(max_length=MAX_TOOLS)] | None = None
    tool_call_id: ToolCallId | None = None
    # An assistant turn's thinking, as a reasoning model's reply gave it (vLLM's newer name
    # for it is `reasoning`); its chat template decides whether the model sees it again.
    reasoning_content: str | None = None
    reasoning: str | None = None

    @field_validator("content")
    @classmethod
    def _text_only(cls, content: str | list[ContentPart] | None) -> str | list[ContentPart] | None:
        for part in content if isinstance(content, list) else ():
            if part.type != "text" or part.text is None:
                raise ValueError(
                    f"'{part.type}' parts are not supported: the models here read text only"
                )
        return content

    @model_validator(mode="after")
    def _content_or_tool_calls(self) -> RequestMessage:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(
                "content: a message needs content (or, from the assistant, tool_calls)"
            )
        return self

    def to_chat_message(self) -> ChatMessage:
        """The turn on the wire: its parts' text joined; `developer` is OpenAI's new `system`."""
        content = self.content
        text = content if isinstance(content, str) else "".join(p.text or "" for p in content or ())
        role = "system" if self.role == "developer" else self.role
        return ChatMessage(
            role=role,
            content=text,
            tool_calls=(self.tool_calls or None) if role == "assistant" else None,
            tool_call_id=self.tool_call_id if role == "tool" else None,
            reasoning_content=(
                (self.reasoning_content or self.reasoning) if role == "assistant" else None
            ),
        )


class SamplingRequest(BaseModel):
    """What chat and text completion requests share."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    model: Annotated[str, Field(min_length=1, max_length=256)]
    temperature: Annotated[float, Field(ge=0, le=2)] = 1.0
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP_SEQUENCES)] | None = None
    # Any 64-bit seed OpenAI's clients send (-1 included); the engine takes it modulo 2^63.
    seed: Annotated[int, Field(ge=-(2**63), lt=2**64)] | None = None
    n: Literal[1] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: Annotated[str, Field(max_length=65_536)] | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    # Keys are token ids as strings, OpenAI's shape.
    logit_bias: Annotated[dict[str, Bias], Field(max_length=MAX_LOGIT_BIAS_ENTRIES)] | None = None
    # vLLM's sampling fields, as its server takes them (`vllm bench serve` sends `ignore_eos`);
    # top_k -1 or 0: every token.
    top_k: Annotated[int, Field(ge=-1, le=MAX_TOKEN_ID)] | None = None
    min_p: Annotated[float, Field(ge=0, le=1)] = 0.0
    repetition_penalty: RepetitionPenalty = 1.0
    min_tokens: Annotated[int, Field(ge=0, le=1_000_000)] = 0
    ignore_eos: bool = False
    # OpenAI's bookkeeping, taken and not acted on: no reply depends on it. A prompt cache key
    # is a routing session, as `user` is: the same key goes where its prefix is cached.
    metadata: Annotated[dict[str, str], Field(max_length=16)] | None = None
    store: bool | None = None
    service_tier: Annotated[str, Field(max_length=64)] | None = None
    safety_identifier: Annotated[str, Field(max_length=256)] | None = None
    prompt_cache_key: Annotated[str, Field(max_length=65_536)] | None = None
    prompt_cache_retention: Annotated[str, Field(max_length=64)] | None = None

    @model_validator(mode="before")
    @classmethod
    def _drop_fields_that_ask_for_nothing(cls, body: Any) -> Any:
        """An unserved field sent with its no-effect value (`"audio": null`) is no request."""
        if not isinstance(body, dict):
            return body
        return {
            name: value
            for name, value in body.items()
            if name in cls.model_fields
            or name not in NO_EFFECT_VALUES
            or value not in NO_EFFECT_VALUES[name]
        }

    @field_validator("logit_bias")
    @classmethod
    def _token_id_keys(cls, bias: dict[str, float] | None) -> dict[str, float] | None:
        for key in bias or {}:
            if not (key.isascii() and key.isdigit() and int(key) <= MAX_TOKEN_ID):
                raise ValueError(f"keys are token ids; {json.dumps(key)[:40]} is not one")
        return bias

    @property
    def include_usage(self) -> bool:
        """Whether a streamed reply ends with a usage chunk."""
        return self.stream_options is not None and self.stream_options.include_usage

    def _frame(self, stream_id: str, session: str | None, **fields: Any) -> GenerateFrame:
        """A `generate` frame with the shared sampling fields and the given other fields."""
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        bias = {int(token): value for token, value in (self.logit_bias or {}).items()}
        return GenerateFrame(
            id=stream_id,
            model=self.model,
            temperature=self.temperature,
            top_p=self.top_p,
            stop=stop,
            seed=None if self.seed is None else self.seed % (MAX_SEED + 1),
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            logit_bias=bias or None,
            top_k=self.top_k if self.top_k is not None and self.top_k > 0 else None,
            min_p=self.min_p,
            repetition_penalty=self.repetition_penalty,
            min_tokens=self.min_tokens,
            ignore_eos=self.ignore_eos,
            session=_session(session or self.prompt_cache_key or self.user),
            **fields,
        )


def _session(name: str | None) -> str | None:
    """A routing session from a client's name for it: as it is, or hashed when too long."""
    if name is None or len(name) <= MAX_SESSION_CHARS:
        return name
    return hashlib.sha256(name.encode()).hexdigest()


class ChatTemplateKwargs(BaseModel):
    """vLLM's `chat_template_kwargs`: the template variables a request may set (thinking)."""

    model_config = ConfigDict(extra="forbid")

    enable_thinking: bool | None = None


class ChatCompletionRequest(SamplingRequest):
    """`POST /v1/chat/completions`."""

    messages: Annotated[list[RequestMessage], Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    response_format: ResponseFormat | None = None
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    # A reasoning model's thinking: OpenAI's effort, and vLLM's switches for it.
    reasoning_effort: ReasoningEffort | None = None
    chat_template_kwargs: ChatTemplateKwargs | None = None
    include_reasoning: bool = True

    @model_validator(mode="after")
    def _top_logprobs_need_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs: only with 'logprobs': true")
        return self

    @model_validator(mode="after")
    def _tool_choice_fits_tools(self) -> ChatCompletionRequest:
        problem = tool_choice_problem(self.tools, self.tool_choice, self.response_format)
        if problem is not None:
            raise ValueError(problem)
        return self

    def to_generate_frame(self, stream_id: str, *, session: str | None = None) -> GenerateFrame:
        """The same request as a `generate` frame (no limit given: the rest of the context)."""
        max_tokens = self.max_completion_tokens or self.max_tokens
        messages = [message.to_chat_message() for message in self.messages]
        return self._frame(
            stream_id,
            session,
            messages=messages,
            max_tokens=max_tokens,
            logprobs=(self.top_logprobs or 0) if self.logprobs else None,
            response_format=self.response_format,
            tools=self.tools or None,
            tool_choice=self.tool_choice,
            parallel_tool_calls=self.parallel_tool_calls is not False,
            reasoning_effort=self.reasoning_effort,
            enable_thinking=(
                self.chat_template_kwargs.enable_thinking if self.chat_template_kwargs else None
            ),
            include_reasoning=self.include_reasoning,
        )


class CompletionRequest(SamplingRequest):
    """`POST /v1/completions` (a raw prompt)."""

    prompt: str
    max_tokens: Annotated[int, Field(ge=1, le=1_000_000)] = LEGACY_DEFAULT_MAX_TOKENS
    logprobs: Annotated[int, Field(ge=0, le=MAX_LEGACY_LOGPROBS)] | None = None

    def to_generate_frame(self, stream_id: str, *, session: str | None = None) -> GenerateFrame:
        """The same request as a `generate` frame."""
        return self._frame(
            stream_id,
            session,
            prompt=self.prompt,
            max_tokens=self.max_tokens,
            logprobs=self.logprobs,
        )


Kind = Literal["chat", "text"]


def completion_id(kind: Kind = "chat") -> str:
    """A fresh `chatcmpl-…` (chat) or `cmpl-…` (text) id."""
    return f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"


def error_body(code: ErrorCode, message: str, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error object for a protocol error code; `param`: the field at fault."""
    _status, error_type = ERROR_STATUS[code]
    return {"error": {"message": message, "type": error_type, "param": param, "code": code.value}}


def usage_body(done: DoneFrame) -> dict[str, Any]:
    """OpenAI's usage object; a reasoning model's says how many completion tokens were thinking."""
    prompt, completion = done.usage.prompt_tokens, done.usage.completion_tokens
    body: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if done.usage.reasoning_tokens is not None:
        body["completion_tokens_details"] = {"reasoning_tokens": done.usage.reasoning_tokens}
    return body


def openai_finish_reason(done: DoneFrame) -> str:
    """OpenAI has no `cancelled`: a cancelled reply reads as stopped."""
    return "stop" if done.finish_reason == "cancelled" else done.finish_reason


def chat_logprobs(entries: list[TokenLogprob]) -> dict[str, Any]:
    """A chat choice's `logprobs`."""
    return {"content": [entry.model_dump() for entry in entries], "refusal": None}


def text_logprobs(entries: list[TokenLogprob], offset: int = 0) -> dict[str, Any]:
    """A text completion choice's `logprobs`; `offset`: characters of text before these."""
    offsets = []
    for entry in entries:
        offsets.append(offset)
        offset += len(entry.token)
    return {
        "tokens": [entry.token for entry in entries],
        "token_logprobs": [entry.logprob for entry in entries],
        "top_logprobs": [
            {top.token: top.logprob for top in entry.top_logprobs} for entry in entries
        ],
        "text_offset": offsets,
    }


def completion_body(
    kind: Kind,
    cid: str,
    model: str,
    text: str,
    done: DoneFrame,
    logprobs: list[TokenLogprob] | None = None,
    forced: ForcedTools | None = None,
    reasoning: str | None = None,
) -> dict[str, Any]:
    """A whole (non-streamed) chat or text completion; `reasoning`: the model's thinking."""
    choice: dict[str, Any] = {"index": 0, "finish_reason": openai_finish_reason(done)}
    if kind == "text":
        choice["text"] = text
        choice["logprobs"] = None if logprobs is None else text_logprobs(logprobs)
    else:
        choice["logprobs"] = None if logprobs is None else chat_logprobs(logprobs)
        calls = forced.calls(text) if forced is not None else None
        if calls is not None and forced is not None:
            choice["message"] = {"role": "assistant", "content": None, "tool_calls": calls}
            choice["finish_reason"] = forced.finish_reason(done, text)
        elif (own := own_tool_calls(done)) is not None:
            choice["message"] = {"role": "assistant", "content": text or None, "tool_calls": own}
            choice["finish_reason"] = "tool_calls"
        else:
            choice["message"] = {"role": "assistant", "content": text}
        if reasoning is not None:
            choice["message"]["reasoning_content"] = reasoning
    return {
        "id": cid,
        "object": "chat.completion" if kind == "chat" else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": usage_body(done),
    }


class ChunkEncoder:
    """The SSE events of one streamed chat or text completion.

    The fields every chunk repeats (id, object, created, model) are encoded once per
    response; a content chunk then costs one `json.dumps` of its text, because the gateway
    and the agents write one for every token of every stream.
    """

    def __init__(self, kind: Kind, cid: str, model: str) -> None:
        self.kind = kind
        head = {
            "id": cid,
            "object": "chat.completion.chunk" if kind == "chat" else "text_completion",
            "created": int(time.time()),
            "model": model,
        }
        self._head = b"data: " + _compact_json(head)[:-1].encode() + b',"choices":['
        self._content_open = (
            b'{"index":0,"delta":{"content":' if kind == "chat" else b'{"index":0,"text":'
        )
        self._content_close = (
            b'},"finish_reason":null}]}\n\n'
            if kind == "chat"
            else b',"logprobs":null,"finish_reason":null}]}\n\n'
        )
        self._text_offset = 0  # characters of text before the next token (text logprobs)

    def first(self, text: str, logprobs: list[TokenLogprob] | None = None) -> bytes:
        """The opening chunk (the assistant's role, for chat) and the first text, if any."""
        if self.kind == "chat":
            role = self._choice({"delta": {"role": "assistant", "content": ""}})
            return role + (self.content(text, logprobs) if text or logprobs else b"")
        return self.content(text, logprobs)

    def content(self, text: str, logprobs: list[TokenLogprob] | None = None) -> bytes:
        """A chunk carrying generated text, and its tokens' logprobs when asked for."""
        if logprobs is None:
            return self._head + self._content_open + json.dumps(text).encode() + self._content_close
        if self.kind == "chat":
            return self._choice({"delta": {"content": text}, "logprobs": chat_logprobs(logprobs)})
        fields = {"text": text, "logprobs": text_logprobs(logprobs, self._text_offset)}
        self._text_offset += sum(len(entry.token) for entry in logprobs)
        return self._choice(fields)

    def reasoning(self, text: str) -> bytes:
        """A chunk carrying more of a reasoning model's thinking."""
        return self._choice({"delta": {"reasoning_content": text}})

    def tool_calls(self, calls: list[dict[str, Any]]) -> bytes:
        """A chunk with whole tool calls (or, named in the first, the opening of a streamed one)."""
        indexed = [{"index": index, **call} for index, call in enumerate(calls)]
        return self._choice({"delta": {"tool_calls": indexed}})

    def tool_arguments(self, text: str) -> bytes:
        """A chunk with more of the one tool call's arguments."""
        delta = {"tool_calls": [{"index": 0, "function": {"arguments": text}}]}
        return self._choice({"delta": delta})

    def finish(self, finish_reason: str) -> bytes:
        """The chunk with the finish reason and no text."""
        if self.kind == "chat":
            return self._choice({"delta": {}, "finish_reason": finish_reason})
        return self._choice({"text": "", "logprobs": None, "finish_reason": finish_reason})

    def usage(self, usage: dict[str, Any]) -> bytes:
        """The final chunk with token counts and no choices (`stream_options.include_usage`)."""
        return self._head + b'],"usage":' + _compact_json(usage).encode() + b"}\n\n"

    def _choice(self, fields: dict[str, Any]) -> bytes:
        choice = {"index": 0, **fields}
        choice.setdefault("finish_reason", None)
        return self._head + _compact_json(choice).encode() + b"]}\n\n"


def shown_text(delta: DeltaFrame) -> str:
    """What a delta adds to the reply's content (its text, less any tool-call markup)."""
    return delta.text if delta.content is None else delta.content


def own_tool_calls(done: DoneFrame) -> list[dict[str, Any]] | None:
    """The calls a model made of its own accord (`tool_choice: auto`), in OpenAI's shape."""
    return [call.model_dump() for call in done.tool_calls] if done.tool_calls else None


def tool_call_id() -> str:
    """A fresh `call_…` id for a tool call."""
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class ForcedTools:
    """How a reply that must call tools reads in OpenAI's shapes.

    The model's text is the named function's arguments, or (`required`, no name) the calls as
    vLLM writes them: `[{"name": …, "parameters": {…}}, …]`. A grammar holds it to that shape.
    """

    name: str | None
    call_id: str = field(default_factory=tool_call_id)

    @classmethod
    def of(cls, frame: GenerateFrame) -> ForcedTools | None:
        """The forced tool calls of a request, if it forces any."""
        forced = frame.forced_tools()
        if forced is None:
            return None
        return cls(forced[0].function.name if frame.tool_choice != "required" else None)

    def calls(self, text: str) -> list[dict[str, Any]] | None:
        """The tool calls in a whole reply; None if it is not whole (cut by `length`)."""
        if self.name is not None:
            return [self._call(self.call_id, self.name, text)]
        try:
            written = json.loads(text)
        except ValueError:
            return None
        return [
            self._call(
                f"{self.call_id}_{index}" if index else self.call_id,
                call["name"],
                json.dumps(call["parameters"], ensure_ascii=False),
            )
            for index, call in enumerate(written)
        ]

    @staticmethod
    def _call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
        return {
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }

    def finish_reason(self, done: DoneFrame, text: str) -> str:
        """`tool_calls` once the calls are whole; otherwise what ended the reply."""
        if done.finish_reason == "stop" and self.calls(text) is not None:
            return "tool_calls"
        return openai_finish_reason(done)


def _compact_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def sse_event(body: dict[str, Any]) -> bytes:
    """`data: <json>` and the blank line that ends an event."""
    return b"data: " + _compact_json(body).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"
