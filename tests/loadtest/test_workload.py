from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from loadtest.workload import DEFAULT_MAX_TOKENS, WorkloadError, builtin_workload, load_workload


def test_jsonl_prompts_and_chats_with_weights(tmp_path: Path) -> None:
    path = tmp_path / "prompts.jsonl"
    path.write_text(
        "# a comment, then a blank line\n\n"
        + json.dumps({"prompt": "short", "max_tokens": 8, "weight": 9}) + "\n"
        + json.dumps({"messages": [{"role": "system", "content": "be brief"},
                                   {"role": "user", "content": "long"}]}) + "\n"
    )  # fmt: skip
    workload = load_workload(path, seed=1)
    short, chat = workload.requests
    assert short.messages == ({"role": "user", "content": "short"},)
    assert (short.max_tokens, chat.max_tokens) == (8, DEFAULT_MAX_TOKENS)
    assert [m["role"] for m in chat.messages] == ["system", "user"]
    drawn = Counter(workload.next().messages[-1]["content"] for _ in range(1000))
    assert 850 < drawn["short"] < 950  # weight 9 : 1


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("not json", "prompts.jsonl:1: not JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"text": "x"}', "needs 'prompt'"),
        ('{"messages": []}', "'messages' must be a list"),
        ('{"prompt": "x", "max_tokens": 0}', "'max_tokens' must be a whole number"),
        ('{"prompt": "x", "weight": -1}', "'weight' must be a positive number"),
    ],
)
def test_bad_lines_are_refused_with_their_line_number(
    tmp_path: Path, line: str, reason: str
) -> None:
    path = tmp_path / "prompts.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(WorkloadError, match=reason):
        load_workload(path)


def test_missing_and_empty_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="No such file"):
        load_workload(tmp_path / "missing.jsonl")
    (tmp_path / "empty.jsonl").write_text("# nothing\n")
    with pytest.raises(WorkloadError, match="no requests"):
        load_workload(tmp_path / "empty.jsonl")


def test_the_builtin_mix_has_short_and_long_requests() -> None:
    workload = builtin_workload(seed=3)
    lengths = {workload.next().max_tokens for _ in range(200)}
    assert min(lengths) <= 16
    assert max(lengths) >= 256
