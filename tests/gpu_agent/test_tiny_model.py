from __future__ import annotations

import json
from pathlib import Path

from transformers import AutoTokenizer

from gpu_agent.tiny_model import HEAD_DIM, VOCAB_SIZE


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
