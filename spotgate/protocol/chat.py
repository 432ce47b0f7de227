"""What a chat request holds beside its sampling: turns, tools, and the reply's format."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

from pydantic import ConfigDict, Field, StringConstraints, model_validator

from spotgate.protocol.fields import (
    MAX_TOOLS,
    FunctionName,
    ToolCallId,
    WireModel,
    json_chars,
)


class FunctionCall(WireModel):
    """A function the model called: its name and its arguments as JSON text."""

    name: FunctionName
    arguments: str


class ToolCall(WireModel):
    """One tool call of an assistant turn (OpenAI's shape)."""

    id: ToolCallId
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(WireModel):
    """One chat turn: an assistant's may carry its tool calls, a tool's the call it answers."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str
    tool_calls: Annotated[list[ToolCall], Field(min_length=1, max_length=MAX_TOOLS)] | None = None
    tool_call_id: ToolCallId | None = None
    # An assistant turn's thinking, as a reasoning model wrote it: its chat template decides
    # whether the model sees it again (Qwen3's keeps it only in the turns of a tool loop).
    reasoning_content: str | None = None

    def chars(self) -> int:
        """Characters of the turn's text: content, reasoning, tool calls' ids, names, arguments."""
        calls = sum(
            len(call.id) + len(call.function.name) + len(call.function.arguments)
            for call in self.tool_calls or ()
        )
        reasoning = len(self.reasoning_content or "")
        return len(self.content) + len(self.tool_call_id or "") + calls + reasoning


class FunctionDefinition(WireModel):
    """A function the model may call; `parameters` is the JSON schema of its arguments."""

    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    def chars(self) -> int:
        """Characters of its name, its description and its parameters' schema (as JSON)."""
        schema = json_chars(self.parameters) if self.parameters is not None else 0
        return len(self.name) + len(self.description or "") + schema


class Tool(WireModel):
    """A tool offered to the model (OpenAI's shape; functions only)."""

    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(WireModel):
    """The function `tool_choice` names."""

    name: FunctionName


class NamedToolChoice(WireModel):
    """`tool_choice` naming the one function the model must call."""

    type: Literal["function"] = "function"
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class JsonSchemaFormat(WireModel):
    """`response_format.json_schema`: the schema the reply must match."""

    model_config = ConfigDict(serialize_by_alias=True, validate_by_name=True)

    name: Annotated[str, StringConstraints(min_length=1, max_length=64)] = "response"
    description: str | None = None
    # `schema` would shadow pydantic's own attribute of that name
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None


class ResponseFormat(WireModel):
    """OpenAI's `response_format`: plain text, any JSON object, or JSON matching a schema."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_when_asked(self) -> Self:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("'json_schema' is given exactly when type is 'json_schema'")
        return self


def tool_choice_problem(
    tools: list[Tool] | None, choice: ToolChoice | None, response_format: ResponseFormat | None
) -> str | None:
    """What is wrong with a request's `tool_choice`, given its tools and `response_format`."""
    names = {tool.function.name for tool in tools or ()}
    if choice not in (None, "none") and not names:
        return "tool_choice: only with tools"
    if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
        return f"tool_choice names '{choice.function.name}', which is not in tools"
    forced = choice == "required" or isinstance(choice, NamedToolChoice)
    if forced and response_format is not None and response_format.type != "text":
        return "tool_choice: a forced tool call and response_format cannot both shape a reply"
    return None
