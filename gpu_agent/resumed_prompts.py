"""The prompt ids of streams resumed here, kept: a moving stream's rounds tokenize it once.

A stream moved make-before-break opens its continuation on the next agent several times:
warming rounds, then the switch (gateway/moves.py), each from the same conversation and the
tokens the client holds by then. Its prompt ids do not change between rounds, but making
them (the chat template, then the tokenizer: about 2 ms per 1,000 tokens on a free CPU core,
58 ms at 32,000, on the one prompt thread that every request waits its turn for) came before
each round reached the engine; at the switch the client waits for it. Kept here, keyed by a
digest of what they are made of and whose stream it is, a later round finds them at once.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict

from pydantic import TypeAdapter

from spotgate.protocol import GenerateFrame

RESUMED_PROMPTS_HELD_TOKENS = 4 * 1024 * 1024
"""At most this many prompt tokens kept (4 bytes each, 16 MiB), the least recently used
dropped first: hundreds of long conversations moving onto one agent at once."""
PROMPT_FIELDS = {"messages", "prompt", "tools", "reasoning_effort", "enable_thinking"}
"""What a frame's prompt ids are made of (`VllmEngine._prompt_ids`, `chat_template_kwargs`)."""
_FRAMES = TypeAdapter(GenerateFrame)


def prompt_key(frame: GenerateFrame) -> bytes:
    """A digest of what `frame`'s prompt ids are made of, and of the tenant it is for.

    The tenant's part: a stream finds only its own tenant's prompts kept, as its prefix cache
    finds only its own tenant's blocks, so no tenant can time another's conversations.
    Made on the event loop: 0.65 ms for a conversation of 400,000 characters, serialized
    straight to bytes (through a `str` first, the serializing took 2.5 times as long).
    """
    made_of = _FRAMES.dump_json(frame, include={*PROMPT_FIELDS, "tenant"})
    return hashlib.blake2b(made_of, digest_size=16).digest()


class ResumedPrompts:
    """Prompt ids by `prompt_key`, least recently used dropped past `held_tokens` in all."""

    def __init__(self, held_tokens: int = RESUMED_PROMPTS_HELD_TOKENS) -> None:
        self._held_tokens = held_tokens
        self._tokens = 0
        self._ids: OrderedDict[bytes, array[int]] = OrderedDict()

    @property
    def tokens(self) -> int:
        """Prompt tokens kept now."""
        return self._tokens

    def get(self, key: bytes) -> list[int] | None:
        """The prompt ids kept under `key` (a list of the caller's own), or None."""
        ids = self._ids.get(key)
        if ids is None:
            return None
        self._ids.move_to_end(key)
        return ids.tolist()

    def put(self, key: bytes, ids: list[int]) -> None:
        """Keep `ids` under `key`; a prompt longer than all that may be kept is not."""
        if len(ids) > self._held_tokens:
            return
        old = self._ids.pop(key, None)
        if old is not None:
            self._tokens -= len(old)
        self._ids[key] = array("i", ids)
        self._tokens += len(ids)
        while self._tokens > self._held_tokens:
            _, dropped = self._ids.popitem(last=False)
            self._tokens -= len(dropped)
