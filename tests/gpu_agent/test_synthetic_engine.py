from __future__ import annotations

import pytest

from gpu_agent.engine import ACCEPTED, EngineRequestError, GenerationRequest
from gpu_agent.synthetic_engine import SyntheticEngine
from spotgate.protocol import ChatMessage
from spotgate.settings import AgentSettings, SyntheticSettings


def echo_engine() -> SyntheticEngine:
    return SyntheticEngine(
        AgentSettings(
            engine="synthetic",
            served_model_name="synth",
            synthetic=SyntheticSettings(ttft_seconds=0, tokens_per_second=10_000, echo=True),
        )
    )


async def reply(
    engine: SyntheticEngine, message: str, max_tokens: int, resume_ids: list[int] | None = None
) -> tuple[list[int], str | None]:
    prompt = engine.chat_prompt_ids(
        [ChatMessage(role="user", content="earlier"), ChatMessage(role="user", content=message)]
    )
    request = GenerationRequest("r", prompt, max_tokens, resume_ids=resume_ids or [])
    ids: list[int] = []
    finish = None
    async for step in engine.generate(request):
        ids.extend(step.token_ids)
        finish = step.finish_reason
    return ids, finish


async def test_echo_replies_with_the_last_user_message_exactly_and_resumes_mid_way() -> None:
    engine = echo_engine()
    message = "<script>alert(1)</script>\n```py\nprint('ü')\n```"

    ids, finish = await reply(engine, message, max_tokens=1000)
    head, _ = await reply(engine, message, max_tokens=10)
    tail, tail_finish = await reply(engine, message, max_tokens=1000, resume_ids=head)

    assert engine.decode(ids) == message
    assert finish == "stop"
    assert head + tail == ids
    assert tail_finish == "stop"
    assert (await reply(engine, message, max_tokens=5))[1] == "length"


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [("logprobs", 0, "logprobs"), ("json_schema", "{}", "response_format"),
     ("presence_penalty", 0.5, "presence_penalty"),
     ("frequency_penalty", -1.0, "frequency_penalty"), ("logit_bias", {3: 1.0}, "logit_bias")],
)  # fmt: skip
async def test_what_only_a_model_can_honour_is_refused_by_name(
    field: str, value: object, named: str
) -> None:
    request = GenerationRequest("r", [1, 2], 4, **{field: value})  # type: ignore[arg-type]
    with pytest.raises(EngineRequestError, match=named):
        async for _step in echo_engine().generate(request):
            pass


async def test_the_first_step_says_the_request_was_taken_before_any_token() -> None:
    engine = echo_engine()
    prompt = engine.chat_prompt_ids([ChatMessage(role="user", content="hi")])
    steps = [step async for step in engine.generate(GenerationRequest("r", prompt, 4))]

    assert steps[0] is ACCEPTED
    assert all(step.token_ids for step in steps[1:])
