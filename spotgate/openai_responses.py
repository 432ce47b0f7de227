"""OpenAI's Responses API (`POST /v1/responses`), stateless: onto the wire protocol and back.

A request maps onto a `generate` frame like a chat completion does (instructions first, then
the input items: messages, function calls and their outputs), so it runs, queues and moves
between agents exactly as a chat stream. Nothing is stored (`store` is accepted and not acted
on), so `previous_response_id` is refused: send the whole conversation in `input`.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from spotgate.openai_api import ForcedTools, SamplingRequest, own_tool_calls
from spotgate.protocol import (
    MAX_TOOLS,
    ChatMessage,
    DoneFrame,
    ErrorCode,
    FunctionCall,
    FunctionDefinition,
    FunctionName,
    GenerateFrame,
    JsonSchemaFormat,
    NamedFunction,
    NamedToolChoice,
    ReasoningEffort,
    ResponseFormat,
    Tool,
    ToolCall,
    ToolCallId,
    tool_choice_problem,
)


class InputText(BaseModel):
    """A text part of an input message (`input_text`, or `output_text` of an earlier reply)."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["input_text", "output_text", "text"]
    text: str


class InputMessage(BaseModel):
    """A message of `input`."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[InputText]

    def to_chat_message(self) -> ChatMessage:
        """The turn on the wire; `developer` is `system` to the model."""
        content = self.content
        text = content if isinstance(content, str) else "".join(part.text for part in content)
        return ChatMessage(role="system" if self.role == "developer" else self.role, content=text)


class FunctionCallItem(BaseModel):
    """A function call the model made earlier, sent back as context."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["function_call"]
    call_id: ToolCallId
    name: FunctionName
    arguments: str


class FunctionCallOutputItem(BaseModel):
    """What a function call returned."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["function_call_output"]
    call_id: ToolCallId
    output: str


class ReasoningText(BaseModel):
    """A part of a reasoning item: its text (`reasoning_text`, or a `summary_text`)."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["reasoning_text", "summary_text"]
    text: str


class ReasoningItem(BaseModel):
    """A reasoning model's thinking in an earlier reply, sent back with the conversation.

    It goes to the assistant turn after it, as the chat template reads it; the template
    decides whether the model sees it again (Qwen3's keeps it within a tool loop).
    """

    model_config = ConfigDict(extra="ignore")

    type: Literal["reasoning"]
    content: list[ReasoningText] | None = None
    summary: list[ReasoningText] = []

    def text(self) -> str:
        """The thinking: its text, else its summary."""
        return "".join(part.text for part in self.content or self.summary)


InputItem = Annotated[
    InputMessage | FunctionCallItem | FunctionCallOutputItem | ReasoningItem,
    Field(union_mode="left_to_right"),
]


class ReasoningOptions(BaseModel):
    """`reasoning`: how much a reasoning model thinks.

    A summary is not made: the thinking itself comes, whole, as a reasoning item's text.
    """

    model_config = ConfigDict(extra="ignore")

    effort: ReasoningEffort | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None


class FunctionTool(BaseModel):
    """A function the model may call (the Responses API's flat shape)."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["function"]
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    def to_tool(self) -> Tool:
        """The tool on the wire."""
        definition = FunctionDefinition(
            name=self.name,
            description=self.description,
            parameters=self.parameters,
            strict=self.strict,
        )
        return Tool(function=definition)


class NamedFunctionChoice(BaseModel):
    """`tool_choice` naming a function (flat shape)."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["function"]
    name: FunctionName


class TextFormat(BaseModel):
    """`text.format`: plain text, a JSON object, or JSON matching a schema."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["text", "json_object", "json_schema"] = "text"
    name: Annotated[str, Field(min_length=1, max_length=64)] = "response"
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None

    @model_validator(mode="after")
    def _schema_when_asked(self) -> TextFormat:
        if self.type == "json_schema" and self.schema_ is None:
            raise ValueError("a 'json_schema' format needs its 'schema'")
        return self

    def to_response_format(self) -> ResponseFormat | None:
        """The same format as a chat `response_format`."""
        if self.type == "text":
            return None
        if self.type == "json_object":
            return ResponseFormat(type="json_object")
        schema = JsonSchemaFormat(name=self.name, schema_=self.schema_ or {}, strict=self.strict)
        return ResponseFormat(type="json_schema", json_schema=schema)


class TextOptions(BaseModel):
    """`text`: the reply's format."""

    model_config = ConfigDict(extra="ignore")

    format: TextFormat = TextFormat()


class ResponsesRequest(SamplingRequest):
    """`POST /v1/responses`."""

    input: str | Annotated[list[InputItem], Field(min_length=1)]
    instructions: str | None = None
    max_output_tokens: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    tools: Annotated[list[FunctionTool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextOptions | None = None
    reasoning: ReasoningOptions | None = None
    previous_response_id: str | None = None

    @model_validator(mode="after")
    def _stateless(self) -> ResponsesRequest:
        if self.previous_response_id is not None:
            raise ValueError(
                "previous_response_id: responses are not stored here; "
                "send the whole conversation in 'input'"
            )
        return self

    @model_validator(mode="after")
    def _a_conversation(self) -> ResponsesRequest:
        only_reasoning = not isinstance(self.input, str) and all(
            isinstance(item, ReasoningItem) for item in self.input
        )
        if only_reasoning and not self.instructions:
            raise ValueError("input: reasoning items alone are no conversation; add a message")
        return self

    @model_validator(mode="after")
    def _tool_choice_fits_tools(self) -> ResponsesRequest:
        problem = tool_choice_problem(self._tools(), self._tool_choice(), self._response_format())
        if problem is not None:
            raise ValueError(problem)
        return self

    def _tools(self) -> list[Tool] | None:
        return [tool.to_tool() for tool in self.tools] if self.tools else None

    def _tool_choice(self) -> Literal["none", "auto", "required"] | NamedToolChoice | None:
        choice = self.tool_choice
        if isinstance(choice, NamedFunctionChoice):
            return NamedToolChoice(function=NamedFunction(name=choice.name))
        return choice

    def _response_format(self) -> ResponseFormat | None:
        return self.text.format.to_response_format() if self.text is not None else None

    def messages(self) -> list[ChatMessage]:
        """The conversation on the wire: instructions, then the input items in order."""
        messages = (
            [ChatMessage(role="system", content=self.instructions)] if self.instructions else []
        )
        items = (
            [InputMessage(role="user", content=self.input)]
            if isinstance(self.input, str)
            else self.input
        )
        thinking: str | None = None  # a reasoning item's, for the assistant turn after it
        for item in items:
            if isinstance(item, ReasoningItem):
                thinking = item.text()
            elif isinstance(item, InputMessage):
                message = item.to_chat_message()
                if message.role == "assistant" and thinking is not None:
                    message = message.model_copy(update={"reasoning_content": thinking})
                    thinking = None
                messages.append(message)
            elif isinstance(item, FunctionCallItem):
                call = ToolCall(
                    id=item.call_id, function=FunctionCall(name=item.name, arguments=item.arguments)
                )
                messages.append(
                    ChatMessage(
                        role="assistant", content="", tool_calls=[call], reasoning_content=thinking
                    )
                )
                thinking = None
            else:
                messages.append(
                    ChatMessage(role="tool", content=item.output, tool_call_id=item.call_id)
                )
        return messages

    def to_generate_frame(self, stream_id: str, *, session: str | None = None) -> GenerateFrame:
        """The same request as a `generate` frame."""
        return self._frame(
            stream_id,
            session,
            messages=self.messages(),
            max_tokens=self.max_output_tokens,
            response_format=self._response_format(),
            tools=self._tools(),
            tool_choice=self._tool_choice(),
            parallel_tool_calls=self.parallel_tool_calls is not False,
            reasoning_effort=self.reasoning.effort if self.reasoning is not None else None,
        )


RESPONSES_FIELDS = {"messages": "input", "response_format": "text.format"}
"""The Responses API's names of `generate` frame fields that it names otherwise."""


def responses_param(param: str | None) -> str | None:
    """An error's `param` (a frame field) as the Responses API names it: `messages` → `input`."""
    if param is None:
        return None
    head = param.split(".", 1)[0]
    return RESPONSES_FIELDS.get(head, param)


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
