"""A resume's prompt ids are kept: a moving stream's later rounds find them, untokenized."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpu_agent.resumed_prompts import ResumedPrompts, prompt_key
from gpu_agent.tiny_model import save_tokenizer
from gpu_agent.vllm_engine import VllmEngine
from spotgate.protocol import GenerateFrame
from tests.support.tokenizers import tokenizer_dir

CHAT: dict[str, Any] = {
    "type": "generate",
    "id": "s1",
    "model": "tiny",
    "messages": [{"role": "user", "content": "What is a spot instance?"}],
    "tenant": "acme",
}
RESUME = {"token_ids": [9707, 0], "text": "Hello!", "completion_tokens": 2}


def frame(**changes: Any) -> GenerateFrame:
    """The chat above with `changes`, resumed after two tokens."""
    return GenerateFrame.model_validate({**CHAT, "resume": RESUME, **changes})


@pytest.mark.parametrize(
    ("changes", "same"),
    [
        ({"id": "s2", "max_tokens": 9, "temperature": 0.5}, True),  # not what the prompt is
        ({"resume": {"token_ids": [1], "text": "x", "completion_tokens": 1}}, True),
        ({"messages": [{"role": "user", "content": "What is on-demand?"}]}, False),
        ({"tenant": "globex"}, False),
        ({"enable_thinking": True}, False),
        ({"reasoning_effort": "low"}, False),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, False),
        ({"messages": None, "prompt": "What is a spot instance?"}, False),
    ],
)
def test_a_prompts_key_is_what_its_ids_are_made_of_and_whose(
    changes: dict[str, Any], same: bool
) -> None:
    assert (prompt_key(frame(**changes)) == prompt_key(frame())) is same


def test_kept_ids_come_back_as_a_list_of_the_callers_own() -> None:
    kept = ResumedPrompts()
    kept.put(b"a", [1, 2, 3])

    ids = kept.get(b"a")
    assert ids == [1, 2, 3]
    assert ids is not None
    ids.append(4)
    assert kept.get(b"a") == [1, 2, 3]
    assert kept.get(b"b") is None


def test_the_least_recently_used_go_first_past_the_tokens_held() -> None:
    kept = ResumedPrompts(held_tokens=10)
    kept.put(b"a", [1] * 4)
    kept.put(b"b", [2] * 4)
    kept.get(b"a")  # used: b is now the least recent
    kept.put(b"c", [3] * 4)

    assert kept.get(b"b") is None
    assert kept.get(b"a") == [1] * 4
    assert kept.get(b"c") == [3] * 4
    assert kept.tokens == 8


def test_a_prompt_put_again_is_counted_once_and_one_too_long_is_not_kept() -> None:
    kept = ResumedPrompts(held_tokens=10)
    kept.put(b"a", [1] * 4)
    kept.put(b"a", [1] * 5)
    kept.put(b"long", [2] * 11)

    assert kept.tokens == 5
    assert kept.get(b"long") is None


@pytest.fixture
def engine(tmp_path: Path) -> VllmEngine:
    """The engine's prompt side on Qwen3's tokenizer (no generation here), counting encodes."""
    tokenizer = save_tokenizer(tmp_path, tokenizer_dir("qwen3"))
    return VllmEngine(None, tokenizer, "tiny", capacity=1, max_model_len=2048)


def counted_encodes(engine: VllmEngine, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The texts the engine tokenizes from now on."""
    texts: list[str] = []
    encode = engine._encode

    def counting(text: str, *, special_tokens: bool) -> list[int]:
        texts.append(text)
        return encode(text, special_tokens=special_tokens)

    monkeypatch.setattr(engine, "_encode", counting)
    return texts


async def test_a_moving_streams_rounds_tokenize_its_conversation_once(
    engine: VllmEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = engine.chat_prompt_ids(frame().messages or [])
    encodes = counted_encodes(engine, monkeypatch)
    held = [
        {"token_ids": [9707] * n, "text": "Hello" * n, "completion_tokens": n} for n in (1, 2, 3)
    ]
    rounds = [frame(id=f"round-{n}", resume=resume) for n, resume in enumerate(held)]

    ids = [await engine.prompt_ids(round_frame, 1024) for round_frame in rounds]

    assert len(encodes) == 1
    assert ids[0] == ids[1] == ids[2] == made
    await engine.prompt_ids(frame(tenant="globex"), 1024)  # another tenant's: its own
    assert len(encodes) == 2


async def test_a_new_streams_prompt_is_tokenized_each_time_and_not_kept(
    engine: VllmEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    encodes = counted_encodes(engine, monkeypatch)
    new = GenerateFrame.model_validate(CHAT)

    first = await engine.prompt_ids(new, 1024)
    second = await engine.prompt_ids(new, 1024)

    assert first == second
    assert len(encodes) == 2
    assert engine._resumed_prompts.tokens == 0
