"""The chat request shapes OpenAI's SDK sends, as they map onto the wire protocol."""

from __future__ import annotations

import json
import typing
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types import completion_create_params as text_params
from openai.types.chat import completion_create_params as chat_params
from openai.types.responses import response_create_params as responses_params
from pydantic import ValidationError

from spotgate.openai_api import (
    NO_EFFECT_VALUES,
    ChatCompletionRequest,
    CompletionRequest,
    SamplingRequest,
    validation_message,
)
from spotgate.openai_responses import ResponsesRequest
from spotgate.protocol import (
    MAX_SEED,
    ChatMessage,
    GenerateFrame,
)


def frame_of(**fields: Any) -> Any:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    return ChatCompletionRequest.model_validate(body).to_generate_frame("s")


@pytest.mark.parametrize(
    ("message", "on_the_wire"),
    [
        ({"role": "user", "content": "plain"}, ChatMessage(role="user", content="plain")),
        (
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},  # noqa: E501
            ChatMessage(role="user", content="ab"),
        ),
        ({"role": "user", "content": []}, ChatMessage(role="user", content="")),
        ({"role": "developer", "content": "rules"}, ChatMessage(role="system", content="rules")),
        ({"role": "user", "name": "ada", "content": "hi"}, ChatMessage(role="user", content="hi")),
        ({"role": "tool", "content": "4"}, ChatMessage(role="tool", content="4")),
    ],
)  # fmt: skip
def test_a_message_reaches_the_wire_as_text(
    message: dict[str, Any], on_the_wire: ChatMessage
) -> None:
    assert frame_of(messages=[message]).messages == [on_the_wire]


TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


@pytest.mark.parametrize(
    ("fields", "where", "says"),
    [
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
         ("messages", 0, "content"), "'image_url' parts are not supported"),
        ({"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]},
         ("messages", 0, "content"), "'input_audio' parts are not supported"),
        ({"messages": [{"role": "assistant", "content": None, "tool_calls": []}]},
         ("messages", 0), "needs content"),
        ({"messages": [{"role": "assistant"}]}, ("messages", 0), "needs content"),
        ({"messages": [{"role": "tool", "tool_call_id": "c"}]}, ("messages", 0), "needs content"),
        ({"tool_choice": "required"}, (), "only with tools"),
        ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "other"}}},
         (), "'other', which is not in tools"),
        ({"tools": [TOOL], "tool_choice": "required", "response_format": {"type": "json_object"}},
         (), "cannot both shape a reply"),
        ({"n": 2}, ("n",), "Input should be 1"),
        ({"seed": 2**64}, ("seed",), "less than"),
    ],
)  # fmt: skip
def test_what_cannot_be_served_is_a_validation_error_naming_it(
    fields: dict[str, Any], where: tuple[Any, ...], says: str
) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    with pytest.raises(ValidationError) as refused:
        ChatCompletionRequest.model_validate(body)
    error = refused.value.errors()[0]
    assert error["loc"][: len(where)] == where
    assert says in error["msg"]


@pytest.mark.parametrize(
    ("seed", "on_the_wire"),
    [(None, None), (0, 0), (7, 7), (-1, MAX_SEED), (-(2**63), 0), (2**64 - 1, MAX_SEED)],
)
def test_any_64_bit_seed_maps_into_the_engines_range(
    seed: int | None, on_the_wire: int | None
) -> None:
    assert frame_of(seed=seed).seed == on_the_wire


@pytest.mark.parametrize(
    ("user", "session"),
    [(None, None), ("ada", "ada"), ("u" * 256, "u" * 256)],
)
def test_a_user_up_to_256_characters_is_the_session_as_it_is(
    user: str | None, session: str | None
) -> None:
    assert frame_of(user=user).session == session


def test_a_prompt_cache_key_is_the_session_before_the_user() -> None:
    assert frame_of(prompt_cache_key="chat-7", user="ada").session == "chat-7"


def test_vllms_sampling_fields_reach_the_wire() -> None:
    frame = frame_of(top_k=5, min_p=0.1, repetition_penalty=1.3, min_tokens=3, ignore_eos=True)
    assert (frame.top_k, frame.min_p, frame.repetition_penalty) == (5, 0.1, 1.3)
    assert (frame.min_tokens, frame.ignore_eos) == (3, True)
    assert frame_of(top_k=-1).top_k is None  # vLLM's "every token"
    assert frame_of(top_k=0).top_k is None
    with pytest.raises(ValidationError, match="min_tokens: at most max_tokens"):
        frame_of(min_tokens=9, max_tokens=8)


SDK_REQUESTS: list[tuple[type, type[SamplingRequest], dict[str, Any]]] = [
    (chat_params.CompletionCreateParamsBase, ChatCompletionRequest,
     {"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
    (text_params.CompletionCreateParamsBase, CompletionRequest, {"model": "m", "prompt": "hi"}),
    (responses_params.ResponseCreateParamsBase, ResponsesRequest, {"model": "m", "input": "hi"}),
]  # fmt: skip


@pytest.mark.parametrize(("params", "request_model", "body"), SDK_REQUESTS)
def test_every_field_of_the_sdk_is_served_taken_or_refused_by_name(
    params: type, request_model: type[SamplingRequest], body: dict[str, Any]
) -> None:
    """None silently ignored: a field the model does not declare asks for nothing or is a 400."""
    unserved = set(typing.get_type_hints(params)) - set(request_model.model_fields)
    assert unserved <= set(NO_EFFECT_VALUES), "an SDK field with no rule; give it one"
    for name in unserved:
        for value in NO_EFFECT_VALUES[name]:  # asks for nothing: taken
            request_model.model_validate({**body, name: value})
        with pytest.raises(ValidationError) as refused:
            request_model.model_validate({**body, name: {"asks": "for something"}})
        message, param = validation_message(refused.value.errors()[0])
        assert param == name
        assert message.startswith(f"{name}: ")


@pytest.mark.parametrize(
    ("field", "message"),
    [
        ("audio", "audio: the models here read and write text only"),
        (
            "functions",
            "functions: the legacy function-calling fields are not supported: send 'tools'",
        ),
        ("prediction", "prediction: not supported here"),
        ("max_token", "Unrecognized request argument supplied: max_token"),  # a typo is no default
    ],
)
def test_a_refused_field_is_named_with_why(field: str, message: str) -> None:
    with pytest.raises(ValidationError) as refused:
        frame_of(**{field: [{"x": 1}]})
    assert validation_message(refused.value.errors()[0]) == (message, field)


def test_bookkeeping_fields_are_taken_and_change_nothing() -> None:
    taken = frame_of(
        metadata={"team": "a"}, store=True, service_tier="auto", safety_identifier="u1",
        modalities=["text"], verbosity="medium", function_call="none", audio=None,
    )  # fmt: skip
    assert taken == frame_of()


@pytest.mark.parametrize(
    ("asked", "tier", "named"),
    [
        (None, None, None),
        ("auto", None, "default"),
        ("default", None, "default"),
        ("priority", None, "default"),
        ("flex", "flex", "flex"),
    ],
)
def test_a_flex_request_waits_in_the_flex_tier_and_the_reply_names_the_tier_it_got(
    asked: str | None, tier: str | None, named: str | None
) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "service_tier": asked}
    request = ChatCompletionRequest.model_validate(body)
    assert request.to_generate_frame("s", session=None).service_tier == tier
    assert request.served_tier == named
    with pytest.raises(ValidationError):
        ChatCompletionRequest.model_validate({**body, "service_tier": "cheapest"})


def test_a_longer_user_is_a_stable_hashed_session() -> None:
    first, second = frame_of(user="u" * 1000).session, frame_of(user="u" * 1000).session
    assert first == second
    assert first is not None
    assert len(first) == 64
    assert frame_of(user="v" * 1000).session != first


def test_fields_kept_for_later_are_accepted_and_max_completion_tokens_wins() -> None:
    frame = frame_of(
        metadata={"team": "search"}, store=False, parallel_tool_calls=True,
        max_tokens=50, max_completion_tokens=7,
    )  # fmt: skip
    assert frame.max_tokens == 7


TOKEN_LIMITS = st.one_of(st.none(), st.integers(min_value=-5, max_value=2_000_000))
FIELDS = {
    "temperature": st.floats(min_value=0, max_value=2),
    "top_p": st.floats(min_value=0.01, max_value=1),
    "stop": st.one_of(st.none(), st.text(max_size=5), st.lists(st.text(max_size=5), max_size=4)),
    "seed": st.one_of(st.none(), st.integers(min_value=-(2**64), max_value=2**65)),
    "n": st.sampled_from([1, 1, 1, 0, 2]),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "user": st.one_of(st.none(), st.text(max_size=400)),
    "max_tokens": TOKEN_LIMITS,
    "max_completion_tokens": TOKEN_LIMITS,
    "metadata": st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3),
    "store": st.booleans(),
    "presence_penalty": st.one_of(st.none(), st.floats(min_value=-3, max_value=3)),
    "frequency_penalty": st.one_of(st.none(), st.floats(min_value=-3, max_value=3)),
    "logit_bias": st.dictionaries(
        st.one_of(st.integers(min_value=-1, max_value=2**32).map(str), st.text(max_size=3)),
        st.floats(min_value=-150, max_value=150),
        max_size=3,
    ),
    "logprobs": st.one_of(st.none(), st.booleans()),
    "tools": st.lists(st.sampled_from([TOOL, {"type": "function", "function": {"name": "g"}}])),
    "tool_choice": st.one_of(
        st.sampled_from(["none", "auto", "required", "other"]),
        st.fixed_dictionaries(
            {
                "type": st.just("function"),
                "function": st.fixed_dictionaries({"name": st.sampled_from(["f", "g", "h"])}),
            }
        ),
    ),
    "parallel_tool_calls": st.booleans(),
    "top_logprobs": st.one_of(st.none(), st.integers(min_value=-1, max_value=25)),
    "response_format": st.one_of(
        st.fixed_dictionaries(
            {"type": st.sampled_from(["text", "json_object", "json_schema", "x"])}
        ),
        st.fixed_dictionaries(
            {
                "type": st.just("json_schema"),
                "json_schema": st.fixed_dictionaries(
                    {"name": st.text(max_size=70), "schema": st.just({"type": "object"})},
                    optional={"strict": st.booleans()},
                ),
            }
        ),
    ),
}
"""Each field the SDK sends, over values it may take and some it may not."""
PARTS = st.lists(
    st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "text", "image_url", ""])},
        optional={"text": st.one_of(st.none(), st.text(max_size=20))},
    ),
    max_size=4,
)
MESSAGES = st.lists(
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["user", "user", "system", "developer", "assistant", "x"]),
            "content": st.one_of(st.text(max_size=50), st.text(max_size=5), PARTS, st.none()),
        },
        optional={
            "name": st.text(max_size=300),
            "tool_calls": st.lists(
                st.fixed_dictionaries(
                    {
                        "id": st.text(max_size=5),
                        "type": st.just("function"),
                        "function": st.fixed_dictionaries(
                            {"name": st.text(max_size=5), "arguments": st.text(max_size=10)}
                        ),
                    }
                ),
                max_size=2,
            ),
            "tool_call_id": st.text(max_size=5),
        },
    ),
    min_size=1,
    max_size=4,
)
BODIES = st.fixed_dictionaries(
    {"model": st.text(min_size=1, max_size=300), "messages": MESSAGES}, optional=FIELDS
)


@settings(max_examples=1000)
@given(body=BODIES, session=st.one_of(st.none(), st.text(max_size=400)))
def test_a_body_that_validates_always_becomes_a_frame(
    body: dict[str, Any], session: str | None
) -> None:
    """A body is refused with a 400 or served: never valid here and refused on the wire (a 500)."""
    try:
        request = ChatCompletionRequest.model_validate(body)
    except ValidationError:
        return
    frame = request.to_generate_frame("s", session=session)
    assert frame.messages is not None
    assert len(frame.messages) == len(body["messages"])


@pytest.mark.parametrize(
    ("fields", "logprobs"),
    [({}, None), ({"logprobs": False}, None), ({"logprobs": True}, 0),
     ({"logprobs": True, "top_logprobs": 5}, 5), ({"logprobs": True, "top_logprobs": 0}, 0)],
)  # fmt: skip
def test_chat_logprobs_become_the_frames_count_of_alternatives(
    fields: dict[str, Any], logprobs: int | None
) -> None:
    assert frame_of(**fields).logprobs == logprobs


def test_sampling_fields_reach_the_frame() -> None:
    schema = {"name": "w", "schema": {"type": "object"}}
    frame = frame_of(
        presence_penalty=0.5, frequency_penalty=-1, logit_bias={"7": -100, "12": 3.5},
        response_format={"type": "json_schema", "json_schema": schema},
    )  # fmt: skip
    assert (frame.presence_penalty, frame.frequency_penalty) == (0.5, -1)
    assert frame.logit_bias == {7: -100, 12: 3.5}
    assert frame.response_format is not None
    assert frame.response_format.json_schema is not None
    assert frame.response_format.json_schema.schema_ == {"type": "object"}
    assert (
        CompletionRequest.model_validate({"model": "m", "prompt": "p", "logprobs": 3})
        .to_generate_frame("s")
        .logprobs
        == 3
    )


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"logit_bias": {"-1": 1}}, "logit_bias"),
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"logit_bias": {"1": 101}}, "logit_bias"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"response_format": {"type": "json_schema"}}, "response_format"),
        ({"response_format": {"type": "yaml"}}, "response_format"),
    ],
)
def test_bad_sampling_fields_are_refused_by_name(fields: dict[str, Any], named: str) -> None:
    with pytest.raises(ValidationError, match=named):
        frame_of(**fields)


def jsonable(value: Any) -> Any:
    """What the SDK would send for a value its types allow: iterables as arrays, the rest text."""
    if isinstance(value, dict):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, list | tuple | set | frozenset | Iterator):  # not `range(10**18)`
        return [jsonable(item) for item in value]
    return str(value)


def sdk_bodies(params: type, required: tuple[str, ...]) -> st.SearchStrategy[dict[str, Any]]:
    """Request bodies as the `openai` SDK's TypedDict for them allows, field by field.

    `st.from_type` on the whole request is far too slow; one strategy per field is not.
    """
    hints = typing.get_type_hints(params)
    fields = {name: st.from_type(hints[name]).map(jsonable) for name in hints}
    return st.fixed_dictionaries(
        {name: fields.pop(name) for name in required}, optional=fields
    ).map(lambda body: json.loads(json.dumps(body)))


@pytest.mark.parametrize(
    ("params", "required", "request_model"),
    [
        (chat_params.CompletionCreateParamsBase, ("model", "messages"), ChatCompletionRequest),
        (responses_params.ResponseCreateParamsBase, ("model", "input"), ResponsesRequest),
    ],
)
def test_any_body_the_sdks_types_allow_is_a_frame_or_a_validation_error(
    params: type, required: tuple[str, ...], request_model: Any
) -> None:
    """No client input reaches a 500: what the SDK may send is served or refused by name."""

    @settings(max_examples=300)
    @given(body=sdk_bodies(params, required))
    def served_or_refused(body: dict[str, Any]) -> None:
        try:
            request = request_model.model_validate_json(json.dumps(body))
        except ValidationError as refused:
            assert refused.errors()  # a 400 naming where
            return
        frame = request.to_generate_frame("s")
        assert GenerateFrame.model_validate_json(frame.model_dump_json(exclude_none=True))

    served_or_refused()
