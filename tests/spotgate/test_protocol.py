from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from spotgate.protocol import (
    MAX_SEED,
    MAX_STOP_SEQUENCES,
    MAX_TOKEN_ID,
    MAX_TOP_LOGPROBS,
    MIN_LOGPROB,
    AnyFrame,
    AuthFrame,
    CancelFrame,
    ChatMessage,
    DeltaFrame,
    DoneFrame,
    ErrorCode,
    ErrorFrame,
    FrameError,
    FunctionCall,
    FunctionDefinition,
    GenerateFrame,
    JsonSchemaFormat,
    NamedFunction,
    NamedToolChoice,
    PingFrame,
    PongFrame,
    QueuedFrame,
    ResponseFormat,
    Resume,
    StartFrame,
    Timings,
    TokenLogprob,
    Tool,
    ToolCall,
    TopLogprob,
    Usage,
    client_delta,
    client_delta_json,
    encode_frame,
    parse_frame,
)

# --- examples ---------------------------------------------------------------------------------


def test_generate_with_messages_parses_with_defaults() -> None:
    frame = parse_frame(
        '{"type":"generate","id":"c1","model":"m","messages":[{"role":"user","content":"hi"}]}'
    )
    assert isinstance(frame, GenerateFrame)
    assert frame.messages == [ChatMessage(role="user", content="hi")]
    assert (frame.max_tokens, frame.temperature, frame.top_p, frame.want_ids) == (
        None,
        1.0,
        1.0,
        False,
    )
    assert frame.prompt_chars() == 2


def test_gateway_to_agent_generate_carries_resume() -> None:
    text = json.dumps(
        {
            "type": "generate",
            "id": "s",
            "model": "m",
            "prompt": "p",
            "want_ids": True,
            "resume": {"token_ids": [5, 6], "text": "ab", "completion_tokens": 2},
        }
    )
    frame = parse_frame(text)
    assert isinstance(frame, GenerateFrame)
    assert frame.resume == Resume(token_ids=[5, 6], text="ab", completion_tokens=2)


def test_server_frames_parse_when_origin_is_server() -> None:
    frame = parse_frame('{"type":"delta","id":"c1","text":"he","n":2,"ids":[1,2]}', origin="server")
    assert frame == DeltaFrame(id="c1", text="he", n=2, ids=[1, 2])


def test_encode_leaves_out_unset_optionals() -> None:
    assert json.loads(encode_frame(ErrorFrame(code=ErrorCode.INTERNAL, message="x"))) == {
        "type": "error",
        "code": "internal",
        "message": "x",
    }


@pytest.mark.parametrize(
    ("data", "reason", "stream_id"),
    [
        ("x" * 70_000, "limit", None),
        (b"\xff\xfe", "not valid JSON", None),
        ("\ud800", "UTF-8", None),
        ("[1,2]", "JSON object", None),
        ('{"id":"c1"}', "no 'type'", "c1"),
        ('{"type":"bogus","id":"c1"}', "unknown frame type", "c1"),
        ('{"type":"delta","id":"c1","text":"","n":0}', "not accepted from a client", "c1"),
        ('{"type":"generate","id":"c1","model":"m"}', "exactly one of", "c1"),
        ('{"type":"generate","id":"c1","model":"m","prompt":"p","messages":[]}', "messages", "c1"),
        ('{"type":"generate","id":"c1","model":"m","prompt":"p","max_token":5}', "max_token", "c1"),
        (
            '{"type":"generate","id":"c1","model":"m","prompt":"p","max_tokens":0}',
            "max_tokens",
            "c1",
        ),
        ('{"type":"generate","id":"c1","model":"m","prompt":"p","temperature":NaN}', "", "c1"),
        ('{"type":"cancel","id":""}', "id", None),
        ('{"type":"cancel","id":"\\ud800"}', "Invalid JSON", None),  # JSON's escape, no UTF-8
        ('{"type":"cancel","id":"' + "x" * 200 + '"}', "id", None),
        ("[" * 5000 + "]" * 5000, "", None),
    ],
)
def test_bad_frames_get_invalid_request_with_reason_and_id(
    data: str | bytes, reason: str, stream_id: str | None
) -> None:
    with pytest.raises(FrameError) as caught:
        parse_frame(data)
    error = caught.value.frame()
    assert error.code is ErrorCode.INVALID_REQUEST
    assert reason in error.message
    assert error.id == stream_id


DELTA_HEAD = '{"type":"delta","id":"a1",'


@pytest.mark.parametrize("head", [DELTA_HEAD, '{"id":"a1","type":"delta",'])
@pytest.mark.parametrize(
    ("rest", "reason", "param"),
    [
        ('"text":"x","n":-1}', "n: Expected `int` >= 0", "n"),
        ('"text":"x","n":true}', "n: Expected `int`, got `bool`", "n"),
        ('"text":"x","n":1,"ids":[1,"2"]}', "ids.1: Expected `int`", "ids.1"),
        ('"text":"x","n":1,"ids":[2147483648]}', "ids.0: Expected `int` <= 2147483647", "ids.0"),
        ('"text":"x","n":2,"ids":[1]}', "'ids' must hold exactly 'n' token ids", None),
        ('"text":"x","n":1,"logprobs":[]}', "'logprobs' must hold exactly 'n' entries", None),
        ('"text":"x","n":1,"colour":"red"}', "unknown field `colour`", None),
        (
            '"text":"x","n":1,"logprobs":[{"token":"x","logprob":0.5,"top_logprobs":[]}]}',
            "logprobs.0.logprob: Expected `float` <= 0.0",
            "logprobs.0.logprob",
        ),
        (
            '"text":"x","n":1,"logprobs":[{"token":"x","logprob":-1e999,"top_logprobs":[]}]}',
            "out of range",
            "logprobs.0.logprob",
        ),
        ('"n":1}', "missing required field `text`", None),
    ],
)
def test_a_bad_delta_from_an_agent_is_refused_naming_its_field_and_stream(
    head: str, rest: str, reason: str, param: str | None
) -> None:
    with pytest.raises(FrameError) as caught:
        parse_frame(head + rest, origin="server")

    error = caught.value.frame()
    assert (error.code, error.id, error.param) == (ErrorCode.INVALID_REQUEST, "a1", param)
    assert error.message.startswith("invalid 'delta' frame — ")
    assert reason in error.message


@pytest.mark.parametrize("data", [DELTA_HEAD + '"text":"x"', DELTA_HEAD.encode() + b"\xff}"])
def test_a_delta_that_is_not_json_is_refused_as_such(data: str | bytes) -> None:
    with pytest.raises(FrameError, match="not valid JSON"):
        parse_frame(data, origin="server")


@pytest.mark.parametrize(
    "data",
    [DELTA_HEAD + '"text":"\ud800","n":0}', DELTA_HEAD.encode() + b'"text":"\xff","n":0}'],
)
def test_a_delta_whose_text_is_not_utf8_is_refused_as_such(data: str | bytes) -> None:
    with pytest.raises(FrameError, match="not valid UTF-8") as caught:
        parse_frame(data, origin="server")
    assert caught.value.id == "a1"


def test_a_delta_read_from_text_or_bytes_or_in_another_field_order_is_the_same() -> None:
    ours = DELTA_HEAD + '"text":"é","n":1,"ids":[7],"receipt":"r"}'
    theirs = '{"n":1,"text":"é","receipt":"r","ids":[7],"id":"a1","type":"delta"}'

    frames = [parse_frame(d, origin="server") for d in (ours, ours.encode(), theirs)]

    assert frames == [DeltaFrame(id="a1", text="é", n=1, ids=[7], receipt="r")] * 3
    assert encode_frame(frames[0]) == ours


def test_a_long_delta_counts_its_bytes_against_the_limit() -> None:
    frame = DELTA_HEAD + '"text":"' + "é" * 40 + '","n":1}'  # 40 characters, 80 bytes of text
    parse_frame(frame, origin="server", max_bytes=len(frame.encode()))
    with pytest.raises(FrameError, match="exceeds") as caught:
        parse_frame(frame, origin="server", max_bytes=len(frame) + 10)
    assert caught.value.id == "a1"


def test_frame_limit_is_configurable_and_counts_bytes() -> None:
    frame = '{"type":"auth","token":"' + "é" * 40 + '"}'  # 40 chars, 80 bytes
    parse_frame(frame, max_bytes=200)
    with pytest.raises(FrameError, match="exceeds"):
        parse_frame(frame, max_bytes=len(frame) + 10)


def test_client_frame_types_are_refused_from_a_server() -> None:
    with pytest.raises(FrameError, match="not accepted from a server"):
        parse_frame('{"type":"ping"}', origin="server")


# --- properties -------------------------------------------------------------------------------

json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=20,
)
frame_types = st.sampled_from(
    ["generate", "cancel", "auth", "ping", "queued", "start", "delta", "done", "error", "pong", "x"]
)
frame_like = st.dictionaries(
    st.sampled_from(
        [
            "type",
            "id",
            "model",
            "messages",
            "prompt",
            "max_tokens",
            "token",
            "n",
            "text",
            "stop",
            "resume",
            "seed",
            "temperature",
            "code",
            "message",
            "usage",
            "timings",
        ]
    ),
    json_values,
).flatmap(lambda body: frame_types.map(lambda kind: {**body, "type": kind}))


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=2048) | st.text(max_size=2048))
def test_parse_frame_only_ever_raises_frame_error_on_arbitrary_input(data: bytes | str) -> None:
    for origin in ("client", "server"):
        try:
            parse_frame(data, origin=origin)  # type: ignore[call-overload]
        except FrameError as err:
            assert err.frame().code is ErrorCode.INVALID_REQUEST


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(document=frame_like)
def test_parse_frame_only_ever_raises_frame_error_on_frame_like_json(document: dict) -> None:
    text = json.dumps(document)
    for origin in ("client", "server"):
        try:
            frame = parse_frame(text, origin=origin)  # type: ignore[call-overload]
        except FrameError as err:
            assert err.frame().code is ErrorCode.INVALID_REQUEST
        else:
            assert frame.type == document["type"]


stream_ids = st.text(min_size=1, max_size=128)
texts = st.text(max_size=200)
counts = st.integers(min_value=0, max_value=10**9)
token_ids = st.lists(st.integers(min_value=0, max_value=MAX_TOKEN_ID), max_size=20)
finite = {"allow_nan": False, "allow_infinity": False}


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
response_formats = st.one_of(
    st.builds(ResponseFormat, type=st.sampled_from(["text", "json_object"])),
    st.builds(
        ResponseFormat,
        type=st.just("json_schema"),
        json_schema=st.builds(
            JsonSchemaFormat,
            name=st.text(min_size=1, max_size=64),
            schema=st.dictionaries(st.text(max_size=8), json_values, max_size=4),
            strict=st.none() | st.booleans(),
        ),
    ),
)
logprob_values = st.floats(min_value=MIN_LOGPROB, max_value=0, **finite)
top_logprobs = st.builds(
    TopLogprob,
    token=texts,
    logprob=logprob_values,
    bytes=st.none() | st.lists(st.integers(min_value=0, max_value=255), max_size=4),
)
token_logprobs = st.builds(
    TokenLogprob,
    token=texts,
    logprob=logprob_values,
    bytes=st.none() | st.lists(st.integers(min_value=0, max_value=255), max_size=4),
    top_logprobs=st.lists(top_logprobs, max_size=3),
)


function_names = st.text(min_size=1, max_size=64)
tools = st.builds(
    Tool,
    function=st.builds(
        FunctionDefinition,
        name=function_names,
        description=st.none() | texts,
        parameters=st.none() | st.dictionaries(st.text(max_size=8), json_values, max_size=3),
        strict=st.none() | st.booleans(),
    ),
)
tool_calls = st.builds(
    ToolCall,
    id=st.text(min_size=1, max_size=20),
    function=st.builds(FunctionCall, name=function_names, arguments=texts),
)
chat_messages = st.builds(
    ChatMessage,
    role=st.sampled_from(["system", "user", "assistant", "tool"]),
    content=texts,
    tool_calls=st.none() | st.lists(tool_calls, min_size=1, max_size=2),
    tool_call_id=st.none() | st.text(min_size=1, max_size=20),
)


@st.composite
def tool_fields(draw: st.DrawFn) -> dict[str, Any]:
    offered = draw(st.none() | st.lists(tools, min_size=1, max_size=3))
    if offered is None:
        return {"tools": None, "tool_choice": draw(st.sampled_from([None, "none"]))}
    named = NamedToolChoice(function=NamedFunction(name=offered[0].function.name))
    picked = draw(st.sampled_from(["unset", "none", "auto", "required", "named"]))
    choice = {"unset": None, "named": named}.get(picked, picked)
    return {"tools": offered, "tool_choice": choice, "parallel_tool_calls": draw(st.booleans())}


@st.composite
def generate_frames(draw: st.DrawFn) -> GenerateFrame:
    use_messages = draw(st.booleans())
    resume_ids = draw(st.none() | token_ids)
    tooling = draw(tool_fields())
    shaping = tooling["tool_choice"] == "required" or isinstance(
        tooling["tool_choice"], NamedToolChoice
    )
    return GenerateFrame(
        id=draw(stream_ids),
        model=draw(st.text(min_size=1, max_size=40)),
        messages=draw(st.lists(chat_messages, min_size=1, max_size=4)) if use_messages else None,
        prompt=None if use_messages else draw(texts),
        max_tokens=draw(st.integers(min_value=1, max_value=1_000_000)),
        temperature=draw(st.floats(min_value=0, max_value=2, **finite)),
        top_p=draw(st.floats(min_value=0, max_value=1, exclude_min=True, **finite)),
        stop=draw(st.lists(texts, max_size=MAX_STOP_SEQUENCES)),
        seed=draw(st.none() | st.integers(min_value=0, max_value=MAX_SEED)),
        presence_penalty=draw(st.floats(min_value=-2, max_value=2, **finite)),
        frequency_penalty=draw(st.floats(min_value=-2, max_value=2, **finite)),
        logit_bias=draw(
            st.none()
            | st.dictionaries(
                st.integers(min_value=0, max_value=MAX_TOKEN_ID),
                st.floats(min_value=-100, max_value=100, **finite),
                max_size=5,
            )
        ),
        logprobs=draw(st.none() | st.integers(min_value=0, max_value=MAX_TOP_LOGPROBS)),
        response_format=None if shaping else draw(st.none() | response_formats),
        **tooling,
        session=draw(st.none() | st.text(max_size=50)),
        want_ids=draw(st.booleans()),
        resume=None
        if resume_ids is None
        else Resume(token_ids=resume_ids, text=draw(texts), completion_tokens=len(resume_ids)),
    )


@st.composite
def delta_frames(draw: st.DrawFn) -> DeltaFrame:
    ids = draw(st.none() | token_ids)
    logprobs = draw(
        st.none()
        | st.lists(token_logprobs, min_size=len(ids or ()), max_size=max(4, len(ids or ())))
    )
    if ids is not None and logprobs is not None:
        logprobs = logprobs[: len(ids)]
    n = len(ids) if ids is not None else len(logprobs) if logprobs is not None else draw(counts)
    return DeltaFrame(id=draw(stream_ids), text=draw(texts), n=n, ids=ids, logprobs=logprobs)


milliseconds = st.floats(min_value=0, max_value=1e9, **finite)
client_frames = st.one_of(
    generate_frames(),
    st.builds(CancelFrame, id=stream_ids),
    st.builds(AuthFrame, token=st.text(min_size=1, max_size=500)),
    st.just(PingFrame()),
)
server_frames = st.one_of(
    st.builds(QueuedFrame, id=stream_ids, position=counts),
    st.builds(
        StartFrame,
        id=stream_ids,
        agent=texts,
        engine=st.none() | st.sampled_from(["vllm", "synthetic"]),
    ),
    delta_frames(),
    st.builds(
        DoneFrame,
        id=stream_ids,
        finish_reason=st.sampled_from(["stop", "length", "cancelled"]),
        usage=st.builds(Usage, prompt_tokens=counts, completion_tokens=counts),
        timings=st.builds(
            Timings, queue_ms=milliseconds, ttft_ms=milliseconds, total_ms=milliseconds
        ),
    ),
    st.builds(
        ErrorFrame,
        id=st.none() | stream_ids,
        code=st.sampled_from(list(ErrorCode)),
        message=texts,
        retry_after=st.none() | st.floats(min_value=0, max_value=1e6, **finite),
    ),
    st.just(PongFrame()),
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(frame=client_frames)
def test_every_valid_client_frame_round_trips(frame: AnyFrame) -> None:
    text = encode_frame(frame)
    assert parse_frame(text, max_bytes=10**7) == frame
    assert parse_frame(text.encode(), max_bytes=10**7) == frame


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(frame=server_frames)
def test_every_valid_server_frame_round_trips(frame: AnyFrame) -> None:
    assert parse_frame(encode_frame(frame), origin="server", max_bytes=10**7) == frame


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    frame=delta_frames(),
    parts=st.fixed_dictionaries(
        {"content": st.none() | texts, "reasoning": st.none() | texts, "receipt": st.none() | texts}
    ),
    stream_id=stream_ids,
    with_ids=st.booleans(),
    receipt=st.none() | texts,
)
@example(  # the agent's id within its text, quoted as JSON would quote it
    frame=DeltaFrame(id="a1", text='{"id":"a1"} "id":"a1"', n=1, ids=[7]),
    parts={"content": None, "reasoning": None, "receipt": "forged"},
    stream_id='c "1"',
    with_ids=False,
    receipt="r",
)
def test_a_clients_delta_is_the_agents_in_its_id_with_the_gateways_receipt(
    frame: DeltaFrame,
    parts: dict[str, str | None],
    stream_id: str,
    with_ids: bool,
    receipt: str | None,
) -> None:
    agent_delta = msgspec.structs.replace(frame, **parts)

    sent = client_delta_json(agent_delta, stream_id, with_ids=with_ids, receipt=receipt)

    received = parse_frame(sent, origin="server", max_bytes=10**7)
    assert received == client_delta(agent_delta, stream_id, with_ids=with_ids, receipt=receipt)
    assert isinstance(received, DeltaFrame)
    assert (received.id, received.receipt) == (stream_id, receipt)
    assert received.ids == (agent_delta.ids if with_ids else None)
    kept = ("text", "n", "logprobs", "content", "reasoning")
    assert [getattr(received, f) for f in kept] == [getattr(agent_delta, f) for f in kept]
