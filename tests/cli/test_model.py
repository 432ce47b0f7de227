"""`spotgate model inspect`: how a model directory's files ask to be served."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from cli.main import main
from tests.support.tokenizers import tokenizer_dir


def model_on(tokenizer: str, out: Path) -> Path:
    """A model directory with a published tokenizer's files (no weights: none are read)."""
    shutil.copytree(tokenizer_dir(tokenizer), out)
    (out / "config.json").write_text(
        '{"architectures": ["LlamaForCausalLM"], "model_type": "llama",'
        ' "max_position_embeddings": 4096}'
    )
    return out


def test_inspect_names_the_parsers_and_template_with_their_evidence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["model", "inspect", str(model_on("qwen3", tmp_path / "qwen3"))]) == 0

    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("chat template: tokenizer_config.json (")
    assert printed[1] == "tool-call parser: hermes (the chat template writes <tool_call>)"
    assert printed[2] == (
        "reasoning parser: qwen3 (the chat template writes <think> and reads enable_thinking)"
    )
    assert printed[3] == "architecture: LlamaForCausalLM (llama); context: 4096 tokens"


def test_inspect_says_a_model_has_no_template_and_refuses_a_directory_without_a_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["model", "inspect", str(model_on("llama2", tmp_path / "llama2"))]) == 0
    assert "chat template: none (no chat template" in capsys.readouterr().out

    assert main(["model", "inspect", str(tmp_path)]) == 2
    assert (
        capsys.readouterr().err == f"spotgate model: {tmp_path} holds no model (no config.json)\n"
    )
