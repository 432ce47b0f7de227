from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from gpu_agent.tiny_model import HEAD_DIM, TOKENIZER_FILES, VOCAB_SIZE, resolve_tokenizer
from tests.support.tokenizers import tokenizer_dir


def test_tiny_model_is_a_complete_offline_llama(tiny_model_dir: Path) -> None:
    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["head_dim"] == HEAD_DIM == config["hidden_size"] // config["num_attention_heads"]
    assert config["vocab_size"] == VOCAB_SIZE
    assert (tiny_model_dir / "model.safetensors").stat().st_size > 100_000

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    text = "Hello, world! 日本語 <script>"
    assert tokenizer.decode(tokenizer.encode(text), skip_special_tokens=True) == text
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert chat == "<s><|user|>hi</s><|assistant|>"


def test_the_same_seed_gives_the_same_weights(tiny_model_dir: Path, tmp_path: Path) -> None:
    from gpu_agent.tiny_model import write_tiny_model

    again = write_tiny_model(tmp_path / "again")
    assert (again / "model.safetensors").read_bytes() == (
        tiny_model_dir / "model.safetensors"
    ).read_bytes()
    assert (again / "tokenizer.json").read_text() == (tiny_model_dir / "tokenizer.json").read_text()


def test_on_a_published_tokenizer_the_model_takes_its_files_and_vocabulary(
    llama2_model_dir: Path,
) -> None:
    published = tokenizer_dir("llama2")
    for name in TOKENIZER_FILES:  # byte for byte: the chat template (or none) is the model's
        assert (llama2_model_dir / name).read_bytes() == (published / name).read_bytes()
    config = json.loads((llama2_model_dir / "config.json").read_text())
    assert config["vocab_size"] == 32_000
    assert (config["bos_token_id"], config["eos_token_id"]) == (1, 2)
    assert json.loads((llama2_model_dir / "spotgate-tiny.json").read_text())["tokenizer"] == (
        "llama2"
    )


def test_a_tokenizer_that_is_neither_published_nor_a_file_is_named_in_the_error(
    tmp_path: Path,
) -> None:
    with pytest.raises(FileNotFoundError, match="llama2, llama3, qwen3, gemma3"):
        resolve_tokenizer(str(tmp_path / "nowhere"))


def test_a_larger_model_keeps_the_head_size_and_the_default_is_unchanged(tmp_path: Path) -> None:
    from gpu_agent.tiny_model import HIDDEN_SIZE, LAYERS, write_tiny_model

    config = json.loads(
        (write_tiny_model(tmp_path / "big", hidden_size=256, layers=3) / "config.json").read_text()
    )
    assert (config["hidden_size"], config["num_hidden_layers"]) == (256, 3)
    assert config["head_dim"] == HEAD_DIM == 256 // config["num_attention_heads"]
    assert (HIDDEN_SIZE, LAYERS) == (128, 2)  # what every existing caller builds
    with pytest.raises(ValueError, match="multiple of 64"):
        write_tiny_model(tmp_path / "odd", hidden_size=100)
