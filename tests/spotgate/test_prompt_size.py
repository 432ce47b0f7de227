"""Everything a prompt is made from counts: turns, tool calls, tools, schemas, on every API."""

from __future__ import annotations

import json
from typing import Any

import pytest

from spotgate.admission import GatewayConditions, Grant, Refusal, gateway_refusal
from spotgate.context import ContextLimits, early_refusal, kept_prompt_chars, max_prompt_tokens
from spotgate.openai_api import ChatCompletionRequest
from spotgate.openai_responses import ResponsesRequest, responses_param
from spotgate.protocol import ErrorCode, GenerateFrame

LIMIT = 100
GATEWAY = GatewayConditions(shutting_down=False, max_prompt_chars=LIMIT, context=None)
NOW = 1_800_000_000.0
HI = [{"role": "user", "content": "hi"}]
SCHEMA_98 = {"type": "object", "description": "d" * 64}
"""A schema of 98 characters as compact JSON."""


def tool(name: str = "f", description: str | None = None, parameters: Any = None) -> dict:
    function: dict[str, Any] = {"name": name}
    if description is not None:
        function["description"] = description
    if parameters is not None:
        function["parameters"] = parameters
    return {"type": "function", "function": function}


def call(arguments: str, name: str = "f", call_id: str = "c") -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def chat(**body: Any) -> GenerateFrame:
    return ChatCompletionRequest.model_validate({"model": "m", **body}).to_generate_frame("s")


def responses(**body: Any) -> GenerateFrame:
    return ResponsesRequest.model_validate({"model": "m", **body}).to_generate_frame("s")


def test_a_schema_of_the_table_weighs_what_its_docstring_says() -> None:
    assert len(json.dumps(SCHEMA_98, separators=(",", ":"))) == 98


@pytest.mark.parametrize(
    ("frame", "fields"),
    [
        pytest.param(chat(messages=HI), {"messages": 2}, id="a-message"),
        pytest.param(
            GenerateFrame(id="s", model="m", prompt="abc"), {"prompt": 3}, id="a-raw-prompt"
        ),
        pytest.param(
            chat(messages=[{"role": "user", "content": [{"type": "text", "text": "ab"}] * 3}]),
            {"messages": 6},
            id="content-parts",
        ),
        pytest.param(
            chat(messages=[*HI, {"role": "assistant", "tool_calls": [call("{}", "get", "id7")]}]),
            {"messages": 2 + 3 + 3 + 2},
            id="tool-calls-ids-names-arguments",
        ),
        pytest.param(
            chat(messages=[*HI, {"role": "tool", "tool_call_id": "id7", "content": "sunny"}]),
            {"messages": 2 + 3 + 5},
            id="a-tool-answer-and-its-call-id",
        ),
        pytest.param(
            chat(
                messages=HI, tools=[tool("get", "weather", {"type": "object"})], tool_choice="none"
            ),
            {"messages": 2, "tools": 3 + 7 + len('{"type":"object"}')},
            id="tools-names-descriptions-schemas",
        ),
        pytest.param(
            chat(
                messages=HI,
                response_format={"type": "json_schema", "json_schema": {"schema": SCHEMA_98}},
            ),
            {"messages": 2, "response_format": 98},
            id="the-replys-schema",
        ),
        pytest.param(
            chat(messages=HI, response_format={"type": "json_object"}),
            {"messages": 2},
            id="json-object-has-no-schema",
        ),
        pytest.param(
            chat(messages=HI, tools=[tool(parameters={"d": "日本"})], tool_choice="none"),
            {"messages": 2, "tools": 1 + len('{"d":"日本"}')},
            id="non-ascii-counts-as-characters",
        ),
        pytest.param(
            responses(input="hi", instructions="be brief"), {"messages": 10}, id="responses-text"
        ),
        pytest.param(
            responses(
                input=[
                    {"type": "message", "role": "user", "content": "hi"},
                    {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                    {"type": "function_call_output", "call_id": "c", "output": "ok"},
                ]
            ),
            {"messages": 2 + (1 + 1 + 2) + (2 + 1)},
            id="responses-calls-and-outputs",
        ),
        pytest.param(
            responses(
                input="hi",
                tools=[{"type": "function", "name": "f", "description": "dd"}],
                text={"format": {"type": "json_schema", "schema": SCHEMA_98}},
            ),
            {"messages": 2, "tools": 3, "response_format": 98},
            id="responses-tools-and-format",
        ),
    ],
)
def test_every_field_the_prompt_is_made_from_counts(frame: GenerateFrame, fields: dict) -> None:
    assert frame.prompt_chars_by_field() == fields
    assert frame.prompt_chars() == sum(fields.values())


def over(chars: int, param: str, fields: str | None = None) -> Refusal:
    told = f" ({fields})" if fields else ""
    message = f"prompt of {chars} characters{told} exceeds the limit of {LIMIT}"
    return Refusal(ErrorCode.INVALID_REQUEST, message, param=param)


@pytest.mark.parametrize(
    ("frame", "param", "expected"),
    [
        # "hi" and one more thing, at the limit and one character past it
        pytest.param(
            chat(messages=HI, tools=[tool(description="d" * 97)], tool_choice="none"),
            None,
            None,
            id="tools-at-the-limit",
        ),
        pytest.param(
            chat(messages=HI, tools=[tool(description="d" * 98)], tool_choice="none"),
            "tools",
            over(101, "tools", "messages 2, tools 99"),
            id="tools-over",
        ),
        pytest.param(
            chat(messages=HI, tools=[tool(parameters=SCHEMA_98)], tool_choice="none"),
            "tools",
            over(101, "tools", "messages 2, tools 99"),
            id="a-tools-schema-over",
        ),
        pytest.param(
            chat(
                messages=HI,
                response_format={"type": "json_schema", "json_schema": {"schema": SCHEMA_98}},
            ),
            None,
            None,
            id="response-format-at-the-limit",
        ),
        pytest.param(
            chat(
                messages=[{"role": "user", "content": "hi!"}],
                response_format={"type": "json_schema", "json_schema": {"schema": SCHEMA_98}},
            ),
            "response_format",
            over(101, "response_format", "messages 3, response_format 98"),
            id="response-format-over",
        ),
        pytest.param(
            chat(messages=[*HI, {"role": "assistant", "tool_calls": [call("a" * 97)]}]),
            "messages",
            over(101, "messages"),
            id="tool-call-arguments-over",
        ),
        # the Responses API: its own names for the fields at fault
        pytest.param(
            responses(
                input=[
                    {"type": "message", "role": "user", "content": "hi"},
                    {"type": "function_call", "call_id": "c", "name": "f", "arguments": "a" * 97},
                ]
            ),
            "input",
            over(101, "messages"),
            id="responses-function-call-arguments-over",
        ),
        pytest.param(
            responses(
                input=[{"type": "function_call_output", "call_id": "c", "output": "o" * 100}]
            ),
            "input",
            over(101, "messages"),
            id="responses-function-output-over",
        ),
        pytest.param(
            responses(input="hi!", text={"format": {"type": "json_schema", "schema": SCHEMA_98}}),
            "text.format",
            over(101, "response_format", "messages 3, response_format 98"),
            id="responses-text-format-over",
        ),
        pytest.param(
            responses(
                input="hi", tools=[{"type": "function", "name": "f", "description": "d" * 98}]
            ),
            "tools",
            over(101, "tools", "messages 2, tools 99"),
            id="responses-tools-over",
        ),
    ],
)
def test_a_request_over_the_limit_by_any_field_is_refused_naming_it(
    frame: GenerateFrame, param: str | None, expected: Refusal | None
) -> None:
    refusal = gateway_refusal(frame, Grant(), GATEWAY, NOW)
    assert refusal == expected
    if refusal is not None:  # the `param` of the client's 400 (the Responses API's names)
        assert param in (refusal.param, responses_param(refusal.param))


CONTEXT = ContextLimits(max_model_len=10, max_token_chars=10)
"""At most 90 characters of a prompt fit with a reply of one token (10 tokens of 10 chars)."""


@pytest.mark.parametrize(
    ("frame", "kept"),
    [
        pytest.param(chat(messages=[{"role": "user", "content": "  hi  "}]), 2, id="user-stripped"),
        pytest.param(
            chat(messages=[{"role": "system", "content": "s" * 50}, *HI]),
            2,
            id="system-turns-may-be-moved-or-dropped",
        ),
        pytest.param(
            chat(messages=[*HI, {"role": "assistant", "content": "thinking " * 20}]),
            2,
            id="assistant-text-may-be-dropped",
        ),
        pytest.param(
            chat(messages=[*HI, {"role": "assistant", "tool_calls": [call(" {} ", "get")]}]),
            2 + 3 + 2,
            id="call-names-and-arguments",
        ),
        pytest.param(
            chat(messages=[*HI, {"role": "tool", "tool_call_id": "c", "content": " sunny "}]),
            2 + 5,
            id="tool-answers",
        ),
        pytest.param(
            chat(
                messages=HI,
                tools=[tool("get", " weather ", SCHEMA_98)],
                tool_choice="none",
            ),
            2 + 3 + 7,
            id="tool-names-and-descriptions-not-schemas",
        ),
        pytest.param(
            chat(
                messages=HI,
                response_format={"type": "json_schema", "json_schema": {"schema": SCHEMA_98}},
            ),
            2,
            id="no-template-sees-the-replys-schema",
        ),
    ],
)
def test_what_any_template_keeps(frame: GenerateFrame, kept: int) -> None:
    assert kept_prompt_chars(frame) == kept


@pytest.mark.parametrize(
    ("description_chars", "refused"),
    [(90 - 2 - 1, False), (90 - 2 - 1 + 1, True)],
    ids=["fits", "cannot-fit"],
)
def test_tools_count_toward_the_gateways_context_lower_bound(
    description_chars: int, refused: bool
) -> None:
    frame = chat(messages=HI, tools=[tool(description="d" * description_chars)], tool_choice="none")
    assert (early_refusal(frame, CONTEXT) is not None) is refused


@pytest.mark.parametrize(
    ("max_model_len", "max_tokens", "room"),
    [
        (10, None, 9),  # room for one token of reply
        (10, 4, 6),
        (10, 10, 0),  # the reply takes the whole context
        (10, 11, 0),
    ],
)
def test_the_most_prompt_tokens_that_leave_the_reply_its_room(
    max_model_len: int, max_tokens: int | None, room: int
) -> None:
    assert max_prompt_tokens(max_model_len, max_tokens) == room
