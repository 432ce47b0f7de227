"""OpenAI's replies from protocol frames, for the gateway and the agents alike.

A chat or text completion whole (`completion_body`) or as SSE chunks (`ChunkEncoder`), its
usage, logprobs and tool calls in OpenAI's shapes, and OpenAI's error object for each
protocol error code.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from spotgate.protocol import DeltaFrame, DoneFrame, ErrorCode, GenerateFrame, TokenLogprob

# HTTP status and OpenAI error type for each protocol error code.
ERROR_STATUS: dict[ErrorCode, tuple[int, str]] = {
    ErrorCode.UNAUTHORIZED: (401, "authentication_error"),
    ErrorCode.FORBIDDEN: (403, "permission_error"),
    ErrorCode.INVALID_REQUEST: (400, "invalid_request_error"),
    ErrorCode.CONTEXT_LENGTH_EXCEEDED: (400, "invalid_request_error"),
    ErrorCode.MODEL_NOT_FOUND: (404, "invalid_request_error"),
    ErrorCode.RATE_LIMITED: (429, "rate_limit_error"),
    ErrorCode.NO_CAPACITY: (503, "service_unavailable"),
    ErrorCode.TIMEOUT: (504, "timeout"),
    ErrorCode.INTERRUPTED: (503, "service_unavailable"),
    ErrorCode.GOING_AWAY: (503, "service_unavailable"),
    ErrorCode.INTERNAL: (500, "internal_error"),
}


Kind = Literal["chat", "text"]


def completion_id(kind: Kind = "chat") -> str:
    """A fresh `chatcmpl-…` (chat) or `cmpl-…` (text) id."""
    return f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"


def error_body(code: ErrorCode, message: str, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error object for a protocol error code; `param`: the field at fault."""
    _status, error_type = ERROR_STATUS[code]
    return {"error": {"message": message, "type": error_type, "param": param, "code": code.value}}


def usage_body(done: DoneFrame) -> dict[str, Any]:
    """OpenAI's usage object; a reasoning model's says how many completion tokens were thinking."""
    prompt, completion = done.usage.prompt_tokens, done.usage.completion_tokens
    body: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if done.usage.reasoning_tokens is not None:
        body["completion_tokens_details"] = {"reasoning_tokens": done.usage.reasoning_tokens}
    return body


def openai_finish_reason(done: DoneFrame) -> str:
    """OpenAI has no `cancelled`: a cancelled reply reads as stopped."""
    return "stop" if done.finish_reason == "cancelled" else done.finish_reason


def chat_logprobs(entries: list[TokenLogprob]) -> dict[str, Any]:
    """A chat choice's `logprobs`."""
    return {
        "content": [
            {
                "token": entry.token,
                "logprob": entry.logprob,
                "bytes": entry.bytes,
                "top_logprobs": [
                    {"token": top.token, "logprob": top.logprob, "bytes": top.bytes}
                    for top in entry.top_logprobs
                ],
            }
            for entry in entries
        ],
        "refusal": None,
    }


def text_logprobs(entries: list[TokenLogprob], offset: int = 0) -> dict[str, Any]:
    """A text completion choice's `logprobs`; `offset`: characters of text before these."""
    offsets = []
    for entry in entries:
        offsets.append(offset)
        offset += len(entry.token)
    return {
        "tokens": [entry.token for entry in entries],
        "token_logprobs": [entry.logprob for entry in entries],
        "top_logprobs": [
            {top.token: top.logprob for top in entry.top_logprobs} for entry in entries
        ],
        "text_offset": offsets,
    }


def completion_body(
    kind: Kind,
    cid: str,
    model: str,
    text: str,
    done: DoneFrame,
    logprobs: list[TokenLogprob] | None = None,
    forced: ForcedTools | None = None,
    reasoning: str | None = None,
    service_tier: str | None = None,
) -> dict[str, Any]:
    """A whole (non-streamed) chat or text completion; `reasoning`: the model's thinking.

    `service_tier`: the tier it got, named when the request named one.
    """
    choice: dict[str, Any] = {"index": 0, "finish_reason": openai_finish_reason(done)}
    if kind == "text":
        choice["text"] = text
        choice["logprobs"] = None if logprobs is None else text_logprobs(logprobs)
    else:
        choice["logprobs"] = None if logprobs is None else chat_logprobs(logprobs)
        calls = forced.calls(text) if forced is not None else None
        if calls is not None and forced is not None:
            choice["message"] = {"role": "assistant", "content": None, "tool_calls": calls}
            choice["finish_reason"] = forced.finish_reason(done, text)
        elif (own := own_tool_calls(done)) is not None:
            choice["message"] = {"role": "assistant", "content": text or None, "tool_calls": own}
            choice["finish_reason"] = "tool_calls"
        else:
            choice["message"] = {"role": "assistant", "content": text}
        if reasoning is not None:
            choice["message"]["reasoning_content"] = reasoning
    body = {
        "id": cid,
        "object": "chat.completion" if kind == "chat" else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": usage_body(done),
    }
    return body if service_tier is None else {**body, "service_tier": service_tier}


class ChunkEncoder:
    """The SSE events of one streamed chat or text completion.

    The fields every chunk repeats (id, object, created, model) are encoded once per
    response; a content chunk then costs one JSON encoding of its text, because the gateway
    and the agents write one for every token of every stream.
    """

    def __init__(self, kind: Kind, cid: str, model: str, service_tier: str | None = None) -> None:
        self.kind = kind
        head: dict[str, Any] = {
            "id": cid,
            "object": "chat.completion.chunk" if kind == "chat" else "text_completion",
            "created": int(time.time()),
            "model": model,
        }
        if service_tier is not None:  # the tier it got, when the request named one
            head["service_tier"] = service_tier
        self._head = b"data: " + _compact_json(head)[:-1].encode() + b',"choices":['
        self._content_open = (
            b'{"index":0,"delta":{"content":' if kind == "chat" else b'{"index":0,"text":'
        )
        self._content_close = (
            b'},"finish_reason":null}]}\n\n'
            if kind == "chat"
            else b',"logprobs":null,"finish_reason":null}]}\n\n'
        )
        self._text_offset = 0  # characters of text before the next token (text logprobs)
        self._opening = b""  # the opening chunk, held to go out with the next one

    def open(self) -> None:
        """Hold the opening chunk (chat: the assistant's role) to go out with the next chunks.

        The response's first text then costs one write, not two (one per stream saved).
        """
        if self.kind == "chat":
            self._opening = self._choice({"delta": {"role": "assistant", "content": ""}})

    def opening(self) -> bytes:
        """The held opening chunk, once: the caller sends it before its own chunks."""
        opening, self._opening = self._opening, b""
        return opening

    def delta(self, delta: DeltaFrame) -> bytes:
        """A delta's chunks: its thinking first, then its content (and logprobs), if it has any.

        The first that has any carries the held opening chunk before them.
        """
        text = shown_text(delta)
        content = self.content(text, delta.logprobs) if text or delta.logprobs else b""
        chunks = self.reasoning(delta.reasoning) + content if delta.reasoning else content
        return self.opening() + chunks if self._opening and chunks else chunks

    def content(self, text: str, logprobs: list[TokenLogprob] | None = None) -> bytes:
        """A chunk carrying generated text, and its tokens' logprobs when asked for."""
        if logprobs is None:
            return self._head + self._content_open + _json_text(text) + self._content_close
        if self.kind == "chat":
            return self._choice({"delta": {"content": text}, "logprobs": chat_logprobs(logprobs)})
        fields = {"text": text, "logprobs": text_logprobs(logprobs, self._text_offset)}
        self._text_offset += sum(len(entry.token) for entry in logprobs)
        return self._choice(fields)

    def reasoning(self, text: str) -> bytes:
        """A chunk carrying more of a reasoning model's thinking."""
        return self._choice({"delta": {"reasoning_content": text}})

    def tool_calls(self, calls: list[dict[str, Any]]) -> bytes:
        """A chunk with whole tool calls (or, named in the first, the opening of a streamed one)."""
        indexed = [{"index": index, **call} for index, call in enumerate(calls)]
        return self._choice({"delta": {"tool_calls": indexed}})

    def tool_arguments(self, text: str) -> bytes:
        """A chunk with more of the one tool call's arguments."""
        delta = {"tool_calls": [{"index": 0, "function": {"arguments": text}}]}
        return self._choice({"delta": delta})

    def finish(self, finish_reason: str) -> bytes:
        """The chunk with the finish reason and no text."""
        if self.kind == "chat":
            return self._choice({"delta": {}, "finish_reason": finish_reason})
        return self._choice({"text": "", "logprobs": None, "finish_reason": finish_reason})

    def usage(self, usage: dict[str, Any]) -> bytes:
        """The final chunk with token counts and no choices (`stream_options.include_usage`)."""
        return self._head + b'],"usage":' + _compact_json(usage).encode() + b"}\n\n"

    def _choice(self, fields: dict[str, Any]) -> bytes:
        choice = {"index": 0, **fields}
        choice.setdefault("finish_reason", None)
        return self._head + _compact_json(choice).encode() + b"]}\n\n"


def shown_text(delta: DeltaFrame) -> str:
    """What a delta adds to the reply's content (its text, less any tool-call markup)."""
    return delta.text if delta.content is None else delta.content


def own_tool_calls(done: DoneFrame) -> list[dict[str, Any]] | None:
    """The calls a model made of its own accord (`tool_choice: auto`), in OpenAI's shape."""
    return [call.model_dump() for call in done.tool_calls] if done.tool_calls else None


def tool_call_id() -> str:
    """A fresh `call_…` id for a tool call."""
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class ForcedTools:
    """How a reply that must call tools reads in OpenAI's shapes.

    The model's text is the named function's arguments, or (`required`, no name) the calls as
    vLLM writes them: `[{"name": …, "parameters": {…}}, …]`. A grammar holds it to that shape.
    """

    name: str | None
    call_id: str = field(default_factory=tool_call_id)

    @classmethod
    def of(cls, frame: GenerateFrame) -> ForcedTools | None:
        """The forced tool calls of a request, if it forces any."""
        forced = frame.forced_tools()
        if forced is None:
            return None
        return cls(forced[0].function.name if frame.tool_choice != "required" else None)

    def calls(self, text: str) -> list[dict[str, Any]] | None:
        """The tool calls in a whole reply; None if it is not whole (cut by `length`)."""
        if self.name is not None:
            return [self._call(self.call_id, self.name, text)]
        try:
            written = json.loads(text)
        except ValueError:
            return None
        return [
            self._call(
                f"{self.call_id}_{index}" if index else self.call_id,
                call["name"],
                json.dumps(call["parameters"], ensure_ascii=False),
            )
            for index, call in enumerate(written)
        ]

    @staticmethod
    def _call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
        return {
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }

    def finish_reason(self, done: DoneFrame, text: str) -> str:
        """`tool_calls` once the calls are whole; otherwise what ended the reply."""
        if done.finish_reason == "stop" and self.calls(text) is not None:
            return "tool_calls"
        return openai_finish_reason(done)


_json_text = msgspec.json.Encoder().encode
"""A string as JSON (UTF-8, escaping what JSON must): a chunk's text, one per token."""


def _compact_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def sse_event(body: dict[str, Any]) -> bytes:
    """`data: <json>` and the blank line that ends an event."""
    return b"data: " + _compact_json(body).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"
