"""How a model directory asks to be served, found in its files: parsers and chat template.

vLLM serves a model's tool calls and thinking only with the parsers named for it; the
markup a model writes is in its chat template, so that is where they are found
(`serving_profile`, pure, over the files' contents; `read_profile` reads a directory).
`spotgate up --model DIR` serves a model with what is found here unless told otherwise, and
`spotgate model inspect DIR` prints it with the evidence.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHAT_TEMPLATE_FILE = "chat_template.jinja"
"""Where `transformers` saves a chat template of its own (tokenizer_config.json's otherwise)."""

TOOL_CALL_MARKUP: tuple[tuple[str, str], ...] = (
    ("<tool_call>", "hermes"),  # Qwen2.5, Qwen3, Hermes
    ("<|python_tag|>", "llama3_json"),  # Llama 3.1 and later
    ("[TOOL_CALLS]", "mistral"),
)
"""A chat template's tool-call markup, in the order looked for, and vLLM's parser for it."""

THINKING_MARKUP = "<think>"
QWEN3_THINKING_SWITCH = "enable_thinking"
"""A template that reads this variable is Qwen3's kind: thinking that a request can turn off."""


@dataclass(frozen=True, slots=True)
class Finding:
    """One setting found (or not), and what in the model's files says so."""

    value: str | None
    evidence: str


@dataclass(frozen=True, slots=True)
class ServingProfile:
    """What a model's files say of how to serve it."""

    architecture: str
    chat_template: Finding  # value: where the template is, not its text
    tool_call_parser: Finding
    reasoning_parser: Finding
    max_model_len: int | None


def serving_profile(
    config: Mapping[str, Any], tokenizer_config: Mapping[str, Any], template_file: str | None
) -> ServingProfile:
    """The profile of a model from its `config.json`, `tokenizer_config.json` and template file."""
    template, source = _chat_template(tokenizer_config, template_file)
    architectures = config.get("architectures") or ["unknown"]
    length = config.get("max_position_embeddings")
    return ServingProfile(
        architecture=f"{architectures[0]} ({config.get('model_type', 'unknown')})",
        chat_template=Finding(source, _template_evidence(template, source)),
        tool_call_parser=_tool_call_parser(template),
        reasoning_parser=_reasoning_parser(template),
        max_model_len=length if isinstance(length, int) else None,
    )


def read_profile(directory: Path) -> ServingProfile:
    """The profile of the model in `directory`; `ValueError` naming a file it cannot read."""
    if not (directory / "config.json").is_file():
        raise ValueError(f"{directory} holds no model (no config.json)")
    template_path = directory / CHAT_TEMPLATE_FILE
    return serving_profile(
        _json(directory / "config.json"),
        _json(directory / "tokenizer_config.json"),
        template_path.read_text(encoding="utf-8") if template_path.is_file() else None,
    )


def _json(path: Path) -> Mapping[str, Any]:
    if not path.is_file():
        return {}
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not readable as JSON ({err})") from err
    if not isinstance(loaded, dict):  # a file's content: a bad value, not a bad call
        raise ValueError(f"{path}: not a JSON object")  # noqa: TRY004
    return loaded


def _chat_template(
    tokenizer_config: Mapping[str, Any], template_file: str | None
) -> tuple[str, str | None]:
    """The default chat template's text and which file holds it (None: the model has none)."""
    if template_file:
        return template_file, CHAT_TEMPLATE_FILE
    template = tokenizer_config.get("chat_template")
    if isinstance(template, list):  # named templates: the default one is what chats use
        named = {entry.get("name"): entry.get("template") for entry in template}
        template = named.get("default")
    if isinstance(template, str) and template:
        return template, "tokenizer_config.json"
    return "", None


def _template_evidence(template: str, source: str | None) -> str:
    if source is None:
        return "no chat template: chat requests are refused (give one, or send raw prompts)"
    takes = "takes tools" if "tools" in template else "takes no tools"
    return f"{len(template)} characters; {takes}"


def _tool_call_parser(template: str) -> Finding:
    for markup, parser in TOOL_CALL_MARKUP:
        if markup in template:
            return Finding(parser, f"the chat template writes {markup}")
    return Finding(None, "no tool-call markup spotgate knows in the chat template")


def _reasoning_parser(template: str) -> Finding:
    if THINKING_MARKUP not in template:
        return Finding(None, f"the chat template writes no {THINKING_MARKUP}")
    if QWEN3_THINKING_SWITCH in template:
        return Finding("qwen3", f"the chat template writes {THINKING_MARKUP} and reads "
                       f"{QWEN3_THINKING_SWITCH}")  # fmt: skip
    return Finding("deepseek_r1", f"the chat template writes {THINKING_MARKUP}")
