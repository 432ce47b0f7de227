"""The Responses API's streamed events end as OpenAI's do: completed, or incomplete if cut."""

from __future__ import annotations

import json
from typing import Any

import pytest

from spotgate.openai_response_writer import ResponseWriter
from spotgate.openai_responses import ResponsesRequest
from spotgate.protocol import DoneFrame, Timings, Usage


def events(stream: bytes) -> list[dict[str, Any]]:
    """The `data:` payloads of an SSE byte stream."""
    return [
        json.loads(line.removeprefix("data: "))
        for line in stream.decode().splitlines()
        if line.startswith("data: ")
    ]


@pytest.mark.parametrize(
    ("finish_reason", "last_event", "status", "details"),
    [
        ("stop", "response.completed", "completed", None),
        ("length", "response.incomplete", "incomplete", {"reason": "max_output_tokens"}),
    ],
)
def test_a_reply_ends_with_the_event_openai_sends_for_what_ended_it(
    finish_reason: str, last_event: str, status: str, details: dict[str, str] | None
) -> None:
    request = ResponsesRequest.model_validate({"model": "m", "input": "hi", "stream": True})
    writer = ResponseWriter(request, "resp_1", None)
    opening = events(writer.opening())
    writer.text.append("Hello")
    done = DoneFrame.model_validate(
        {
            "id": "s",
            "finish_reason": finish_reason,
            "usage": Usage(prompt_tokens=3, completion_tokens=2),
            "timings": Timings(queue_ms=0, ttft_ms=1, total_ms=2),
        }
    )
    closing = events(writer.closing(done))

    last = closing[-1]
    assert last["type"] == last_event
    assert (last["response"]["status"], last["response"]["incomplete_details"]) == (status, details)
    assert last["response"]["output"][0]["content"][0]["text"] == "Hello"
    numbers = [event["sequence_number"] for event in opening + closing]
    assert numbers == list(range(len(numbers)))
