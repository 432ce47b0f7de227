"""A synthetic engine: fixed time to first token, fixed tokens per second, deterministic text.

For capacity tests and benchmarks of the gateway only; it says `synthetic` everywhere it
shows up (start frames, /readyz, the registry). Token `n` of a reply is a pure function of
the prompt and `n`, so a resumed stream produces exactly what the uninterrupted one would.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncGenerator, Sequence

from gpu_agent.engine import EngineStep, GenerationRequest
from spotgate.protocol import ChatMessage
from spotgate.settings import AgentSettings, EngineKind

SYNTHETIC_WORDS = (
    "spot",
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
    "mike",
    "november",
    "oscar",
    "papa",
    "quebec",
    "romeo",
    "sierra",
    "tango",
    "uniform",
    "victor",
    "whiskey",
    "xray",
    "yankee",
    "zulu",
    "gateway",
    "agent",
    "token",
    "stream",
    "resume",
    "drain",
    "pool",
    "zone",
    "price",
    "capacity",
    "queue",
    "model",
)
MIN_TICK_SECONDS = 0.01
"""Tokens due within one tick go out together, so a thousand streams stay cheap to run."""

_MASK_64 = (1 << 64) - 1


def _mix(value: int) -> int:
    """splitmix64: a cheap, well-spread integer hash."""
    value = (value + 0x9E3779B97F4A7C15) & _MASK_64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK_64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK_64
    return value ^ (value >> 31)


def prompt_seed(prompt_ids: Sequence[int]) -> int:
    """A 64-bit digest of the prompt that every token of the reply derives from."""
    digest = hashlib.blake2b(repr(list(prompt_ids)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def synthetic_token(seed: int, position: int) -> int:
    """The id of token `position` of the reply to the prompt whose seed is `seed`."""
    return _mix(seed + position) % len(SYNTHETIC_WORDS)


class SyntheticEngine:
    """Deterministic text at a configured pace; no model, no accelerator."""

    kind: EngineKind = "synthetic"

    def __init__(self, settings: AgentSettings) -> None:
        self.model = settings.served_model_name or settings.model or "synthetic"
        self.capacity = settings.synthetic.capacity
        self._ttft_seconds = settings.synthetic.ttft_seconds
        self._tokens_per_second = settings.synthetic.tokens_per_second
        self._running = 0

    def chat_prompt_ids(self, messages: Sequence[ChatMessage]) -> list[int]:
        """Bytes of a simple transcript, one id per byte."""
        transcript = "".join(f"<{m.role}>{m.content}" for m in messages) + "<assistant>"
        return list(transcript.encode())

    def text_prompt_ids(self, prompt: str) -> list[int]:
        """Bytes of the prompt, one id per byte."""
        return list(prompt.encode())

    def decode(self, token_ids: Sequence[int]) -> str:
        """One word and a space per token."""
        return "".join(f"{SYNTHETIC_WORDS[token]} " for token in token_ids)

    def running(self) -> int:
        """Streams being generated now."""
        return self._running

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[EngineStep, None]:
        """Emit the reply's tokens on schedule: first after the TTFT, then at the set rate."""
        loop = asyncio.get_running_loop()
        self._running += 1
        try:
            start = loop.time() + self._ttft_seconds
            first = len(request.resume_ids)
            seed = prompt_seed(request.prompt_ids)
            sent = 0
            while sent < request.max_tokens:
                due = 1 + int((loop.time() - start) * self._tokens_per_second)
                due = min(request.max_tokens, due)
                if due <= sent:
                    wait = start + sent / self._tokens_per_second - loop.time()
                    await asyncio.sleep(max(wait, MIN_TICK_SECONDS))
                    continue
                ids = [synthetic_token(seed, first + position) for position in range(sent, due)]
                sent = due
                yield EngineStep(ids, "length" if sent == request.max_tokens else None)
        finally:
            self._running -= 1

    async def close(self) -> None:
        """Nothing to release."""
