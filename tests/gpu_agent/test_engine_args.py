"""vLLM's engine arguments: the agent's settings, then any `vllm serve` flag, checked by vLLM."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_agent.engine import EngineConfigError
from gpu_agent.engine_args import agent_flags, chat_template, engine_args
from spotgate.settings import AgentSettings, VllmSettings

HUB_MODEL = "org/tiny"
"""A Hugging Face id: engine arguments are read without a directory to look in."""


def settings(model: str = "/models/tiny", **vllm: object) -> AgentSettings:
    return AgentSettings(
        engine="vllm", model=model, served_model_name="tiny", vllm=VllmSettings(**vllm)
    )


def test_the_settings_become_the_flags_vllm_serve_takes() -> None:
    flags = agent_flags(settings(max_model_len=4096, enforce_eager=True, revision="abc123"))

    assert flags[:4] == ["--model", "/models/tiny", "--served-model-name", "tiny"]
    assert "--enforce-eager" in flags
    assert flags[flags.index("--max-model-len") + 1] == "4096"
    assert flags[flags.index("--tokenizer-revision") + 1] == "abc123"
    assert "--load-format" not in flags
    streamed = agent_flags(settings(model="s3://bucket/models/tiny"))
    assert streamed[streamed.index("--load-format") + 1] == "runai_streamer"
    assert "--enable-lora" not in flags


def test_adapters_turn_lora_on_with_one_slot_more_than_the_agent_fills() -> None:
    flags = agent_flags(settings(lora_adapters={"sql": "/a/sql"}, max_loras=2, max_lora_rank=8))

    assert "--enable-lora" in flags
    for flag, value in (("--max-loras", "3"), ("--max-cpu-loras", "3"), ("--max-lora-rank", "8")):
        assert flags[flags.index(flag) + 1] == value


@pytest.mark.vllm
def test_a_users_vllm_serve_flags_carry_over() -> None:
    given = (
        "--kv-cache-dtype fp8 --max-num-batched-tokens 8192 --enable-prefix-caching "
        """--speculative-config '{"method": "ngram", "num_speculative_tokens": 3}'"""
    )
    args = engine_args(settings(HUB_MODEL, engine_args=given, max_num_seqs=12))

    assert (args.kv_cache_dtype, args.max_num_batched_tokens) == ("fp8", 8192)
    assert args.speculative_config == {"method": "ngram", "num_speculative_tokens": 3}
    assert (args.model, args.served_model_name, args.max_num_seqs) == (HUB_MODEL, ["tiny"], 12)


@pytest.mark.vllm
@pytest.mark.parametrize(
    ("given", "message"),
    [
        (
            "--no-such-flag 1",
            "SPOTGATE_AGENT_VLLM__ENGINE_ARGS: --no-such-flag 1: not an engine argument of vLLM's",
        ),
        (
            "--max-num-batched-tokens lots",
            "SPOTGATE_AGENT_VLLM__ENGINE_ARGS: argument --max-num-batched-tokens: invalid",
        ),
        ("--quantization 'awq", "SPOTGATE_AGENT_VLLM__ENGINE_ARGS: No closing quotation"),
    ],
)
def test_an_argument_vllm_does_not_take_is_one_line_naming_it(given: str, message: str) -> None:
    with pytest.raises(EngineConfigError) as refused:
        engine_args(settings(HUB_MODEL, engine_args=given))

    assert str(refused.value).startswith(message)
    assert "\n" not in str(refused.value)


@pytest.mark.vllm
async def test_an_engine_with_a_bad_argument_stops_before_loading_anything(
    tiny_model_dir: Path,
) -> None:
    from gpu_agent.vllm_engine import VllmEngine

    with pytest.raises(EngineConfigError, match="--no-such-flag"):
        await VllmEngine.start(settings(model=str(tiny_model_dir), engine_args="--no-such-flag"))


TEMPLATE = "{% for m in messages %}[{{ m.role }}] {{ m.content }} {% endfor %}[assistant]"


@pytest.mark.parametrize(
    ("given", "model_is_here", "expected"),
    [
        (TEMPLATE, False, TEMPLATE),  # the template's text itself
        ("chat.jinja", True, TEMPLATE),  # a file in the model's directory
        ("ABSOLUTE", False, TEMPLATE),  # a file anywhere, by its absolute path
        ("chat.jinja", False, "a relative path is read in the model's directory"),
        ("missing.jinja", True, "cannot read"),
        ("{% for m in messages %}", False, "not a Jinja template"),
    ],
)
def test_a_chat_template_is_its_text_or_a_file_and_a_bad_one_is_one_line(
    tmp_path: Path, given: str, model_is_here: bool, expected: str
) -> None:
    (tmp_path / "chat.jinja").write_text(TEMPLATE)
    model = str(tmp_path) if model_is_here else "s3://bucket/models/tiny"
    value = str(tmp_path / "chat.jinja") if given == "ABSOLUTE" else given
    agent = settings(model=model, chat_template=value)

    if expected == TEMPLATE:
        assert chat_template(agent, model) == TEMPLATE
        return
    with pytest.raises(EngineConfigError) as refusal:
        chat_template(agent, model)
    assert str(refusal.value).startswith("SPOTGATE_AGENT_VLLM__CHAT_TEMPLATE: ")
    assert expected in str(refusal.value)
    assert "\n" not in str(refusal.value)


def test_a_relative_chat_template_waits_for_a_staged_models_directory(tmp_path: Path) -> None:
    agent = settings(model="s3://bucket/models/tiny", chat_template="chat.jinja")
    assert chat_template(agent, agent.model, before_load=True) is None  # not here yet
    assert chat_template(settings(), "/models/tiny") is None  # none given: the model's own


def test_a_model_path_that_holds_no_model_is_named_before_vllm_reads_it(tmp_path: Path) -> None:
    with pytest.raises(EngineConfigError) as missing:
        engine_args(settings(model=str(tmp_path / "absent")))
    assert str(missing.value) == f"SPOTGATE_AGENT_MODEL: {tmp_path / 'absent'}: no such directory"
    with pytest.raises(EngineConfigError, match="holds no model"):
        engine_args(settings(model=str(tmp_path)))
