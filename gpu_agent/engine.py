"""The engine interface the agent serves from: vLLM on a GPU (or CPU), or the synthetic one.

An engine turns a prompt into token ids and streams generated token ids; text is made from
ids by the agent (`gpu_agent.detokenizer`), so a stream moved to another agent continues
exactly. Cancelling the consumer of `generate` (or closing it) aborts the request.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from gpu_agent.reasoning import ThinkTags
from gpu_agent.tool_calls import ToolCallReader
from spotgate.protocol import ChatMessage, GenerateFrame, Tool
from spotgate.settings import EngineKind

FinishReason = Literal["stop", "length"]


class EngineConfigError(ValueError):
    """The engine cannot start with the arguments it was given; the message names the one."""


class EngineRequestError(ValueError):
    """The engine refused a request as invalid; `param` names the field at fault, if one is."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class EngineBusy(Exception):
    """The engine has no room for this request now (another agent may): a capacity refusal."""


class NoChatTemplate(EngineRequestError):
    """The model has no chat template, so it can only complete a raw prompt."""


class PromptTooLong(ValueError):
    """The prompt cannot fit the context: it has at least `at_least_tokens` tokens.

    Found without tokenizing all of it: from its length, or from a part of it.
    """

    def __init__(self, at_least_tokens: int) -> None:
        super().__init__(f"the prompt has at least {at_least_tokens} tokens")
        self.at_least_tokens = at_least_tokens


class ReplyBroken(RuntimeError):
    """The engine ended one reply short of what its request demands (e.g. its JSON schema)."""


class EngineFailed(RuntimeError):
    """The engine cannot serve any more (e.g. its process died); no request will succeed."""


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """One generation: the prompt's ids plus any already generated ids to continue after.

    Whatever depends on the generated tokens spans the resume: penalties count `resume_ids`
    as generated, a `json_schema` grammar starts where they left it, and `min_tokens` is what
    is left of the client's after them.
    """

    request_id: str
    prompt_ids: Sequence[int]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    resume_ids: Sequence[int] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: Mapping[int, float] | None = None
    top_k: int | None = None
    """None: every token."""
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    min_tokens: int = 0
    ignore_eos: bool = False
    logprobs: int | None = None
    """None: no logprobs; k: each token's logprob and its k most likely alternatives."""
    json_schema: str | None = None
    """The JSON schema (as JSON text) every completion must match; None: free text."""
    cache_salt: str | None = None
    """Keeps the prompt's cached KV blocks apart from those of other salts (`spotgate.tenancy`);
    an engine with no prefix cache ignores it."""
    adapter: str | None = None
    """The LoRA adapter to generate with (one of `Engine.adapter_names`); None: the model's own
    weights."""
    tenant: str | None = None
    """Whose stream it is (`spotgate.tenancy`): each tenant's fair share of the adapter slots."""


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """A generated token's log probability and the top alternatives, as (id, logprob)."""

    token_id: int
    logprob: float
    top: Sequence[tuple[int, float]] = ()


@dataclass(frozen=True, slots=True)
class EngineStep:
    """Token ids generated since the last step; `finish_reason` set on the last one."""

    token_ids: Sequence[int]
    finish_reason: FinishReason | None = None
    logprobs: Sequence[TokenLogprobs] | None = None
    """One per token, when the request asked for logprobs."""


ACCEPTED = EngineStep(())
"""An engine's first step, once it has taken a request: no token yet."""


@dataclass(slots=True)
class PrefixCacheCounts:
    """Cumulative prompt tokens looked up in an engine's prefix cache, and those found there."""

    queried_tokens: int = 0
    hit_tokens: int = 0


class Engine(Protocol):
    """What the agent needs from an inference engine."""

    kind: EngineKind
    model: str
    capacity: int
    max_model_len: int
    """Tokens of prompt and completion together that one sequence may hold."""
    max_token_chars: int
    """An upper bound on the prompt characters one token stands for (see `spotgate.context`)."""
    held_token_ids: frozenset[int]
    """Ids whose text waits for the ids after them (`gpu_agent.detokenizer.held_token_ids`)."""
    think_tags: ThinkTags | None
    """The tags the model thinks between (its reasoning parser's); None: it does not reason."""
    prefix_cache: PrefixCacheCounts
    """Prompt tokens the engine looked up in its prefix cache and those it found, since start;
    an engine with no cache keeps zeros."""

    def known_token(self, token_id: int) -> bool:
        """Whether the model has this token id (a resume's ids come from clients too)."""
        ...

    def chat_prompt_ids(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[Tool] = (),
        template_kwargs: Mapping[str, object] | None = None,
    ) -> list[int]:
        """Token ids of the chat template applied to `messages` and tools, ready for the reply.

        `template_kwargs`: more of the template's variables (`enable_thinking`, …).

        Raises `NoChatTemplate` for a model that has none.
        """
        ...

    def text_prompt_ids(self, prompt: str) -> list[int]:
        """Token ids of a raw prompt."""
        ...

    async def prompt_ids(self, frame: GenerateFrame, max_prompt_tokens: int) -> list[int]:
        """Token ids of a raw prompt, or of the chat template applied to turns and tools.

        Made where no other stream waits on them (not on the event loop). A prompt of more
        than `max_prompt_tokens` cannot fit the context: an engine whose tokenizing costs
        raises `PromptTooLong` as soon as it knows, rather than tokenize all of it. Raises
        `NoChatTemplate` for a chat to a model with none.
        """
        ...

    def tool_calls(self, tools: Sequence[Tool]) -> ToolCallReader | None:
        """A reader of the calls the model makes of its own accord; None: it has no parser."""
        ...

    def adapter_names(self) -> Collection[str]:
        """The LoRA adapters a request may name (`model: "<model>:<adapter>"`)."""
        ...

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of generated token ids (special tokens left out)."""
        ...

    def prompt_text(self, prompt_ids: Sequence[int]) -> str:
        """Text of prompt token ids, special tokens kept (what a template wrote)."""
        ...

    def token_bytes(self, token_id: int, *, first: bool) -> bytes:
        """The bytes a token adds to a reply; `first`: it opens the reply.

        Part of a character included: the bytes of a reply's tokens join to its UTF-8.
        """
        ...

    def generate(self, request: GenerationRequest) -> AsyncGenerator[EngineStep, None]:
        """Stream the generation; closing the iterator aborts the request in the engine.

        Yields `ACCEPTED` first, once the engine has taken the request: the stream's `start`
        waits for the first step, so a request the engine refuses is refused before it.
        Raises `EngineRequestError` for a request the engine refuses and `EngineFailed` once
        the engine itself is gone.
        """
        ...

    def running(self) -> int:
        """Requests the engine is working on now."""
        ...

    def failure(self) -> str | None:
        """Why the engine cannot serve any more; None while it can."""
        ...

    async def close(self) -> None:
        """Release the engine (processes, memory)."""
        ...
