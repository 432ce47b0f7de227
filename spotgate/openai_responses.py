"""OpenAI's Responses API (`POST /v1/responses`), stateless: its requests onto the wire protocol.

A request maps onto a `generate` frame like a chat completion does (instructions first, then
the input items: messages, function calls and their outputs), so it runs, queues and moves
between agents exactly as a chat stream. Nothing is stored (`store` is accepted and not acted
on), so `previous_response_id` is refused: send the whole conversation in `input`. The
reply is written from the stream's frames by `spotgate.openai_response_writer`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from spotgate.openai_api import SamplingRequest
from spotgate.protocol import (
    MAX_TOOLS,
    ChatMessage,
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
