"""The prompt-isolation benchmark's attack is the largest request the gateway admits."""

from __future__ import annotations

from gpu_agent.vllm_engine import max_token_chars
from loadtest.bench.prompt_isolation import ENGINE, Results, largest_legal_request, render
from spotgate.admission import GatewayConditions, Grant, gateway_refusal
from spotgate.context import ContextLimits
from spotgate.protocol import MAX_TOOLS, GenerateFrame
from spotgate.settings import SocketLimits
from tests.support.tokenizers import backend

NOW = 1_800_000_000.0


def test_the_attack_fills_the_prompt_limit_and_the_gateway_admits_it() -> None:
    limits = ContextLimits(ENGINE.max_model_len, max_token_chars(backend("qwen3")))
    max_prompt_chars = SocketLimits().max_prompt_chars
    body = largest_legal_request("m", max_prompt_chars, limits)
    frame = GenerateFrame.model_validate({"id": "a", **body})

    assert frame.prompt_chars() == max_prompt_chars
    assert len(frame.tools or ()) == MAX_TOOLS
    assert (
        gateway_refusal(frame, Grant(), GatewayConditions(False, max_prompt_chars, limits), NOW)
        is None
    )
    one_more = body["messages"][0] | {"content": "hi!"}
    longer = GenerateFrame.model_validate({"id": "b", **body, "messages": [one_more]})
    assert gateway_refusal(longer, Grant(), GatewayConditions(False, max_prompt_chars, limits), NOW)


def test_the_report_states_the_ratio_against_its_goal() -> None:
    results = Results(alone=[0.010] * 100, attacked=[0.010] * 90 + [0.030] * 10)
    results.attack_answers["400 context_length_exceeded"] = 3
    results.attack_seconds += [0.2, 0.2, 0.2]

    section = render(results, rounds=1, tokens=100, rpm=60, prompt_chars=200_000)

    assert "| alone | 100 |" in section
    assert "**over** the goal" in section
    assert "3× 400 context_length_exceeded" in section
