"""One generation, from a `generate` frame to `start`, `delta`… and `done` frames.

Shared by the websocket and the OpenAI HTTP surfaces. The text of the reply is decoded from
token ids here (see `gpu_agent.detokenizer`), stop strings are applied to that text, and a
`resume` continues exactly after the tokens and the text the client already has.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from gpu_agent.detokenizer import IncrementalDetokenizer, ResumeMismatch
from gpu_agent.engine import (
    ACCEPTED,
    Engine,
    EngineStep,
    FinishReason,
    GenerationRequest,
    PromptTooLong,
    TokenLogprobs,
)
from gpu_agent.grammar import json_schema_of
from gpu_agent.reasoning import (
    GENERATION_PROMPT_TOKENS,
    ReasoningTokens,
    ReplyReasoning,
)
from gpu_agent.reply_text import ReplyParts, ReplyReader, StopFilter
from gpu_agent.tool_calls import ToolCallReader
from spotgate.admission import agent_stream_refusal
from spotgate.context import (
    ContextExceeded,
    completion_budget,
    exceeded_message,
    max_prompt_tokens,
)
from spotgate.protocol import (
    MIN_LOGPROB,
    DeltaFrame,
    DoneFrame,
    ErrorCode,
    GenerateFrame,
    Resume,
    StartFrame,
    Timings,
    TokenLogprob,
    TopLogprob,
    Usage,
)
from spotgate.tenancy import cache_salt
from spotgate.tokens import Claims


class StreamRefused(Exception):
    """The request cannot be served as asked; carries the `error` code and message to send."""

    def __init__(self, code: ErrorCode, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param


@dataclass(slots=True)
class StreamProgress:
    """What a running stream has produced, for drain decisions and metrics."""

    max_tokens: int = 0  # the completion's budget, once the prompt is measured
    completion_tokens: int = 0
    started_at: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None
    last_token_at: float | None = None

    @property
    def last_progress(self) -> float:
        """When the engine last produced for this stream (its start, before any token)."""
        return self.last_token_at if self.last_token_at is not None else self.started_at


def check_request(
    frame: GenerateFrame, engine: Engine, claims: Claims, max_prompt_chars: int
) -> None:
    """Refuse what this agent must not or cannot serve, before touching the engine.

    Raises `StreamRefused` with `spotgate.admission.agent_stream_refusal`'s answer.
    """
    refusal = agent_stream_refusal(
        frame,
        claims.grant,
        served_model=engine.model,
        max_prompt_chars=max_prompt_chars,
        adapters=engine.adapter_names(),
    )
    if refusal is not None:
        raise StreamRefused(refusal.code, refusal.message, refusal.param)


async def prompt_ids_of(frame: GenerateFrame, engine: Engine) -> list[int]:
    """The request's prompt ids, off the event loop; refused as soon as it proves too long.

    Raises `StreamRefused` (`context_length_exceeded`) for a prompt the context cannot hold,
    found without tokenizing all of it where it is long: what that would cost is never spent.
    """
    room = max_prompt_tokens(engine.max_model_len, frame.max_tokens)
    try:
        return await engine.prompt_ids(frame, room)
    except PromptTooLong as err:
        message = exceeded_message(
            engine.max_model_len, err.at_least_tokens, frame.max_tokens, True
        )
        raise StreamRefused(ErrorCode.CONTEXT_LENGTH_EXCEEDED, message) from err


AUTO_TOOL_CHOICE_REFUSAL = (
    "tool_choice 'auto' (the default with tools) needs a tool-call parser for this model, and "
    "its agents have none (SPOTGATE_AGENT_VLLM__TOOL_CALL_PARSER); send 'required', a named "
    "function, or 'none'"
)


def tool_call_reader(frame: GenerateFrame, engine: Engine) -> ToolCallReader | None:
    """The reader of calls a reply may make of its own accord (tools offered, `auto`).

    Raises `StreamRefused` when the request needs one and the engine has none.
    """
    if not frame.tools or frame.tool_choice not in (None, "auto"):
        return None
    reader = engine.tool_calls(frame.tools)
    if reader is None:
        raise StreamRefused(ErrorCode.INVALID_REQUEST, AUTO_TOOL_CHOICE_REFUSAL, "tool_choice")
    return reader


def wire_logprobs(
    engine: Engine, found: Sequence[TokenLogprobs], *, opens_reply: bool
) -> list[TokenLogprob]:
    """Engine logprobs as OpenAI's: each token's text, its own bytes, its alternatives.

    A token's bytes are what it adds to the reply (part of a character, for some), so a
    client joining them gets the reply's UTF-8; its text is those bytes read as UTF-8.
    `opens_reply`: the first entry is the reply's first token.
    """

    def candidate(token_id: int, logprob: float, first: bool) -> dict[str, Any]:
        written = engine.token_bytes(token_id, first=first)
        return {
            "token": written.decode(errors="replace"),
            "logprob": min(0.0, max(MIN_LOGPROB, logprob)),
            "bytes": list(written),
        }

    entries = []
    for index, entry in enumerate(found):
        first = opens_reply and index == 0
        entries.append(
            TokenLogprob(
                **candidate(entry.token_id, entry.logprob, first),
                top_logprobs=[TopLogprob(**candidate(t, p, first)) for t, p in entry.top],
            )
        )
    return entries


def _tokenless_delta(frame: GenerateFrame, text: str, parts: ReplyParts) -> DeltaFrame:
    """Text that was held back, sent with no token of its own."""
    content, reasoning = parts
    return DeltaFrame(
        id=frame.id,
        text=text,
        n=0,
        ids=[] if frame.want_ids else None,
        logprobs=[] if frame.logprobs is not None else None,
        content=content,
        reasoning=reasoning,
    )


def reply_reader(
    frame: GenerateFrame,
    engine: Engine,
    prompt_ids: Sequence[int],
    sent_text: str,
    *,
    grammar: bool,
) -> ReplyReader:
    """How this stream's reply is told apart, from the text its client already has.

    The thinking is told from the answer for a chat with a model that reasons, unless the
    prompt already ended it (the template turned thinking off) or a grammar holds the reply to
    a shape. A raw prompt's reply (a text completion) is the model's whole output, thinking
    and all, as `vllm serve` gives it: the legacy endpoint has no field for thinking.
    """
    tags = engine.think_tags
    reasoning = None
    if tags is not None and not grammar and frame.messages is not None:
        tail = engine.prompt_text(prompt_ids[-GENERATION_PROMPT_TOKENS:])
        if not tags.closed_in_prompt(tail):
            reasoning = ReplyReasoning(tags, sent_text)
    reader = ReplyReader(
        reasoning,
        tool_call_reader(frame, engine),
        sent_text,
        show_reasoning=frame.include_reasoning,
    )
    return reader


def _check_resume(resume: Resume, engine: Engine, budget: int) -> None:
    """Refuse a resume this stream could not have produced (a client may send one)."""
    unknown = next((i for i in resume.token_ids if not engine.known_token(i)), None)
    if unknown is not None:
        raise StreamRefused(
            ErrorCode.INVALID_REQUEST, f"{unknown} is not a token id of this model", "resume"
        )
    if len(resume.token_ids) > budget:
        raise StreamRefused(
            ErrorCode.INVALID_REQUEST,
            f"resume holds {len(resume.token_ids)} tokens, more than the {budget} "
            "this stream may have",
            "resume",
        )


def stream_budget(
    frame: GenerateFrame, engine: Engine, prompt_tokens: int, key_max_tokens: int | None
) -> int:
    """The most tokens the stream's reply may have: its own limit within the context and caps.

    Raises `StreamRefused` (`context_length_exceeded`) when the context leaves it none.
    """
    caps = [cap for cap in (key_max_tokens, frame.max_tokens_cap) if cap is not None]
    try:
        return completion_budget(
            engine.max_model_len, prompt_tokens, frame.max_tokens, min(caps, default=None)
        )
    except ContextExceeded as err:
        raise StreamRefused(ErrorCode.CONTEXT_LENGTH_EXCEEDED, str(err)) from err


@dataclass(slots=True)
class _Generation:
    """One stream under way: turns the engine's steps into its `delta` frames and its `done`."""

    frame: GenerateFrame
    engine: Engine
    prompt_ids: list[int]
    budget: int
    progress: StreamProgress
    started: float
    detokenizer: IncrementalDetokenizer
    stop_filter: StopFilter
    schema: str | None
    reader: ReplyReader
    thinking: ReasoningTokens | None
    finish: FinishReason = "length"
    first_token_ms: float | None = None

    @classmethod
    def open(
        cls,
        frame: GenerateFrame,
        engine: Engine,
        prompt_ids: list[int],
        budget: int,
        progress: StreamProgress,
        started: float,
    ) -> _Generation:
        """The stream's state, after the tokens and the text of its `resume`, if any.

        Raises `StreamRefused` for a resume it could not have produced, or whose text is not
        that of its ids.
        """
        progress.max_tokens = budget
        resume = frame.resume
        if resume is not None:
            _check_resume(resume, engine, budget)
        resumed_ids = resume.token_ids if resume else []
        sent_text = resume.text if resume else ""
        try:
            detokenizer = IncrementalDetokenizer(
                engine.decode, resumed_ids, sent_text, held_ids=engine.held_token_ids
            )
        except ResumeMismatch as err:
            raise StreamRefused(ErrorCode.INVALID_REQUEST, str(err)) from err
        progress.completion_tokens = len(resumed_ids)
        stop_filter = StopFilter(frame.stop, sent_text)
        schema = json_schema_of(frame)
        reader = reply_reader(frame, engine, prompt_ids, sent_text, grammar=schema is not None)
        thinking = (
            ReasoningTokens(engine.think_tags, resumed_ids)
            if reader.reasons and engine.think_tags is not None
            else None
        )
        return cls(
            frame=frame,
            engine=engine,
            prompt_ids=prompt_ids,
            budget=budget,
            progress=progress,
            started=started,
            detokenizer=detokenizer,
            stop_filter=stop_filter,
            schema=schema,
            reader=reader,
            thinking=thinking,
        )

    @property
    def resumed_ids(self) -> list[int]:
        """The ids the client already has."""
        return self.frame.resume.token_ids if self.frame.resume else []

    @property
    def remaining(self) -> int:
        """How many tokens the engine may still generate."""
        return self.budget - len(self.resumed_ids)

    def request(self, agent_id: str) -> GenerationRequest:
        """What the engine is asked for: the frame's sampling, after the ids the client holds."""
        frame, resumed_ids = self.frame, self.resumed_ids
        return GenerationRequest(
            request_id=f"{agent_id}:{frame.id}:{time.monotonic_ns()}",
            prompt_ids=self.prompt_ids,
            max_tokens=self.remaining,
            temperature=frame.temperature,
            top_p=frame.top_p,
            seed=frame.seed,
            resume_ids=resumed_ids,
            presence_penalty=frame.presence_penalty,
            frequency_penalty=frame.frequency_penalty,
            logit_bias=frame.logit_bias,
            top_k=frame.top_k,
            min_p=frame.min_p,
            # vLLM's counts the prompt's tokens too, so the resumed ones count as they did.
            repetition_penalty=frame.repetition_penalty,
            min_tokens=max(0, frame.min_tokens - len(resumed_ids)),
            ignore_eos=frame.ignore_eos,
            logprobs=frame.logprobs,
            json_schema=self.schema,
            cache_salt=cache_salt(frame.tenant) if frame.tenant is not None else None,
            adapter=frame.adapter,
            tenant=frame.tenant,
        )

    def held_back(self) -> DeltaFrame | None:
        """A stream moved after its last token: only the text held back is left to send."""
        text = self.stop_filter.feed(self.detokenizer.flush(), final=True)
        self.finish = "stop" if self.stop_filter.stopped else "length"
        return _tokenless_delta(self.frame, text, self.reader.feed(text)) if text else None

    def delta(self, step: EngineStep) -> DeltaFrame:
        """The `delta` of one engine step; `finish` says what ended the reply, once it ends."""
        frame, progress = self.frame, self.progress
        if self.first_token_ms is None:
            self.first_token_ms = (time.monotonic() - self.started) * 1000
            progress.first_token_at = time.monotonic()
        final = step.finish_reason is not None
        decoded = self.detokenizer.push(step.token_ids)
        if final:
            decoded += self.detokenizer.flush()
        text = self.stop_filter.feed(decoded, final)
        if self.stop_filter.stopped:
            self.finish = "stop"
        elif step.finish_reason is not None:
            self.finish = step.finish_reason
        opens_reply = not self.resumed_ids and progress.completion_tokens == 0
        progress.completion_tokens += len(step.token_ids)
        progress.last_token_at = time.monotonic()
        if self.thinking is not None:
            self.thinking.add(step.token_ids)
        content, reasoning = self.reader.feed(text)
        return DeltaFrame(
            id=frame.id,
            text=text,
            n=len(step.token_ids),
            ids=list(step.token_ids) if frame.want_ids else None,
            logprobs=(
                wire_logprobs(self.engine, step.logprobs or (), opens_reply=opens_reply)
                if frame.logprobs is not None
                else None
            ),
            content=content,
            reasoning=reasoning,
        )

    def ended(self, step: EngineStep) -> bool:
        """Whether the reply ends with this step (a stop string, or the engine finished)."""
        return self.stop_filter.stopped or step.finish_reason is not None

    def ending(self, queue_ms: float) -> list[DeltaFrame | DoneFrame]:
        """The stream's last frames: text held back in case it opened a call, then `done`."""
        frames: list[DeltaFrame | DoneFrame] = []
        rest, calls = self.reader.finish()
        if any(rest):  # held back in case it opened a call or a tag, when none came
            frames.append(_tokenless_delta(self.frame, "", rest))
        total_ms = (time.monotonic() - self.started) * 1000
        thinking, think_tags = self.thinking, self.engine.think_tags
        frames.append(
            DoneFrame(
                id=self.frame.id,
                finish_reason=self.finish,
                usage=Usage(
                    prompt_tokens=len(self.prompt_ids),
                    completion_tokens=self.progress.completion_tokens,
                    # A model that reasons, told not to think this time, thought for no token;
                    # a raw prompt's reply is not told apart at all.
                    reasoning_tokens=(
                        thinking.count
                        if thinking is not None
                        else 0
                        if think_tags and self.frame.messages is not None
                        else None
                    ),
                ),
                timings=Timings(
                    queue_ms=queue_ms,
                    ttft_ms=self.first_token_ms if self.first_token_ms is not None else total_ms,
                    total_ms=total_ms,
                ),
                tool_calls=calls,
            )
        )
        return frames


async def generate_frames(
    frame: GenerateFrame,
    engine: Engine,
    *,
    agent_id: str,
    progress: StreamProgress | None = None,
    queue_ms: float = 0.0,
    key_max_tokens: int | None = None,
) -> AsyncGenerator[StartFrame | DeltaFrame | DoneFrame, None]:
    """Run one generation and yield its frames; closing the iterator aborts it in the engine.

    Raises `StreamRefused` (before any frame) for a request the model's context cannot hold
    or a resume whose text is not that of its ids; the engine's own refusals come before
    `start` too, so a gateway may answer them as an HTTP error.
    """
    started = time.monotonic()
    prompt_ids = await prompt_ids_of(frame, engine)
    budget = stream_budget(frame, engine, len(prompt_ids), key_max_tokens)
    stream = _Generation.open(
        frame, engine, prompt_ids, budget, progress or StreamProgress(), started
    )
    start = StartFrame(
        id=frame.id, agent=agent_id, engine=engine.kind, prompt_tokens=len(prompt_ids)
    )
    if stream.remaining <= 0:
        yield start
        held = stream.held_back()
        if held is not None:
            yield held
    else:
        async with aclosing(engine.generate(stream.request(agent_id))) as steps:
            # The first step comes once the engine has taken the request (`ACCEPTED`, or its
            # first tokens): one it refuses is refused before the stream starts.
            step = await anext(steps, None)
            yield start
            while step is not None:
                if step is not ACCEPTED:
                    yield stream.delta(step)
                    if stream.ended(step):
                        break
                step = await anext(steps, None)
    for last in stream.ending(queue_ms):
        yield last
