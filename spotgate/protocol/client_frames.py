"""The frames a client sends: `generate` (a moved stream with its `resume`), `cancel`, `auth`."""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import Field, StringConstraints, model_validator

from spotgate.protocol.chat import (
    ChatMessage,
    NamedToolChoice,
    ResponseFormat,
    Tool,
    ToolChoice,
    tool_choice_problem,
)
from spotgate.protocol.fields import (
    MAX_LOGIT_BIAS_ENTRIES,
    MAX_SEED,
    MAX_STOP_SEQUENCES,
    MAX_TOKEN_ID,
    MAX_TOOLS,
    MAX_TOP_LOGPROBS,
    RECEIPT_MAX_CHARS,
    Count,
    ModelName,
    StreamId,
    TokenId,
    WireModel,
    json_chars,
    split_model,
)

Penalty = Annotated[float, Field(ge=-2, le=2)]
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]
"""OpenAI's `reasoning_effort`; a chat template that takes it reads it, "none" turns thinking
off (vLLM's `enable_thinking`)."""
Bias = Annotated[float, Field(ge=-100, le=100)]
RepetitionPenalty = Annotated[float, Field(gt=0, le=2)]
"""vLLM's: logits of tokens already in the prompt or the reply divided (or multiplied) by it."""


class Resume(WireModel):
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


class GenerateFrame(WireModel):
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
    stop: Annotated[list[str], Field(max_length=MAX_STOP_SEQUENCES)] = Field(default_factory=list)
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
    # "flex": the stream takes only capacity no other stream waits for, queued behind every
    # interactive one (OpenAI's flex processing; every request of a batch). None: interactive.
    service_tier: Literal["flex"] | None = None
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


class CancelFrame(WireModel):
    """Stop a stream; the engine aborts the request."""

    type: Literal["cancel"] = "cancel"
    id: StreamId


class AuthFrame(WireModel):
    """Authenticate (browsers, as the first frame) or refresh the token of a live socket."""

    type: Literal["auth"] = "auth"
    token: Annotated[str, StringConstraints(min_length=1, max_length=8192)]


class PingFrame(WireModel):
    """Application-level keep-alive; answered with `pong`."""

    type: Literal["ping"] = "ping"


ClientFrame = Annotated[
    GenerateFrame | CancelFrame | AuthFrame | PingFrame, Field(discriminator="type")
]

CLIENT_FRAME_TYPES = frozenset({"generate", "cancel", "auth", "ping"})
