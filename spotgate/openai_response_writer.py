"""A Responses API reply (`POST /v1/responses`) from the frames of its stream.

The whole `response` object, or its streamed events: output items for the thinking, the
message and the tool calls, as OpenAI's API writes them.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from pydantic import BaseModel

from spotgate.openai_replies import ForcedTools, own_tool_calls
from spotgate.openai_responses import ResponsesRequest, TextOptions
from spotgate.protocol import DoneFrame, ErrorCode


def response_id() -> str:
    """A fresh `resp_…` id."""
    return f"resp_{uuid.uuid4().hex}"


class ResponseWriter:
    """A response's output items and its streamed events, from the frames of its stream.

    Text becomes one `message` item; a forced tool call, `function_call` items (a named call's
    arguments stream as they come, `required` calls arrive whole). A reasoning model's thinking
    comes first, as a `reasoning` item (its text as `reasoning_text`), as vLLM writes it.
    """

    def __init__(self, request: ResponsesRequest, rid: str, forced: ForcedTools | None) -> None:
        self.request = request
        self.id = rid
        self.forced = forced
        self.created_at = int(time.time())
        self.text: list[str] = []
        self.reasoning: list[str] | None = None  # a reasoning model's thinking
        self._sequence = 0
        self._item_id = f"{'fc' if forced else 'msg'}_{uuid.uuid4().hex}"
        self._reasoning_id = f"rs_{uuid.uuid4().hex}"
        self._thinking_open = False  # streamed: the reasoning item is open, the message not yet

    # -- whole objects --

    def body(self, status: str, done: DoneFrame | None = None) -> dict[str, Any]:
        """The `response` object, as it stands."""
        request = self.request
        incomplete = done is not None and done.finish_reason == "length"
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": "incomplete" if incomplete else status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "instructions": request.instructions,
            "max_output_tokens": request.max_output_tokens,
            "model": request.model,
            "output": self.output(done) if done is not None else [],
            "parallel_tool_calls": request.parallel_tool_calls is not False,
            "previous_response_id": None,
            "store": False,
            "temperature": request.temperature,
            "text": {"format": (request.text or TextOptions()).format.model_dump(by_alias=True)},
            "tool_choice": _dumped(request.tool_choice) or "auto",
            "tools": [tool.model_dump() for tool in request.tools or ()],
            "top_p": request.top_p,
            "metadata": {},
            "usage": _usage(done) if done is not None else None,
            **({} if request.served_tier is None else {"service_tier": request.served_tier}),
        }

    def output(self, done: DoneFrame | None) -> list[dict[str, Any]]:
        """The output items of the whole reply: its thinking, then its message or calls."""
        thinking = [] if self.reasoning is None else [self._thinking("completed")]
        return thinking + self._answer(done)

    def _answer(self, done: DoneFrame | None) -> list[dict[str, Any]]:
        text = "".join(self.text)
        status = "completed" if done is None or done.finish_reason != "length" else "incomplete"
        calls = self.forced.calls(text) if self.forced is not None else None
        if calls is None:
            own = own_tool_calls(done) if done is not None else None
            return [self._message(text, status)] + [
                self._function_call(call, status, None) for call in own or ()
            ]
        return [
            self._function_call(call, status, self._item_id if index == 0 else None)
            for index, call in enumerate(calls)
        ]

    @property
    def _answer_index(self) -> int:
        """The output index of the message (or first call): after the thinking, if any."""
        return 0 if self.reasoning is None else 1

    def _thinking(self, status: str) -> dict[str, Any]:
        text = "".join(self.reasoning or ())
        return {
            "type": "reasoning",
            "id": self._reasoning_id,
            "summary": [],
            "content": [{"type": "reasoning_text", "text": text}],
            "status": status,
        }

    def _message(self, text: str, status: str) -> dict[str, Any]:
        return {
            "type": "message",
            "id": self._item_id,
            "status": status,
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }

    @staticmethod
    def _function_call(call: dict[str, Any], status: str, item_id: str | None) -> dict[str, Any]:
        return {
            "type": "function_call",
            "id": item_id or f"fc_{call['id']}",  # the same item in every event
            "call_id": call["id"],
            "name": call["function"]["name"],
            "arguments": call["function"]["arguments"],
            "status": status,
        }

    # -- streamed events --

    def event(self, kind: str, **fields: Any) -> bytes:
        """One SSE event (`event:` line and `data:`), numbered."""
        payload = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        data = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
        return f"event: {kind}\ndata: {data}\n\n".encode()

    def opening(self, *, reasons: bool = False) -> bytes:
        """`response.created`, `response.in_progress`, and the item text or a call streams into.

        `reasons`: the model's thinking comes first, into a reasoning item.
        """
        events = [
            self.event("response.created", response=self.body("in_progress")),
            self.event("response.in_progress", response=self.body("in_progress")),
        ]
        if self.forced is None and reasons:
            self.reasoning = []
            self._thinking_open = True
            item = {**self._thinking("in_progress"), "content": []}
            events.append(self.event("response.output_item.added", output_index=0, item=item))
            events.append(self._part_event("added", self._reasoning_id, 0, _reasoning_part("")))
        elif self.forced is None:
            events.append(self._message_opening())
        elif self.forced.name is not None:
            call = {
                "id": self.forced.call_id,
                "function": {"name": self.forced.name, "arguments": ""},
            }
            item = self._function_call(call, "in_progress", self._item_id)
            events.append(self.event("response.output_item.added", output_index=0, item=item))
        return b"".join(events)

    def _message_opening(self) -> bytes:
        index = self._answer_index
        item = {**self._message("", "in_progress"), "content": []}
        added = self.event("response.output_item.added", output_index=index, item=item)
        part = {"type": "output_text", "text": "", "annotations": []}
        return added + self._part_event("added", self._item_id, index, part)

    def _part_event(self, what: str, item_id: str, index: int, part: dict[str, Any]) -> bytes:
        return self.event(
            f"response.content_part.{what}",
            item_id=item_id,
            output_index=index,
            content_index=0,
            part=part,
        )

    def _thinking_closing(self) -> bytes:
        """The reasoning item's `done` events, then the message it is followed by, opened."""
        self._thinking_open = False
        text = "".join(self.reasoning or ())
        done = self.event(
            "response.reasoning_text.done",
            item_id=self._reasoning_id,
            output_index=0,
            content_index=0,
            text=text,
        )
        part = self._part_event("done", self._reasoning_id, 0, _reasoning_part(text))
        item = self.event(
            "response.output_item.done", output_index=0, item=self._thinking("completed")
        )
        return done + part + item + self._message_opening()

    def delta(self, text: str, reasoning: str | None = None) -> bytes:
        """More of the reply: thinking, text, or a named call's arguments (`required` waits)."""
        events = b""
        if reasoning is not None:
            self.reasoning = [*(self.reasoning or ()), reasoning]
            if reasoning and self._thinking_open:
                events += self.event(
                    "response.reasoning_text.delta",
                    item_id=self._reasoning_id,
                    output_index=0,
                    content_index=0,
                    delta=reasoning,
                )
        self.text.append(text)
        if not text or (self.forced is not None and self.forced.name is None):
            return events
        if self._thinking_open:
            events += self._thinking_closing()
        if self.forced is None:
            return events + self.event(
                "response.output_text.delta",
                item_id=self._item_id,
                output_index=self._answer_index,
                content_index=0,
                delta=text,
            )
        return events + self.event(
            "response.function_call_arguments.delta",
            item_id=self._item_id,
            output_index=0,
            delta=text,
        )

    def closing(self, done: DoneFrame) -> bytes:
        """The items' `done` events and `response.completed` (`response.incomplete` if cut)."""
        first = self._answer_index
        items = self._answer(done)
        events = [self._thinking_closing()] if self._thinking_open else []
        if self.forced is None:
            text = "".join(self.text)
            part = items[0]["content"][0]
            events += [
                self.event(
                    "response.output_text.done",
                    item_id=self._item_id,
                    output_index=first,
                    content_index=0,
                    text=text,
                ),
                self._part_event("done", self._item_id, first, part),
            ]
        for index, item in enumerate(items, start=first):
            if item["type"] == "function_call":
                if index > first or self.forced is None or self.forced.name is None:
                    added = {**item, "arguments": "", "status": "in_progress"}
                    events.append(
                        self.event("response.output_item.added", output_index=index, item=added)
                    )
                events.append(
                    self.event(
                        "response.function_call_arguments.done",
                        item_id=item["id"],
                        output_index=index,
                        arguments=item["arguments"],
                    )
                )
            events.append(self.event("response.output_item.done", output_index=index, item=item))
        # As OpenAI's API ends it: a reply `max_output_tokens` cut is `response.incomplete`
        # (the SDK's stream helper then has no final response to give, as with OpenAI's).
        ending = "response.incomplete" if done.finish_reason == "length" else "response.completed"
        events.append(self.event(ending, response=self.body("completed", done)))
        return b"".join(events)

    def error(self, code: ErrorCode, message: str, param: str | None) -> bytes:
        """An `error` event: the stream failed after it began."""
        return self.event("error", code=code.value, message=message, param=param)


def _usage(done: DoneFrame) -> dict[str, Any]:
    prompt, completion = done.usage.prompt_tokens, done.usage.completion_tokens
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": done.usage.reasoning_tokens or 0},
        "total_tokens": prompt + completion,
    }


def _reasoning_part(text: str) -> dict[str, Any]:
    return {"type": "reasoning_text", "text": text}


def _dumped(value: Any) -> Any:
    return value.model_dump() if isinstance(value, BaseModel) else value
