"""Tools, schemas and tool calls count toward the prompt limit: refused before any agent."""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from spotgate.registry import Registry
from spotgate.settings import MAX_REQUEST_BYTES, SocketLimits
from stack.emulator import AwsEmulator
from tests.gateway.conftest import MODEL, Gateway, GatewayAgentFactory

MAX_PROMPT_CHARS = SocketLimits().max_prompt_chars
TOOL_DESCRIPTION_CHARS = 30_000
TOOLS = [
    {"type": "function", "function": {"name": f"f{n}", "description": "d" * TOOL_DESCRIPTION_CHARS}}
    for n in range(128)
]
"""3.8 MB of tool descriptions: a body under the size limit, all of it for the template."""
HI_WITH_TOOLS = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "hi"}],
    "tools": TOOLS,
    "tool_choice": "none",
}
FLAT_TOOLS = [{"type": "function", **tool["function"]} for tool in TOOLS]
ARGUMENTS = "a" * (MAX_PROMPT_CHARS + 1)
RESPONSES_OVER = {
    "model": MODEL,
    "input": [
        {"type": "message", "role": "user", "content": "hi"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": ARGUMENTS},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
    ],
}
RESPONSES_SCHEMA_OVER = {
    "model": MODEL,
    "input": "hi",
    "text": {
        "format": {
            "type": "json_schema",
            "name": "big",
            "schema": {"type": "object", "description": "d" * MAX_PROMPT_CHARS},
        }
    },
}


async def post(
    http: aiohttp.ClientSession, gateway: Gateway, path: str, key: str, body: dict[str, Any]
) -> tuple[int, dict[str, Any]]:
    async with http.post(
        f"{gateway.url}{path}", headers={"Authorization": f"Bearer {key}"}, json=body
    ) as response:
        return response.status, await response.json()


async def test_hi_with_megabytes_of_tools_is_refused_before_any_agent_and_costs_no_request(
    gateway: Gateway, gateway_agent: GatewayAgentFactory, aws: AwsEmulator
) -> None:
    agent = await gateway_agent()
    async with Registry.open(aws.settings()) as registry:
        key = (await registry.create_key("one-a-minute", rpm=1)).api_key
    refused = [
        ("/v1/chat/completions", HI_WITH_TOOLS, "tools"),
        ("/v1/responses", {"model": MODEL, "input": "hi", "tools": FLAT_TOOLS}, "tools"),
        ("/v1/responses", RESPONSES_OVER, "input"),
        ("/v1/responses", RESPONSES_SCHEMA_OVER, "text.format"),
    ]
    assert len(json.dumps(HI_WITH_TOOLS)) < MAX_REQUEST_BYTES

    async with aiohttp.ClientSession() as http:
        for path, body, param in refused:  # at one request a minute: none of them is charged
            status, answer = await post(http, gateway, path, key, body)
            assert (status, answer["error"]["param"]) == (400, param), answer
            assert answer["error"]["code"] == "invalid_request"
            assert f"exceeds the limit of {MAX_PROMPT_CHARS}" in answer["error"]["message"]
        hi = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        served, _ = await post(http, gateway, "/v1/chat/completions", key, hi)
        limited, _ = await post(http, gateway, "/v1/chat/completions", key, hi)

    assert (served, limited) == (200, 429)  # the one request of the minute was the served one
    streams = agent.runtime.metrics.registry.get_sample_value(
        "spotgate_agent_streams_total", {"outcome": "completed"}
    )
    assert streams == 1  # no refused request reached the agent
