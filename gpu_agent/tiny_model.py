"""An offline tiny Llama for tests and local mode: random weights, its own tokenizer.

Models cannot be downloaded everywhere spotgate is built, so this writes a complete Hugging
Face checkpoint from nothing: a byte-level BPE tokenizer trained on a built-in corpus, a chat
template, and a 2-layer Llama with head_dim 64 (vLLM's CPU attention kernels reject 16)
whose weights come from a fixed seed, so every build of it is the same model.
"""

from __future__ import annotations

import json
from pathlib import Path

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


def write_tiny_model(out: Path) -> Path:
    """Write the tiny Llama checkpoint (config, safetensors, tokenizer) into `out`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
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

    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
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
        json.dumps({"name": TINY_MODEL_NAME, "seed": WEIGHT_SEED, "random_weights": True})
    )
    return out
