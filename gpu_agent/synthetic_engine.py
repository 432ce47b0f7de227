"""A synthetic engine: fixed time to first token, fixed tokens per second, deterministic text.

For capacity tests and benchmarks of the gateway only; it says `synthetic` everywhere it
shows up (start frames, /readyz, the registry). Token `n` of a reply is a pure function of
the prompt and `n`, so a resumed stream produces exactly what the uninterrupted one would.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncGenerator, Collection, Mapping, Sequence

from gpu_agent.engine import (
    ACCEPTED,
    EngineRequestError,
    EngineStep,
    GenerationRequest,
    PrefixCacheCounts,
)
from gpu_agent.reasoning import ThinkTags
from gpu_agent.tool_calls import ToolCallReader
from spotgate.protocol import ChatMessage, GenerateFrame, Tool
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
ECHO_ID_BASE = 1000
"""Echoed bytes are token ids from here on (below it, ids are words)."""
_USER_MARK = b"<user>"
_ASSISTANT_MARK = b"<assistant>"


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


def synthetic_reply(user_message: str, max_tokens: int) -> str:
    """The whole reply to a one-message chat, as clients see it (checks exactness)."""
    seed = prompt_seed(list(f"<user>{user_message}<assistant>".encode()))
    return "".join(f"{SYNTHETIC_WORDS[synthetic_token(seed, n)]} " for n in range(max_tokens))


SYNTHETIC_THINK_TAGS = ThinkTags("<think>", "</think>")
"""The tags a synthetic engine set to reason tells thinking by (Qwen3's and DeepSeek-R1's)."""


class SyntheticEngine:
    """Deterministic text at a configured pace; no model, no accelerator."""

    kind: EngineKind = "synthetic"
    max_token_chars = 1  # a prompt is one token per UTF-8 byte, so per character at least
    held_token_ids: frozenset[int] = frozenset()

    def __init__(self, settings: AgentSettings) -> None:
        self.model = settings.served_name
        self.capacity = settings.synthetic.capacity
        self.max_model_len = settings.synthetic.max_model_len
        self._ttft_seconds = settings.synthetic.ttft_seconds
        self._tokens_per_second = settings.synthetic.tokens_per_second
        self._echo = settings.synthetic.echo
        # Its text has no thinking of its own: an echoed message's tags stand in for a model's.
        self.think_tags = SYNTHETIC_THINK_TAGS if settings.synthetic.reasoning else None
        self._running = 0
        self.prefix_cache = PrefixCacheCounts()  # zeros: it has no prefix cache

    def chat_prompt_ids(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[Tool] = (),
        template_kwargs: Mapping[str, object] | None = None,
    ) -> list[int]:
        """Bytes of a simple transcript, one id per byte (tools and kwargs are not shown to it)."""
        transcript = "".join(f"<{m.role}>{m.content}" for m in messages) + "<assistant>"
        return list(transcript.encode())

    def text_prompt_ids(self, prompt: str) -> list[int]:
        """Bytes of the prompt, one id per byte."""
        return list(prompt.encode())

    async def prompt_ids(self, frame: GenerateFrame, max_prompt_tokens: int) -> list[int]:
        """The raw prompt's or the transcript's bytes (cheap: made on the loop)."""
        if frame.messages is None:
            return self.text_prompt_ids(frame.prompt or "")
        return self.chat_prompt_ids(frame.messages, frame.tools or ())

    def tool_calls(self, tools: Sequence[Tool]) -> ToolCallReader | None:
        """None: synthetic text never holds a tool call."""
        return None

    def adapter_names(self) -> Collection[str]:
        """None: it has no weights to adapt."""
        return ()

    def known_token(self, token_id: int) -> bool:
        """A word's id, or an echoed byte's."""
        return 0 <= token_id < len(SYNTHETIC_WORDS) or 0 <= token_id - ECHO_ID_BASE < 256

    def prompt_text(self, prompt_ids: Sequence[int]) -> str:
        """The transcript's bytes as text (a prompt is one id per UTF-8 byte)."""
        return bytes(token % 256 for token in prompt_ids).decode(errors="replace")

    def decode(self, token_ids: Sequence[int]) -> str:
        """One word and a space per word token; echoed bytes as UTF-8."""
        if token_ids and token_ids[0] >= ECHO_ID_BASE:
            return bytes(token - ECHO_ID_BASE for token in token_ids).decode(errors="replace")
        return "".join(f"{SYNTHETIC_WORDS[token]} " for token in token_ids)

    def token_bytes(self, token_id: int, *, first: bool) -> bytes:
        """A word and its space, or the echoed byte itself."""
        if token_id >= ECHO_ID_BASE:
            return bytes([token_id - ECHO_ID_BASE])
        return self.decode([token_id]).encode()

    def _echo_ids(self, prompt_ids: Sequence[int]) -> list[int] | None:
        """The last user message of a chat transcript as echo token ids (None: not a chat)."""
        transcript = bytes(token for token in prompt_ids if token < 256)
        start = transcript.rfind(_USER_MARK)
        if not self._echo or start < 0 or not transcript.endswith(_ASSISTANT_MARK):
            return None
        message = transcript[start + len(_USER_MARK) : -len(_ASSISTANT_MARK)]
        return [ECHO_ID_BASE + byte for byte in message] or None

    def running(self) -> int:
        """Streams being generated now."""
        return self._running

    def failure(self) -> str | None:
        """Never: the synthetic engine lives in the agent's own process."""
        return None

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[EngineStep, None]:
        """Emit the reply's tokens on schedule: first after the TTFT, then at the set rate.

        What only a model can honour (logprobs, a schema, penalties, logit bias) is refused:
        a synthetic reply must not pass for one that honoured it.
        """
        unsupported = synthetic_unsupported(request)
        if unsupported:
            raise EngineRequestError(
                f"the synthetic engine (a capacity-test stand-in) cannot honour {unsupported}",
                param=unsupported,
            )
        loop = asyncio.get_running_loop()
        self._running += 1
        try:
            start = loop.time() + self._ttft_seconds
            yield ACCEPTED
            first = len(request.resume_ids)
            seed = prompt_seed(request.prompt_ids)
            echo = self._echo_ids(request.prompt_ids)
            limit = request.max_tokens
            if echo is not None:
                limit = min(limit, len(echo) - first)
            sent = 0
            while sent < limit:
                due = 1 + int((loop.time() - start) * self._tokens_per_second)
                due = min(limit, due)
                if due <= sent:
                    wait = start + sent / self._tokens_per_second - loop.time()
                    await asyncio.sleep(max(wait, MIN_TICK_SECONDS))
                    continue
                if echo is not None:
                    ids = echo[first + sent : first + due]
                else:
                    ids = [synthetic_token(seed, first + p) for p in range(sent, due)]
                sent = due
                if sent < limit:
                    yield EngineStep(ids, None)
                else:
                    yield EngineStep(ids, "length" if sent == request.max_tokens else "stop")
            if limit <= 0:  # a resume of an echo that was already complete
                yield EngineStep([], "stop")
        finally:
            self._running -= 1

    async def close(self) -> None:
        """Nothing to release."""


def synthetic_unsupported(request: GenerationRequest) -> str | None:
    """The first field of a request that a synthetic reply cannot honour, by its name."""
    fields = {
        "logprobs": request.logprobs is not None,
        "response_format": request.json_schema is not None,
        "presence_penalty": request.presence_penalty != 0.0,
        "frequency_penalty": request.frequency_penalty != 0.0,
        "logit_bias": bool(request.logit_bias),
        "repetition_penalty": request.repetition_penalty != 1.0,
    }
    return next((name for name, asked in fields.items() if asked), None)
