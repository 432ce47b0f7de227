"""The `vllm serve` flags an agent sets itself are refused in its engine arguments, by name."""

from __future__ import annotations

import pytest

from spotgate.engine_flags import own_flag_refusal


@pytest.mark.parametrize(
    ("flags", "refusal"),
    [
        (["--quantization", "awq"], None),
        (["--kv-cache-dtype=fp8", "--max-num-batched-tokens", "8192"], None),
        (
            ["--max-num-seqs", "8"],
            "SPOTGATE_AGENT_VLLM__ENGINE_ARGS: --max-num-seqs is set by "
            "SPOTGATE_AGENT_VLLM__MAX_NUM_SEQS, not here",
        ),
        (
            ["--enable-prefix-caching", "--max-model-len=4096"],
            "SPOTGATE_AGENT_VLLM__ENGINE_ARGS: --max-model-len is set by "
            "SPOTGATE_AGENT_VLLM__MAX_MODEL_LEN, not here",
        ),
        (
            ["--enable-lora", "--lora-modules", "sql=/adapters/sql"],
            "SPOTGATE_AGENT_VLLM__ENGINE_ARGS: --enable-lora is set by "
            "SPOTGATE_AGENT_VLLM__LORA_ADAPTERS, not here",
        ),
        (
            ["--chat-template=tool_chat.jinja"],
            "SPOTGATE_AGENT_VLLM__ENGINE_ARGS: --chat-template is set by "
            "SPOTGATE_AGENT_VLLM__CHAT_TEMPLATE, not here",
        ),
        (
            ["--model", "other"],
            "SPOTGATE_AGENT_VLLM__ENGINE_ARGS: --model is set by SPOTGATE_AGENT_MODEL, not here",
        ),
    ],
)
def test_the_agents_own_arguments_are_settings_not_flags(
    flags: list[str], refusal: str | None
) -> None:
    assert own_flag_refusal(flags) == refusal
