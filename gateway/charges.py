"""What a key is charged for a stream: never more than the gateway relayed and measured.

An agent reports a stream's usage in its `start` and `done` frames, and a compromised agent
could report anything. The gateway holds each report to what it can measure itself:

- completion tokens: the token ids it relayed to the client (it asks every agent for them;
  a `done` frame counts the ids a resume brought along too, which the client holds);
- prompt tokens: `prompt_token_bound`, an upper bound from the request: every token of a
  rendered prompt stands for at least one UTF-8 byte of what it was rendered from, besides
  what the chat template adds around each part and on its own.

A report above either is capped to it (`charged_usage`) and the finding counted
(`gateway/vouching.py`). An honest agent never reports more, so its counts stand.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from spotgate.protocol import GenerateFrame, Usage

PROMPT_FIELDS = frozenset({"prompt", "messages", "tools", "tool_choice", "response_format"})
"""Every field of a request a prompt is rendered from."""
TEMPLATE_TOKENS_PER_PART = 32
"""Tokens a chat template may add around one turn or tool (role headers, separators)."""
TEMPLATE_BASE_TOKENS = 256
"""Tokens a chat template may add of its own (a default system prompt, date lines)."""
TEMPLATE_TOOLS_TOKENS = 768
"""Tokens a chat template may add to introduce tools, when the request offers some."""


class RogueReason(StrEnum):
    """Why an agent's row or report was not taken at its word."""

    UNKNOWN_AGENT = "unknown_agent"  # no launch record: the pool manager never launched it
    OTHER_MODEL = "other_model"  # launched for another model
    OTHER_URL = "other_url"  # launched listening elsewhere
    CAPACITY = "capacity"  # more streams than its instance type serves: capped
    PROMPT_TOKENS = "prompt_tokens"  # more prompt than the gateway sent it: capped
    COMPLETION_TOKENS = "completion_tokens"  # more tokens than the gateway relayed: capped


@dataclass(frozen=True, slots=True)
class Capped:
    """An agent's count above what the gateway measured, and what was charged instead."""

    reason: RogueReason
    reported: int
    charged: int


def prompt_token_bound(frame: GenerateFrame) -> int:
    """The most prompt tokens the request can make, with any tokenizer and chat template.

    The fields' JSON (UTF-8, escapes only add) holds every byte of their text; a tool's
    schema counts twice, as a template may lay it out indented, a whitespace run per line.
    """
    made_of = len(frame.model_dump_json(include=set(PROMPT_FIELDS), exclude_none=True).encode())
    tools = frame.tools or ()
    schemas = sum(len(tool.model_dump_json(exclude_none=True).encode()) for tool in tools)
    parts = len(frame.messages or ()) + len(tools)
    template = TEMPLATE_BASE_TOKENS + (TEMPLATE_TOOLS_TOKENS if tools else 0)
    return made_of + schemas + parts * TEMPLATE_TOKENS_PER_PART + template


def charged_prompt_tokens(reported: int, bound: int) -> tuple[int, Capped | None]:
    """An agent's prompt count, capped to the request's bound."""
    if reported <= bound:
        return reported, None
    return bound, Capped(RogueReason.PROMPT_TOKENS, reported, bound)


def charged_usage(
    reported: Usage, *, prompt_bound: int, held_tokens: int
) -> tuple[Usage, tuple[Capped, ...]]:
    """A `done` frame's usage as charged: capped to the prompt bound and the ids relayed.

    `held_tokens`: the ids the client holds of the stream (relayed, and any its resume brought).
    """
    prompt, prompt_capped = charged_prompt_tokens(reported.prompt_tokens, prompt_bound)
    completion = min(reported.completion_tokens, held_tokens)
    capped = [prompt_capped] if prompt_capped is not None else []
    if reported.completion_tokens > held_tokens:
        capped.append(
            Capped(RogueReason.COMPLETION_TOKENS, reported.completion_tokens, held_tokens)
        )
    thinking = reported.reasoning_tokens
    usage = Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        reasoning_tokens=None if thinking is None else min(thinking, completion),
    )
    return usage, tuple(capped)


def resume_as_prompt(usage: Usage, resumed_prompt_tokens: int) -> Usage:
    """A `done` frame's usage for its client when its resume was charged as prompt.

    An agent counts a resume's ids as completion (the reply it continues); ids the deployment
    never delivered to the key are prompt the client wrote, and the key pays for them as such:
    the client is told what it was charged.
    """
    moved = min(resumed_prompt_tokens, usage.completion_tokens)
    completion = usage.completion_tokens - moved
    thinking = usage.reasoning_tokens
    return Usage(
        prompt_tokens=usage.prompt_tokens + moved,
        completion_tokens=completion,
        reasoning_tokens=None if thinking is None else min(thinking, completion),
    )
