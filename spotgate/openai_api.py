"""OpenAI-compatible chat and text completion requests, shared by the gateway and the agents.

Requests take every field OpenAI's SDK sends: each is honoured, accepted as bookkeeping that
changes no reply (`metadata`, `store`…), or refused by name with a 400 (OpenAI itself refuses
an unknown field the same way), so no setting is silently ignored. `to_generate_frame` maps a
request onto the wire protocol, so every surface runs the same generation path; the replies
are made in `spotgate.openai_replies`.
"""

from __future__ import annotations

import hashlib
import json
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
    GenerateFrame,
    Penalty,
    ReasoningEffort,
    RepetitionPenalty,
    ResponseFormat,
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
    # "flex" waits for capacity interactive streams leave (`GenerateFrame.service_tier`); the
    # others are interactive. The reply names the tier it got, when one was asked for.
    service_tier: Literal["auto", "default", "flex", "priority", "scale"] | None = None
    # OpenAI's bookkeeping, taken and not acted on: no reply depends on it. A prompt cache key
    # is a routing session, as `user` is: the same key goes where its prefix is cached.
    metadata: Annotated[dict[str, str], Field(max_length=16)] | None = None
    store: bool | None = None
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
    def served_tier(self) -> str | None:
        """The tier the reply names: `flex` or `default`; None when the request named none."""
        if self.service_tier is None:
            return None
        return "flex" if self.service_tier == "flex" else "default"

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
            service_tier="flex" if self.service_tier == "flex" else None,
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
