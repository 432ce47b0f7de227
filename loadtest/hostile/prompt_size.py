"""A short message beside megabytes the template or the grammar reads: refused, naming them.

Every field a prompt is made from counts toward the prompt limit: tools (descriptions and
parameter schemas), tool calls' arguments, the reply's JSON schema, and the Responses API's
input items and `text.format`. Each request here has a two-letter message and one of those
past the limit; each must be a 400 whose `param` names it, on the gateway and on an agent.
"""

from __future__ import annotations

from typing import Any

from loadtest.hostile.client import MODEL, Reply
from loadtest.hostile.report import Row
from loadtest.hostile.stack import HostileStack
from spotgate.settings import SocketLimits

OVER_CHARS = SocketLimits().max_prompt_chars + 1
TOOLS = 128
HI = [{"role": "user", "content": "hi"}]
SCHEMA_OVER = {"type": "object", "description": "d" * OVER_CHARS}
BIG_FUNCTIONS = [{"name": f"f{n}", "description": "d" * 30_000} for n in range(TOOLS)]
BIG_TOOLS = [{"type": "function", "function": function} for function in BIG_FUNCTIONS]
"""3.8 MB of tool descriptions, under the request size limit."""


def chat_cases() -> list[tuple[str, dict[str, Any], str]]:
    """(what, chat completion body, the `param` its 400 must name)."""
    arguments = {"name": "f", "arguments": "a" * OVER_CHARS}
    calls = [{"id": "c1", "type": "function", "function": arguments}]
    schema_tool = {"type": "function", "function": {"name": "f", "parameters": SCHEMA_OVER}}
    reply_format = {"type": "json_schema", "json_schema": {"name": "r", "schema": SCHEMA_OVER}}
    return [
        (
            "3.8 MB of tool descriptions",
            {"messages": HI, "tools": BIG_TOOLS, "tool_choice": "none"},
            "tools",
        ),
        (
            "a tool's parameter schema",
            {"messages": HI, "tools": [schema_tool], "tool_choice": "none"},
            "tools",
        ),
        (
            "tool call arguments",
            {"messages": [*HI, {"role": "assistant", "tool_calls": calls}]},
            "messages",
        ),
        (
            "response_format's schema",
            {"messages": HI, "response_format": reply_format},
            "response_format",
        ),
    ]


def responses_cases() -> list[tuple[str, dict[str, Any], str]]:
    """(what, Responses API body, the `param` its 400 must name)."""
    items = [
        {"type": "message", "role": "user", "content": "hi"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "a" * OVER_CHARS},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
    ]
    flat_tools = [{"type": "function", **function} for function in BIG_FUNCTIONS]
    schema = {"format": {"type": "json_schema", "name": "r", "schema": SCHEMA_OVER}}
    return [
        ("Responses: function call arguments in input", {"input": items}, "input"),
        ("Responses: 3.8 MB of tools", {"input": "hi", "tools": flat_tools}, "tools"),
        ("Responses: text.format's schema", {"input": "hi", "text": schema}, "text.format"),
    ]


async def post(stack: HostileStack, url: str, credential: str, body: dict[str, Any]) -> Reply:
    """One JSON POST with the credential, its answer."""
    headers = {"Authorization": f"Bearer {credential}"}
    async with stack.http.post(url, json={"model": MODEL, **body}, headers=headers) as reply:
        return Reply(reply.status, dict(reply.headers), await reply.read())


def judge(row: Row, what: str, reply: Reply, param: str) -> None:
    """A 400 whose `param` names the field over the limit; anything else is a problem."""
    error = reply.error
    named = error.get("param") if error is not None else None
    problem = reply.problem()
    if problem is None and (reply.status, named) != (400, param):
        problem = f"{what}: {reply.status} with param {named!r}, not a 400 naming {param!r}"
    row.record(reply.outcome() + (f" ({named})" if named else ""), problem)


async def oversized_prompts(stack: HostileStack) -> list[Row]:
    """'hi' and one field past the prompt limit, on each API of the gateway and an agent."""
    gateway_row = Row(
        "gateway",
        f"'hi' and, past the {OVER_CHARS - 1}-character prompt limit: tools, a parameter "
        "schema, tool call arguments, response_format; Responses input items, tools, "
        "text.format",
    )
    key = stack.keys["fuzz"].api_key
    for what, body, param in chat_cases():
        reply = await post(stack, f"{stack.gateway_url}/v1/chat/completions", key, body)
        judge(gateway_row, what, reply, param)
    for what, body, param in responses_cases():
        reply = await post(stack, f"{stack.gateway_url}/v1/responses", key, body)
        judge(gateway_row, what, reply, param)
    agent_row = Row(
        "agent",
        f"'hi' and, past the {OVER_CHARS - 1}-character prompt limit: tools, a parameter "
        "schema, tool call arguments, response_format",
    )
    token = await stack.token("fuzz")
    for what, body, param in chat_cases():
        reply = await post(stack, f"{stack.agent_url}/v1/chat/completions", token, body)
        judge(agent_row, what, reply, param)
    return [gateway_row, agent_row]
