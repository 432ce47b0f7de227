"""The agent renders a chat with the model's own template, from its `tokenizer_config.json`."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpu_agent.engine import NoChatTemplate
from gpu_agent.engine_args import chat_template
from gpu_agent.tiny_model import save_tokenizer
from gpu_agent.vllm_engine import VllmEngine
from spotgate.protocol import ChatMessage
from spotgate.settings import AgentSettings, VllmSettings
from tests.support.tokenizers import auto_tokenizer, tokenizer_dir

CONVERSATION = [
    ChatMessage(role="system", content="You answer briefly."),
    ChatMessage(role="user", content="  What is a spot instance?  "),
    ChatMessage(role="assistant", content="Spare capacity, sold cheap."),
    ChatMessage(role="user", content="And when AWS takes it back? 日本語"),
]
# Text of each template that only that model's own template writes.
TEMPLATE_MARKS = {
    "llama3": "<|start_header_id|>assistant<|end_header_id|>\n\n",
    "qwen3": "<|im_start|>assistant\n",
    "gemma3": "<start_of_turn>model\n",
}


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], VllmEngine]:
    """The engine's prompt side (no generation here) on a family's model directory, as
    `spotgate model tiny` writes it less the weights: `save_tokenizer` writes the directory and
    loads it back as the agent does. Once for the module, and only for the families a worker's
    tests ask for: Gemma3's takes seconds to load."""
    llm: Any = None

    @functools.cache
    def engine(family: str) -> VllmEngine:
        tokenizer = save_tokenizer(tmp_path_factory.mktemp(family), tokenizer_dir(family))
        return VllmEngine(llm, tokenizer, "tiny", capacity=1, max_model_len=2048)

    return engine


@pytest.mark.parametrize("family", sorted(TEMPLATE_MARKS))
def test_the_agent_renders_what_apply_chat_template_renders(
    family: str, engines: Callable[[str], VllmEngine]
) -> None:
    published = auto_tokenizer(family)
    expected = published.apply_chat_template(
        [message.model_dump() for message in CONVERSATION],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )

    rendered = engines(family).chat_prompt_ids(CONVERSATION)

    assert rendered == list(expected)
    assert published.decode(rendered).endswith(TEMPLATE_MARKS[family])


def test_a_model_without_a_chat_template_refuses_chats(
    engines: Callable[[str], VllmEngine],
) -> None:
    engine = engines("llama2")
    with pytest.raises(NoChatTemplate, match="no chat template"):
        engine.chat_prompt_ids(CONVERSATION)
    assert engine.text_prompt_ids("Hello")[0] == 1  # raw prompts work: <s> Hello


@pytest.mark.parametrize(
    ("family", "chars"), [("llama2", 16), ("llama3", 128), ("qwen3", 4 * 128), ("gemma3", 31)]
)
def test_max_token_chars_is_the_longest_piece_or_four_times_it_under_nfc(
    family: str, chars: int, engines: Callable[[str], VllmEngine]
) -> None:
    assert engines(family).max_token_chars == chars


def test_a_chat_template_setting_serves_chats_to_a_model_with_none(tmp_path: Path) -> None:
    # Llama-2's published tokenizer has no template: a chat is refused without the setting.
    model = tmp_path
    tokenizer = save_tokenizer(model, tokenizer_dir("llama2"))
    (model / "chat.jinja").write_text(
        "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}[assistant]"
    )
    settings = AgentSettings(model=str(model), vllm=VllmSettings(chat_template="chat.jinja"))
    engine = VllmEngine(
        None, tokenizer, "tiny", capacity=1, max_model_len=2048,
        chat_template=chat_template(settings, str(model)),
    )  # fmt: skip

    rendered = engine.chat_prompt_text(CONVERSATION[:2])

    assert rendered == (
        "[system] You answer briefly.\n[user]   What is a spot instance?  \n[assistant]"
    )
