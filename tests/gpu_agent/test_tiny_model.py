from __future__ import annotations

import json
import shutil
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


def contents(directory: Path) -> dict[Path, bytes]:
    """Every file under `directory`, by its path there, and its bytes."""
    return {
        path.relative_to(directory): path.read_bytes()
        for path in directory.rglob("*")
        if path.is_file()
    }


def test_the_cache_key_changes_with_whatever_shapes_the_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpu_agent import tiny_model
    from gpu_agent.tiny_model import tiny_model_key

    qwen3 = tokenizer_dir("qwen3")
    renamed = shutil.copytree(qwen3, tmp_path / "renamed")  # the name is in spotgate-tiny.json
    edited = shutil.copytree(qwen3, tmp_path / "edited" / "qwen3")
    with (edited / "tokenizer_config.json").open("a") as config:
        config.write("\n")
    key = tiny_model_key(qwen3, "Hi.")
    others = [
        tiny_model_key(qwen3, "Hello."),
        tiny_model_key(qwen3),
        tiny_model_key(None, "Hi."),
        tiny_model_key(tokenizer_dir("llama3"), "Hi."),
        tiny_model_key(renamed, "Hi."),
        tiny_model_key(edited, "Hi."),
        tiny_model_key(qwen3, "Hi.", hidden_size=256),
        tiny_model_key(qwen3, "Hi.", layers=3),
    ]
    assert tiny_model_key(qwen3, "Hi.") == key
    assert len({key, *others}) == 1 + len(others)

    changed = tmp_path / "tiny_model.py"  # the module's code, changed
    changed.write_bytes(Path(tiny_model.__file__).read_bytes() + b"# taught otherwise\n")
    monkeypatch.setattr(tiny_model, "__file__", str(changed))
    assert tiny_model_key(qwen3, "Hi.") != key


def test_a_model_from_the_cache_is_byte_for_byte_the_one_written_anew(tmp_path: Path) -> None:
    from gpu_agent.tiny_model import tiny_model_key, write_tiny_model

    cache = tmp_path / "cache"
    first = write_tiny_model(tmp_path / "first", cache=cache)  # written into the cache
    again = write_tiny_model(tmp_path / "again", cache=cache)  # copied from it
    fresh = write_tiny_model(tmp_path / "fresh")

    assert contents(first) == contents(again) == contents(fresh)
    assert list(cache.iterdir()) == [cache / tiny_model_key()]  # no scratch left behind


def test_a_cache_entry_is_written_once_and_a_writer_that_loses_the_race_takes_the_winners(
    tmp_path: Path,
) -> None:
    from gpu_agent.tiny_model import cache_entry

    cache = tmp_path / "cache"

    def write(into: Path) -> None:
        (into / "model").write_text("first")

    def never(into: Path) -> None:
        raise AssertionError("the cache had it: nothing to write")

    entry = cache_entry(cache, "key", write)
    assert cache_entry(cache, "key", never) == entry == cache / "key"
    assert contents(entry) == {Path("model"): b"first"}

    def beaten(into: Path) -> None:
        (into / "model").write_text("loser")
        winner = cache / "raced"  # another process renamed its whole copy in meanwhile
        winner.mkdir()
        (winner / "model").write_text("winner")

    assert cache_entry(cache, "raced", beaten) == cache / "raced"
    assert contents(cache / "raced") == {Path("model"): b"winner"}
    assert sorted(path.name for path in cache.iterdir()) == ["key", "raced"]
