"""A model's parsers and chat template are found in its files, with the evidence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spotgate.model_profile import CHAT_TEMPLATE_FILE, read_profile, serving_profile
from stack.local import TINY_REASONING_PARSER, TINY_TOOL_CALL_PARSER
from tests.support.tokenizers import tokenizer_dir


@pytest.mark.parametrize(
    ("family", "template", "tool_call_parser", "reasoning_parser"),
    [
        ("qwen3", "tokenizer_config.json", TINY_TOOL_CALL_PARSER, TINY_REASONING_PARSER),
        ("llama3", "tokenizer_config.json", None, None),  # Llama 3.0's template: no tools
        ("gemma3", "tokenizer_config.json", None, None),
        ("llama2", None, None, None),  # a base model's tokenizer: no template at all
    ],
)
def test_the_published_tokenizers_name_the_parsers_their_templates_need(
    family: str, template: str | None, tool_call_parser: str | None, reasoning_parser: str | None
) -> None:
    config = json.loads((tokenizer_dir(family) / "tokenizer_config.json").read_text())

    profile = serving_profile({}, config, None)

    assert profile.chat_template.value == template
    assert profile.tool_call_parser.value == tool_call_parser
    assert profile.reasoning_parser.value == reasoning_parser


@pytest.mark.parametrize(
    ("template", "tool_call_parser", "reasoning_parser", "evidence"),
    [
        ("{{ '<|python_tag|>' }}{{ tools }}", "llama3_json", None, "writes <|python_tag|>"),
        ("[TOOL_CALLS]{{ tools }}", "mistral", None, "writes [TOOL_CALLS]"),
        ("<think>\n{{ messages }}", None, "deepseek_r1", "no tool-call markup"),
        ("{% if enable_thinking %}<think>{% endif %}<tool_call>", "hermes", "qwen3", "<tool_call>"),
        ("{{ messages }}", None, None, "no tool-call markup"),
    ],
)
def test_a_templates_markup_names_the_parser_that_reads_it(
    template: str, tool_call_parser: str | None, reasoning_parser: str | None, evidence: str
) -> None:
    profile = serving_profile({}, {"chat_template": template}, None)

    assert profile.tool_call_parser.value == tool_call_parser
    assert profile.reasoning_parser.value == reasoning_parser
    assert evidence in profile.tool_call_parser.evidence


def test_a_template_file_wins_over_tokenizer_config_and_named_templates_use_default() -> None:
    named = {"chat_template": [{"name": "tool_use", "template": "<tool_call>"},
                               {"name": "default", "template": "[TOOL_CALLS]"}]}  # fmt: skip
    assert serving_profile({}, named, None).tool_call_parser.value == "mistral"
    from_file = serving_profile({}, named, "<tool_call>")
    assert from_file.chat_template.value == CHAT_TEMPLATE_FILE
    assert from_file.tool_call_parser.value == "hermes"


def test_a_directory_is_read_and_a_bad_one_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"no config\.json"):
        read_profile(tmp_path)
    (tmp_path / "config.json").write_text(
        '{"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",'
        ' "max_position_embeddings": 40960}'
    )
    (tmp_path / CHAT_TEMPLATE_FILE).write_text("<think><tool_call>")

    profile = read_profile(tmp_path)

    assert profile.architecture == "Qwen3ForCausalLM (qwen3)"
    assert profile.max_model_len == 40960
    assert (profile.tool_call_parser.value, profile.reasoning_parser.value) == (
        "hermes",
        "deepseek_r1",
    )
    (tmp_path / "tokenizer_config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"tokenizer_config\.json: not a JSON object"):
        read_profile(tmp_path)
