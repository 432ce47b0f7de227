from __future__ import annotations

from gpu_agent.engine import GenerationRequest
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
