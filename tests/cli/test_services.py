"""`spotgate up`: each model's serving flags, and the parsers its files name."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cli.main import build_parser, main
from spotgate.settings import PoolSettings
from stack.local import UpFailed, UpOptions, pool_models
from tests.cli.test_model import model_on


def served(tmp_path: Path, *flags: str) -> dict[str, dict[str, object]]:
    """The serving of each model `up` would run with these flags, as its pool model has it."""
    args = build_parser().parse_args(["up", *flags])
    models = pool_models(UpOptions(models=tuple(args.model)), tmp_path)
    return {
        model.name: model.serving.model_dump(include=model.serving.model_fields_set)
        for model in models
    }


def test_each_model_takes_its_own_flags_and_its_files_name_the_rest(tmp_path: Path) -> None:
    qwen3 = model_on("qwen3", tmp_path / "qwen3")
    gemma3 = model_on("gemma3", tmp_path / "gemma3")
    template = tmp_path / "tools.jinja"

    assert served(tmp_path, "--model", str(qwen3), "--model", str(gemma3)) == {
        "qwen3": {"tool_call_parser": "hermes", "reasoning_parser": "qwen3"},  # its files'
        "gemma3": {},  # its template writes no tool calls or thinking: none
    }
    flags = ["--model", str(qwen3), "--reasoning-parser", "none", "--engine-args", "--seed 7"]
    flags += ["--model", str(gemma3), "--tool-call-parser", "pythonic"]
    flags += ["--chat-template", os.path.relpath(template)]
    assert served(tmp_path, *flags) == {
        "qwen3": {
            "tool_call_parser": "hermes",
            "reasoning_parser": None,
            "engine_args": "--seed 7",
        },
        "gemma3": {"tool_call_parser": "pythonic", "chat_template": str(template)},
    }


def test_a_serving_flag_before_any_model_or_for_a_model_not_there_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["up", "--tool-call-parser", "hermes", "--model", "m"])
    assert exited.value.code == 2
    assert "--tool-call-parser: give it after the --model it is for" in capsys.readouterr().err

    synthetic = ["up", "--engine", "synthetic", "--model", "m", "--reasoning-parser", "qwen3"]
    assert main(synthetic) == 2
    assert "for --engine vllm's models only" in capsys.readouterr().err

    with pytest.raises(UpFailed, match="holds no model"):
        served(tmp_path, "--model", str(tmp_path / "absent"))


def test_a_pool_model_on_ec2_leaves_its_serving_to_its_launch_template() -> None:
    local = PoolSettings(models=[{"name": "m", "serving": {"tool_call_parser": "hermes"}}])
    assert local.models[0].serving.tool_call_parser == "hermes"
    with pytest.raises(ValueError, match="serving is its launch template's on EC2"):
        PoolSettings(
            provider="ec2", models=[{"name": "m", "serving": {"tool_call_parser": "hermes"}}]
        )
