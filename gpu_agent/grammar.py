"""JSON-schema grammars for structured output, built the same way in the agent and the engine.

The agent compiles a request's schema before it reaches vLLM (a bad schema is a 400, a resume
the schema cannot continue is refused), and vLLM's engine core compiles the same schema for
`gpu_agent.vllm_logits`, which masks every step. Both go through `Grammars`, so a stream moved
to another agent continues under the very grammar it began with.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from typing import Any

from spotgate.protocol import GenerateFrame, Tool

JSON_OBJECT_SCHEMA = '{"type": "object"}'
"""`response_format: json_object`: any JSON object."""
JSON_SEPARATORS = (",", ":")
"""Compact JSON: no whitespace for a model to wander in (a random-weight model would)."""
GRAMMAR_CACHE_ENTRIES = 256
_XGRAMMAR_LOCATION = re.compile(r"^\[[^\]]*\] \S+:\d+: ")
"""What xgrammar puts before its message: `[08:40:59] /project/cpp/….cc:4944: `."""


class GrammarError(ValueError):
    """A schema that cannot be compiled, or tokens it does not accept."""


class Grammars:
    """Compiled JSON-schema grammars for one tokenizer, cached by schema text."""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        import xgrammar

        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        self._compiler = xgrammar.GrammarCompiler(info)
        self.vocab_size = vocab_size
        self.compiled = functools.lru_cache(maxsize=GRAMMAR_CACHE_ENTRIES)(self._compile)

    def _compile(self, schema: str) -> Any:
        try:
            return self._compiler.compile_json_schema(
                schema, any_whitespace=False, separators=JSON_SEPARATORS, strict_mode=True
            )
        except (RuntimeError, ValueError, TypeError) as err:
            reason = _XGRAMMAR_LOCATION.sub("", str(err).strip())
            raise GrammarError(f"response_format's JSON schema cannot be used: {reason}") from err

    def matcher(self, schema: str, after: Sequence[int] = ()) -> Any:
        """A matcher of `schema`, advanced over tokens already generated under it."""
        import xgrammar

        matcher = xgrammar.GrammarMatcher(self.compiled(schema))
        for position, token_id in enumerate(after):
            if not matcher.accept_token(token_id):
                raise GrammarError(
                    f"generated token {position} (id {token_id}) does not follow the schema"
                )
        return matcher


def schema_text(schema: dict[str, Any]) -> str:
    """A schema as the JSON text grammars are cached by (key order kept: it orders the reply)."""
    return json.dumps(schema, separators=JSON_SEPARATORS)


def json_schema_of(frame: GenerateFrame) -> str | None:
    """The JSON schema a reply must match, as text (None: any text).

    A named tool choice: the function's arguments. `required`: OpenAI's tool calls as vLLM
    writes them, `[{"name": …, "parameters": {…}}, …]` (one call only without parallel calls).
    """
    forced = frame.forced_tools()
    if forced is not None:
        if frame.tool_choice != "required":
            return schema_text(forced[0].function.parameters or {"type": "object"})
        calls = {
            "type": "array",
            "minItems": 1,
            "items": {"anyOf": [tool_call_schema(tool) for tool in forced]},
        }
        if not frame.parallel_tool_calls:
            calls["maxItems"] = 1
        return schema_text(calls)
    response_format = frame.response_format
    if response_format is None or response_format.type == "text":
        return None
    if response_format.json_schema is None:  # json_object
        return JSON_OBJECT_SCHEMA
    return schema_text(response_format.json_schema.schema_)


def tool_call_schema(tool: Tool) -> dict[str, object]:
    """One call of `tool` in a `required` reply."""
    return {
        "type": "object",
        "properties": {
            "name": {"type": "string", "enum": [tool.function.name]},
            "parameters": tool.function.parameters or {"type": "object"},
        },
        "required": ["name", "parameters"],
    }
