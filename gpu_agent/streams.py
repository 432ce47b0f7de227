"""One generation, from a `generate` frame to `start`, `delta`… and `done` frames.

Shared by the websocket and the OpenAI HTTP surfaces. The text of the reply is decoded from
token ids here (see `gpu_agent.detokenizer`), stop strings are applied to that text, and a
`resume` continues exactly after the tokens and the text the client already has.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass, field

from gpu_agent.detokenizer import IncrementalDetokenizer
from gpu_agent.engine import Engine, FinishReason, GenerationRequest
from spotgate.protocol import (
    DeltaFrame,
    DoneFrame,
    ErrorCode,
    GenerateFrame,
    StartFrame,
    Timings,
    Usage,
)
from spotgate.tokens import Claims


class StreamRefused(Exception):
    """The request cannot be served as asked; carries the `error` code and message to send."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(slots=True)
class StreamProgress:
    """What a running stream has produced, for drain decisions and metrics."""

    max_tokens: int
    completion_tokens: int = 0
    started_at: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None


def check_request(
    frame: GenerateFrame, engine: Engine, claims: Claims | None, max_prompt_chars: int
) -> None:
    """Refuse what this agent must not or cannot serve, before touching the engine."""
    if frame.model != engine.model:
        raise StreamRefused(
            ErrorCode.INVALID_REQUEST,
            f"model '{frame.model}' is not served here; this agent serves '{engine.model}'",
        )
    if claims is not None and not claims.allows_model(frame.model):
        raise StreamRefused(ErrorCode.FORBIDDEN, f"this key may not use model '{frame.model}'")
    if claims is not None and claims.mtk is not None and frame.max_tokens > claims.mtk:
        raise StreamRefused(
            ErrorCode.INVALID_REQUEST,
            f"max_tokens {frame.max_tokens} exceeds this key's limit of {claims.mtk}",
        )
    if frame.prompt_chars() > max_prompt_chars:
        raise StreamRefused(
            ErrorCode.INVALID_REQUEST,
            f"prompt of {frame.prompt_chars()} characters exceeds the limit of {max_prompt_chars}",
        )


def _prompt_ids(frame: GenerateFrame, engine: Engine) -> list[int]:
    if frame.messages is not None:
        return engine.chat_prompt_ids(frame.messages)
    return engine.text_prompt_ids(frame.prompt or "")


def _find_stop(text: str, stops: list[str], search_from: int) -> int | None:
    """Index in `text` where the earliest stop string starts, searching from `search_from`."""
    found = [index for stop in stops if stop and (index := text.find(stop, search_from)) >= 0]
    return min(found) if found else None


async def generate_frames(
    frame: GenerateFrame,
    engine: Engine,
    *,
    agent_id: str,
    progress: StreamProgress | None = None,
    queue_ms: float = 0.0,
) -> AsyncGenerator[StartFrame | DeltaFrame | DoneFrame, None]:
    """Run one generation and yield its frames; closing the iterator aborts it in the engine."""
    started = time.monotonic()
    progress = progress or StreamProgress(max_tokens=frame.max_tokens)
    prompt_ids = _prompt_ids(frame, engine)
    resume = frame.resume
    resumed_ids = resume.token_ids if resume else []
    sent_text = resume.text if resume else ""
    remaining = frame.max_tokens - len(resumed_ids)
    progress.completion_tokens = len(resumed_ids)
    detokenizer = IncrementalDetokenizer(engine.decode, resumed_ids, sent_text)
    stops = [stop for stop in frame.stop if stop]
    holdback = max((len(stop) for stop in stops), default=1) - 1
    sent_chars = len(sent_text)
    first_token_ms: float | None = None

    yield StartFrame(id=frame.id, agent=agent_id, engine=engine.kind)
    finish: FinishReason = "length"
    if remaining > 0:
        request = GenerationRequest(
            request_id=f"{agent_id}:{frame.id}:{time.monotonic_ns()}",
            prompt_ids=prompt_ids,
            max_tokens=remaining,
            temperature=frame.temperature,
            top_p=frame.top_p,
            seed=frame.seed,
            resume_ids=resumed_ids,
        )
        async with aclosing(engine.generate(request)) as steps:
            async for step in steps:
                if first_token_ms is None:
                    first_token_ms = (time.monotonic() - started) * 1000
                    progress.first_token_at = time.monotonic()
                detokenizer.push(step.token_ids)
                if step.finish_reason is not None:
                    detokenizer.flush()
                text = detokenizer.text
                stop_at = _find_stop(text, stops, max(0, sent_chars - holdback))
                if stop_at is not None:
                    end, finish = stop_at, "stop"
                elif step.finish_reason is not None:
                    end, finish = len(text), step.finish_reason
                else:
                    end = max(sent_chars, len(text) - holdback)
                progress.completion_tokens += len(step.token_ids)
                yield DeltaFrame(
                    id=frame.id,
                    text=text[sent_chars:end],
                    n=len(step.token_ids),
                    ids=list(step.token_ids) if frame.want_ids else None,
                )
                sent_chars = end
                if stop_at is not None or step.finish_reason is not None:
                    break
    total_ms = (time.monotonic() - started) * 1000
    yield DoneFrame(
        id=frame.id,
        finish_reason=finish,
        usage=Usage(prompt_tokens=len(prompt_ids), completion_tokens=progress.completion_tokens),
        timings=Timings(
            queue_ms=queue_ms,
            ttft_ms=first_token_ms if first_token_ms is not None else total_ms,
            total_ms=total_ms,
        ),
    )
