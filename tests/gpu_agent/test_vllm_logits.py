"""`StreamConstraints` and `Grammars`: a grammar and penalties that span a resume, row by row."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from transformers import AutoTokenizer
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality

from gpu_agent.engine import GenerationRequest
from gpu_agent.grammar import GrammarError, Grammars
from gpu_agent.vllm_logits import (
    EXTRA_ARGS_KEY,
    StreamConstraints,
    StreamSpec,
)
from gpu_agent.vllm_sampling import sampling_params

VOCAB = 8


def constraints(tokenizer: str = "unused", vocab: int = VOCAB) -> StreamConstraints:
    model_config = SimpleNamespace(get_vocab_size=lambda: vocab, tokenizer=tokenizer)
    return StreamConstraints(SimpleNamespace(model_config=model_config), torch.device("cpu"), False)  # type: ignore[arg-type]


def added(index: int, spec: StreamSpec | None, prompt: list[int], output: list[int]) -> Any:
    extra = {EXTRA_ARGS_KEY: spec} if spec is not None else None
    return (index, SamplingParams(extra_args=extra), prompt, output)


def batch(*, added: list[Any] = (), removed: list[int] = (), moved: list[Any] = ()) -> BatchUpdate:  # type: ignore[assignment]
    return BatchUpdate(batch_size=4, removed=removed, added=added, moved=moved)


def test_penalties_count_the_resumed_tokens_as_generated() -> None:
    processor = constraints()
    output: list[int] = []
    spec: StreamSpec = {"resumed": 2, "presence_penalty": 1.0, "frequency_penalty": 0.5}
    # The prompt is the chat's 9, then 3 and 3 generated before the resume.
    processor.update_state(batch(added=[added(0, spec, [9, 3, 3], output)]))
    assert processor.apply(torch.zeros(1, VOCAB))[0].tolist() == [0, 0, 0, -2.0, 0, 0, 0, 0]

    output.append(5)  # vLLM appends to its own list; the processor reads it at the next step
    processor.update_state(None)
    logits = processor.apply(torch.zeros(1, VOCAB))[0]
    assert logits[3] == -2.0
    assert logits[5] == -1.5


def test_rows_follow_the_batch_as_requests_move_and_leave() -> None:
    processor = constraints()
    spec: StreamSpec = {"resumed": 1, "frequency_penalty": 1.0}
    processor.update_state(
        batch(added=[added(0, spec, [1, 2], []), added(1, None, [4], []), added(2, spec, [6], [])])
    )
    processor.update_state(batch(moved=[(0, 1, MoveDirectionality.SWAP)], removed=[2]))

    logits = processor.apply(torch.zeros(3, VOCAB))
    assert logits[0].tolist() == [0.0] * VOCAB  # the unconstrained row, swapped in
    assert logits[1][2] == -1.0
    assert logits[2].tolist() == [0.0] * VOCAB  # removed

    processor.update_state(batch(moved=[(1, 3, MoveDirectionality.UNIDIRECTIONAL)]))
    assert processor.apply(torch.zeros(4, VOCAB))[3][2] == -1.0


def test_only_resumed_streams_leave_penalties_to_the_processor() -> None:
    fresh = sampling_params(GenerationRequest("a", [1], 4, presence_penalty=1.0))
    resumed = sampling_params(
        GenerationRequest("b", [1], 4, presence_penalty=1.0, resume_ids=[7, 8])
    )
    assert (fresh.presence_penalty, fresh.extra_args) == (1.0, None)
    assert resumed.presence_penalty == 0.0
    assert resumed.extra_args == {
        EXTRA_ARGS_KEY: {"presence_penalty": 1.0, "frequency_penalty": 0.0, "resumed": 2}
    }


BOOLEAN = json.dumps({"type": "boolean"})


def allowed(logits: torch.Tensor, tokenizer: Any) -> set[str]:
    return {tokenizer.decode([i]) for i in torch.nonzero(logits > float("-inf")).flatten().tolist()}


def test_a_grammar_masks_from_where_the_resumed_tokens_left_it(tiny_model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    vocab = len(tokenizer)
    t, r = tokenizer.convert_tokens_to_ids(["t", "r"])
    processor = constraints(str(tiny_model_dir), vocab)

    fresh: StreamSpec = {"resumed": 0, "json_schema": BOOLEAN}
    resumed: StreamSpec = {"resumed": 2, "json_schema": BOOLEAN}
    processor.update_state(
        batch(added=[added(0, fresh, [5], []), added(1, resumed, [5, t, r], [])])
    )
    logits = processor.apply(torch.zeros(2, vocab))

    assert {text[:1] for text in allowed(logits[0], tokenizer)} == {"t", "f"}
    assert allowed(logits[1], tokenizer) <= {"u", "ue"}


def test_grammars_refuse_a_bad_schema_and_a_resume_off_the_schema(tiny_model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    grammars = Grammars(tokenizer, len(tokenizer))
    with pytest.raises(GrammarError, match=r"^response_format's JSON schema cannot be used: \w"):
        grammars.compiled(json.dumps({"type": "nonsense"}))
    with pytest.raises(GrammarError, match="generated token 0"):
        grammars.matcher(BOOLEAN, tokenizer.convert_tokens_to_ids(["x"]))
    assert grammars.matcher(BOOLEAN, tokenizer.convert_tokens_to_ids(["t"])) is not None
