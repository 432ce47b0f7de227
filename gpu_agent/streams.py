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

from gpu_agent.detokenizer import IncrementalDetokenizer, ResumeMismatch
from gpu_agent.engine import Engine, FinishReason, GenerationRequest, PromptTooLong, TokenLogprobs
from gpu_agent.grammar import JSON_OBJECT_SCHEMA, schema_text
from gpu_agent.reasoning import (
    GENERATION_PROMPT_TOKENS,
    ReasoningTokens,
    ReplyReasoning,
)
from gpu_agent.tool_calls import ReplyContent, ToolCallReader
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
    Tool,
    ToolCall,
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


def json_schema_of(frame: GenerateFrame) -> str | None:
    """The JSON schema a reply must match, as text (None: any text).

    A named tool choice: the function's arguments. `required`: OpenAI's tool calls as vLLM
    writes them, `[{"name": …, "parameters": {…}}, …]` (one call only without parallel calls).
    """
    forced = frame.forced_tools()
    if forced is not None:
        if frame.tool_choice != "required":
            return schema_text(forced[0].function.parameters or {"type": "object"})
        calls = {
            "type": "array",
            "minItems": 1,
            "items": {"anyOf": [tool_call_schema(tool) for tool in forced]},
        }
        if not frame.parallel_tool_calls:
            calls["maxItems"] = 1
        return schema_text(calls)
    response_format = frame.response_format
    if response_format is None or response_format.type == "text":
        return None
    if response_format.json_schema is None:  # json_object
        return JSON_OBJECT_SCHEMA
    return schema_text(response_format.json_schema.schema_)


def tool_call_schema(tool: Tool) -> dict[str, object]:
    """One call of `tool` in a `required` reply."""
    return {
        "type": "object",
        "properties": {
            "name": {"type": "string", "enum": [tool.function.name]},
            "parameters": tool.function.parameters or {"type": "object"},
        },
        "required": ["name", "parameters"],
    }


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

    def candidate(token_id: int, logprob: float, first: bool) -> TopLogprob:
        written = engine.token_bytes(token_id, first=first)
        return TopLogprob(
            token=written.decode(errors="replace"),
            logprob=min(0.0, max(MIN_LOGPROB, logprob)),
            bytes=list(written),
        )

    entries = []
    for index, entry in enumerate(found):
        first = opens_reply and index == 0
        entries.append(
            TokenLogprob(
                **candidate(entry.token_id, entry.logprob, first).model_dump(),
                top_logprobs=[candidate(token, logprob, first) for token, logprob in entry.top],
            )
        )
    return entries


def _find_stop(text: str, stops: list[str]) -> int | None:
    """Index in `text` where the earliest stop string starts."""
    found = [index for stop in stops if (index := text.find(stop)) >= 0]
    return min(found) if found else None


def _last(text: str, chars: int) -> str:
    return text[max(0, len(text) - chars) :] if chars else ""


class _StopFilter:
    """Text on its way to the client, cut before the first stop string.

    Text that may be the start of a stop string is held back until what follows settles it.
    Only that much sent text is kept (a stop string may begin in it after a resume), so a
    step costs the same however long the stream is.
    """

    def __init__(self, stops: list[str], sent: str) -> None:
        self.stops = [stop for stop in stops if stop]
        self.holdback = max((len(stop) for stop in self.stops), default=1) - 1
        self._sent_tail = _last(sent, self.holdback)
        self._unsent = ""
        self.stopped = False

    def feed(self, text: str, final: bool) -> str:
        """Add decoded text; return what may go to the client now (`stopped` once cut)."""
        window = self._sent_tail + self._unsent + text
        seen = len(self._sent_tail)
        stop_at = _find_stop(window, self.stops) if self.stops else None
        if stop_at is not None:
            self.stopped = True
            end = max(seen, stop_at)
        elif final:
            end = len(window)
        else:
            end = max(seen, len(window) - self.holdback)
        out = window[seen:end]
        kept = window[:end]
        self._sent_tail = _last(kept, self.holdback)
        self._unsent = window[end:]
        return out


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


ReplyParts = tuple[str | None, str | None]
"""What a delta adds to the reply's content and to its thinking (None: not told apart)."""


class ReplyReader:
    """A reply's text told apart as it streams: thinking, content, tool-call markup.

    Thinking comes first (`gpu_agent.reasoning`); what follows it is content, in which the
    calls the model makes of its own accord are markup (`gpu_agent.tool_calls`). Both are
    pure functions of the text so far, so a reader started from a moved stream's text goes on
    exactly where the client is.
    """

    def __init__(
        self,
        reasoning: ReplyReasoning | None,
        tools: ToolCallReader | None,
        text: str,
        *,
        show_reasoning: bool,
    ) -> None:
        self._reasoning = reasoning
        self._tools = tools
        self._show_reasoning = show_reasoning
        answer = text if reasoning is None else reasoning.initial_answer
        self._content = ReplyContent(tools.markers, answer) if tools is not None else None

    @property
    def reasons(self) -> bool:
        """Whether the reply's thinking is told from its answer."""
        return self._reasoning is not None

    @property
    def splits(self) -> bool:
        """Whether deltas say what is content (else all their text is)."""
        return self._reasoning is not None or self._tools is not None

    def feed(self, text: str) -> ReplyParts:
        """What `text`, appended to the reply, adds to its content and thinking."""
        if not self.splits:
            return None, None
        if self._reasoning is None:
            return self._answer(text), None
        thinking, answer = self._reasoning.feed(text)
        return self._answer(answer), self._shown(thinking)

    def finish(self) -> tuple[ReplyParts, list[ToolCall] | None]:
        """What the whole reply still adds (held back), and the calls it made, if any."""
        thinking, answer = self._reasoning.finish() if self._reasoning is not None else ("", "")
        content = self._answer(answer) if self.splits else None
        calls = None
        if self._tools is not None and self._content is not None:
            parsed = self._tools.read(self._content.text)
            calls = parsed.calls or None
            content = (content or "") + self._content.finish(parsed.content)
        return (content, self._shown(thinking) if self._reasoning is not None else None), calls

    def _answer(self, text: str) -> str:
        return self._content.feed(text) if self._content is not None else text

    def _shown(self, thinking: str) -> str:
        return thinking if self._show_reasoning else ""


def reply_reader(
    frame: GenerateFrame,
    engine: Engine,
    prompt_ids: Sequence[int],
    sent_text: str,
    *,
    grammar: bool,
) -> ReplyReader:
    """How this stream's reply is told apart, from the text its client already has.

    The thinking is told from the answer for a model that reasons, unless the prompt already
    ended it (the template turned thinking off) or a grammar holds the reply to a shape.
    """
    tags = engine.think_tags
    reasoning = None
    if tags is not None and not grammar:
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
    or a resume whose text is not that of its ids.
    """
    started = time.monotonic()
    prompt_ids = await prompt_ids_of(frame, engine)
    caps = [cap for cap in (key_max_tokens, frame.max_tokens_cap) if cap is not None]
    try:
        budget = completion_budget(
            engine.max_model_len, len(prompt_ids), frame.max_tokens, min(caps, default=None)
        )
    except ContextExceeded as err:
        raise StreamRefused(ErrorCode.CONTEXT_LENGTH_EXCEEDED, str(err)) from err
    progress = progress or StreamProgress()
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
    remaining = budget - len(resumed_ids)
    progress.completion_tokens = len(resumed_ids)
    stop_filter = _StopFilter(frame.stop, sent_text)
    schema = json_schema_of(frame)
    reader = reply_reader(frame, engine, prompt_ids, sent_text, grammar=schema is not None)
    thinking = (
        ReasoningTokens(engine.think_tags, resumed_ids)
        if reader.reasons and engine.think_tags is not None
        else None
    )
    first_token_ms: float | None = None

    yield StartFrame(id=frame.id, agent=agent_id, engine=engine.kind, prompt_tokens=len(prompt_ids))
    finish: FinishReason = "length"
    if remaining <= 0:  # moved after its last token: only text held back is left to send
        text = stop_filter.feed(detokenizer.flush(), final=True)
        if text:
            yield _tokenless_delta(frame, text, reader.feed(text))
        finish = "stop" if stop_filter.stopped else "length"
    else:
        request = GenerationRequest(
            request_id=f"{agent_id}:{frame.id}:{time.monotonic_ns()}",
            prompt_ids=prompt_ids,
            max_tokens=remaining,
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
            json_schema=schema,
            cache_salt=cache_salt(frame.tenant) if frame.tenant is not None else None,
            adapter=frame.adapter,
        )
        async with aclosing(engine.generate(request)) as steps:
            async for step in steps:
                if first_token_ms is None:
                    first_token_ms = (time.monotonic() - started) * 1000
                    progress.first_token_at = time.monotonic()
                final = step.finish_reason is not None
                decoded = detokenizer.push(step.token_ids)
                if final:
                    decoded += detokenizer.flush()
                text = stop_filter.feed(decoded, final)
                if stop_filter.stopped:
                    finish = "stop"
                elif step.finish_reason is not None:
                    finish = step.finish_reason
                opens_reply = not resumed_ids and progress.completion_tokens == 0
                progress.completion_tokens += len(step.token_ids)
                progress.last_token_at = time.monotonic()
                if thinking is not None:
                    thinking.add(step.token_ids)
                content, reasoning = reader.feed(text)
                yield DeltaFrame(
                    id=frame.id,
                    text=text,
                    n=len(step.token_ids),
                    ids=list(step.token_ids) if frame.want_ids else None,
                    logprobs=(
                        wire_logprobs(engine, step.logprobs or (), opens_reply=opens_reply)
                        if frame.logprobs is not None
                        else None
                    ),
                    content=content,
                    reasoning=reasoning,
                )
                if stop_filter.stopped or final:
                    break
    rest, calls = reader.finish()
    if any(rest):  # held back in case it opened a call or a tag, when none came
        yield _tokenless_delta(frame, "", rest)
    total_ms = (time.monotonic() - started) * 1000
    yield DoneFrame(
        id=frame.id,
        finish_reason=finish,
        usage=Usage(
            prompt_tokens=len(prompt_ids),
            completion_tokens=progress.completion_tokens,
            # A model that reasons, told not to think this time, thought for no token.
            reasoning_tokens=(
                thinking.count if thinking is not None else 0 if engine.think_tags else None
            ),
        ),
        timings=Timings(
            queue_ms=queue_ms,
            ttft_ms=first_token_ms if first_token_ms is not None else total_ms,
            total_ms=total_ms,
        ),
        tool_calls=calls,
    )
