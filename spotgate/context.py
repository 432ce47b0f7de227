"""Whether a request fits a model's context: the agent's exact rule, the gateway's early one.

An agent knows the exact size of a prompt (it tokenizes it) and refuses what does not fit
before the engine sees it. The gateway has no tokenizer, but agents publish their
`max_model_len` and an upper bound on the characters one token can stand for
(`max_token_chars`); so the gateway can prove some prompts too long from their length alone
and answer them at once, without sending them anywhere. Both answer with OpenAI's
`context_length_exceeded`.
"""

from __future__ import annotations

from dataclasses import dataclass

from spotgate.protocol import GenerateFrame

UNICODE_COMPOSITION_FACTOR = 4
"""NFC/NFKC can compose up to 4 code points into one (U+1FA2 ᾢ): a tokenizer normalizing so
sees up to 4 input characters per character of its vocabulary."""


@dataclass(frozen=True, slots=True)
class ContextLimits:
    """What an agent publishes about its model's context."""

    max_model_len: int
    max_token_chars: int


class ContextExceeded(ValueError):
    """The prompt and the completion asked for cannot fit the model's context."""


def kept_prompt_chars(frame: GenerateFrame) -> int:
    """Characters of the request that any chat template keeps (a lower bound of its length).

    A raw prompt; else the user turns, the tools, and what the model called and was answered.
    Templates may trim a turn's surrounding white space (Llama-3, Gemma) or drop parts of
    other turns (Qwen3 drops earlier reasoning), so only stripped text counts. A template that
    offers the model tools writes each one's name and description, the calls' names and
    arguments, and the tools' answers; the parameter schemas it may write more briefly than
    their JSON (as signatures), so they do not count here, nor does the reply's schema, which
    no template sees.
    """
    if frame.prompt is not None:
        return len(frame.prompt)
    kept = 0
    for message in frame.messages or ():
        if message.role in ("user", "tool"):
            kept += len(message.content.strip())
        for call in message.tool_calls or ():
            kept += len(call.function.name) + len(call.function.arguments.strip())
    for tool in frame.tools or ():
        kept += len(tool.function.name) + len((tool.function.description or "").strip())
    return kept


def min_prompt_tokens(frame: GenerateFrame, limits: ContextLimits) -> int:
    """A lower bound on the prompt's tokens: no token stands for more than `max_token_chars`."""
    return -(-kept_prompt_chars(frame) // max(1, limits.max_token_chars))


def max_prompt_tokens(max_model_len: int, max_tokens: int | None) -> int:
    """The most tokens a prompt can have and still leave the completion room.

    The room is `max_tokens`, or one token when the request sets none.
    """
    return max(0, max_model_len - (max_tokens or 1))


def completion_budget(
    max_model_len: int,
    prompt_tokens: int,
    max_tokens: int | None,
    key_max_tokens: int | None = None,
    *,
    prompt_at_least: bool = False,
) -> int:
    """Tokens the completion may have; raises `ContextExceeded` when the request cannot fit.

    With no `max_tokens` the completion may use what is left of the context (as OpenAI and
    vLLM do), capped by the key's own limit. `prompt_at_least`: `prompt_tokens` is a lower
    bound, not a count (the message says so).
    """
    room = max_model_len - prompt_tokens
    if room < 1 or (max_tokens is not None and max_tokens > room):
        raise ContextExceeded(
            exceeded_message(max_model_len, prompt_tokens, max_tokens, prompt_at_least)
        )
    if max_tokens is not None:
        return max_tokens
    return room if key_max_tokens is None else min(room, key_max_tokens)


def early_refusal(frame: GenerateFrame, limits: ContextLimits) -> str | None:
    """The gateway's check: why the request cannot fit, when its length alone proves it."""
    try:
        completion_budget(
            limits.max_model_len,
            min_prompt_tokens(frame, limits),
            frame.max_tokens,
            prompt_at_least=True,
        )
    except ContextExceeded as err:
        return str(err)
    return None


def exceeded_message(
    max_model_len: int, prompt_tokens: int, max_tokens: int | None, prompt_at_least: bool = False
) -> str:
    """OpenAI's wording, with the numbers a client needs to shorten its request."""
    some = "at least " if prompt_at_least else ""
    if max_tokens is None:
        asked = f"your prompt has {some}{prompt_tokens} tokens, which leaves no room for a reply"
    else:
        asked = (
            f"you requested {some}{prompt_tokens + max_tokens} tokens "
            f"({some}{prompt_tokens} in the prompt, {max_tokens} in the completion)"
        )
    return (
        f"This model's maximum context length is {max_model_len} tokens. However, {asked}. "
        "Please reduce the length of the prompt or of max_tokens."
    )
