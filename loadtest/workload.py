"""What load-test users ask for: a built-in mix of prompts, or a JSONL file of them.

A JSONL line is `{"prompt": "…", "max_tokens": 128}` or `{"messages": [{"role": "user",
"content": "…"}], "max_tokens": 128}`; `max_tokens` is optional (default 128) and an optional
`weight` makes a line come up more often.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_MAX_TOKENS = 128


class WorkloadError(ValueError):
    """A workload file that cannot be used; the message names the line and the problem."""


@dataclass(frozen=True)
class Request:
    """One chat request: its messages, how many tokens to ask for, how often it comes up."""

    messages: tuple[dict[str, str], ...]
    max_tokens: int = DEFAULT_MAX_TOKENS
    weight: float = 1.0


BUILTIN_MIX = (
    Request(({"role": "user", "content": "Say hello in one sentence."},), 16, weight=3),
    Request(({"role": "user", "content": "Summarise what a spot instance is."},), 64, weight=4),
    Request(
        ({"role": "user", "content": "Write a short story about a lighthouse keeper."},),
        256,
        weight=2,
    ),
    Request(
        (
            {"role": "system", "content": "You are a careful code reviewer."},
            {
                "role": "user",
                "content": "Review this function:\n" + "def f(x):\n    return x\n" * 20,
            },
        ),
        128,
        weight=1,
    ),
)


@dataclass
class Workload:
    """Requests drawn at random, in proportion to their weights."""

    requests: Sequence[Request]
    rng: random.Random = field(default_factory=random.Random)

    def __post_init__(self) -> None:
        if not self.requests:
            raise WorkloadError("a workload needs at least one request")
        self._weights = [request.weight for request in self.requests]

    def next(self) -> Request:
        """The next request to send."""
        return self.rng.choices(self.requests, weights=self._weights)[0]


def _request_from(line: dict[str, Any], where: str) -> Request:
    if "messages" in line:
        messages = line["messages"]
        if (
            not isinstance(messages, list)
            or not messages
            or not all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages)
        ):
            raise WorkloadError(f"{where}: 'messages' must be a list of {{role, content}}")
        chat = tuple(
            {"role": str(m.get("role", "user")), "content": m["content"]} for m in messages
        )
    elif isinstance(line.get("prompt"), str):
        chat = ({"role": "user", "content": line["prompt"]},)
    else:
        raise WorkloadError(f"{where}: needs 'prompt' (text) or 'messages'")
    max_tokens = line.get("max_tokens", DEFAULT_MAX_TOKENS)
    weight = line.get("weight", 1.0)
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise WorkloadError(f"{where}: 'max_tokens' must be a whole number of at least 1")
    if not isinstance(weight, int | float) or weight <= 0:
        raise WorkloadError(f"{where}: 'weight' must be a positive number")
    return Request(chat, max_tokens, float(weight))


def load_workload(path: Path, seed: int | None = None) -> Workload:
    """The requests of a JSONL file (blank lines and `#` comments skipped)."""
    try:
        lines = path.read_text().splitlines()
    except OSError as err:
        raise WorkloadError(f"{path}: {err.strerror or err}") from err
    requests = []
    for number, text in enumerate(lines, start=1):
        if not text.strip() or text.lstrip().startswith("#"):
            continue
        where = f"{path}:{number}"
        try:
            line = json.loads(text)
        except ValueError as err:
            raise WorkloadError(f"{where}: not JSON ({err})") from err
        if not isinstance(line, dict):
            raise WorkloadError(f"{where}: each line must be a JSON object")
        requests.append(_request_from(line, where))
    if not requests:
        raise WorkloadError(f"{path}: no requests in it")
    return Workload(requests, random.Random(seed))  # noqa: S311 - load shaping, not security


def builtin_workload(seed: int | None = None) -> Workload:
    """The built-in mix: short, medium, long and a code review with a system prompt."""
    return Workload(BUILTIN_MIX, random.Random(seed))  # noqa: S311 - load shaping
