"""OpenAI's replies from frames: streamed chunks with their logprobs, and forced tool calls."""

from __future__ import annotations

import json
from typing import Any

from spotgate.openai_replies import ChunkEncoder, ForcedTools
from spotgate.protocol import DeltaFrame, DoneFrame, Timings, TokenLogprob, TopLogprob, Usage

LOGPROBS = [
    TokenLogprob(token="Hi", logprob=-0.5, bytes=[72, 105], top_logprobs=[]),
    TokenLogprob(
        token=" you", logprob=-1.0, bytes=None,
        top_logprobs=[TopLogprob(token=" you", logprob=-1.0), TopLogprob(token="!", logprob=-2.0)],
    ),
]  # fmt: skip


def chunk_choice(event: bytes) -> Any:
    return json.loads(event.removeprefix(b"data: "))["choices"][0]


def test_a_chat_replys_role_rides_with_its_first_text_once() -> None:
    chunks = ChunkEncoder("chat", "c", "m")
    chunks.open()
    assert chunks.delta(DeltaFrame(id="s", text="", n=1)) == b""  # nothing to carry it yet
    first = chunks.delta(DeltaFrame(id="s", text="Hi", n=1))
    events = [chunk_choice(event) for event in first.split(b"\n\n") if event]
    assert [event["delta"] for event in events] == [
        {"role": "assistant", "content": ""}, {"content": "Hi"},
    ]  # fmt: skip
    assert chunk_choice(chunks.delta(DeltaFrame(id="s", text="!", n=1)))["delta"] == {
        "content": "!"
    }
    assert chunks.opening() == b""


def test_a_text_completion_has_no_opening_chunk() -> None:
    chunks = ChunkEncoder("text", "c", "m")
    chunks.open()
    assert chunks.opening() == b""


def test_chat_chunks_carry_openais_logprobs() -> None:
    chunks = ChunkEncoder("chat", "c", "m")
    choice = chunk_choice(chunks.content("Hi you", LOGPROBS))
    assert choice["delta"] == {"content": "Hi you"}
    assert [entry["token"] for entry in choice["logprobs"]["content"]] == ["Hi", " you"]
    assert choice["logprobs"]["content"][1]["top_logprobs"][1] == {
        "token": "!", "logprob": -2.0, "bytes": None,
    }  # fmt: skip


def test_text_chunks_carry_legacy_logprobs_with_offsets_across_chunks() -> None:
    chunks = ChunkEncoder("text", "c", "m")
    first = chunk_choice(chunks.content("Hi", LOGPROBS[:1]))["logprobs"]
    second = chunk_choice(chunks.content(" you", LOGPROBS[1:]))["logprobs"]
    assert first == {
        "tokens": ["Hi"], "token_logprobs": [-0.5], "top_logprobs": [{}], "text_offset": [0],
    }  # fmt: skip
    assert second["text_offset"] == [2]
    assert second["top_logprobs"] == [{" you": -1.0, "!": -2.0}]


def test_forced_tool_replies_read_as_openais_tool_calls() -> None:
    named = ForcedTools("get_weather", call_id="call_a")
    required = ForcedTools(None, call_id="call_b")
    done = DoneFrame(
        id="s",
        finish_reason="stop",
        usage=Usage(prompt_tokens=1, completion_tokens=2),
        timings=Timings(queue_ms=0, ttft_ms=0, total_ms=0),
    )
    cut = done.model_copy(update={"finish_reason": "length"})

    assert named.calls('{"city":"Oslo"}') == [
        {"id": "call_a", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}},
    ]  # fmt: skip
    two = required.calls('[{"name":"f","parameters":{"a":1}},{"name":"g","parameters":{}}]')
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in two or ()] == [
        ("call_b", "f", '{"a": 1}'),
        ("call_b_1", "g", "{}"),
    ]
    assert required.calls('[{"name":"f","para') is None
    assert required.finish_reason(done, "[]") == "tool_calls"
    assert required.finish_reason(cut, '[{"name":"f","para') == "length"
    assert named.finish_reason(cut, '{"ci') == "length"
