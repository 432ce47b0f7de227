"""What every frame is built of: the protocol's limits, error codes and field types."""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from spotgate.settings import ADAPTER_SEPARATOR

PROTOCOL_VERSION = "spotgate.v1"
MAX_STREAM_ID_CHARS = 128
MAX_TOKEN_ID = 2**31 - 1
RECEIPT_MAX_CHARS = 160
"""A resume receipt is a version, a key thumbprint and a MAC: anything longer is forged."""
MAX_SEED = 2**63 - 1
MAX_STOP_SEQUENCES = 16
MAX_TOP_LOGPROBS = 20
"""The most alternatives a token's logprobs carry (OpenAI's limit)."""
MAX_LOGIT_BIAS_ENTRIES = 1024
MIN_LOGPROB = -9999.0
"""A logprob is never below this: an impossible token (-inf) is reported at it, as vLLM does."""


class ErrorCode(StrEnum):
    """Error codes of `error` frames (ARCHITECTURE.md)."""

    UNAUTHORIZED = "unauthorized"
    FORBIDDEN = "forbidden"
    INVALID_REQUEST = "invalid_request"
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
    MODEL_NOT_FOUND = "model_not_found"
    RATE_LIMITED = "rate_limited"
    NO_CAPACITY = "no_capacity"
    TIMEOUT = "timeout"
    INTERRUPTED = "interrupted"
    # This gateway is stopping: send the stream again through another (or after reconnecting).
    GOING_AWAY = "going_away"
    INTERNAL = "internal"


StreamId = Annotated[str, StringConstraints(min_length=1, max_length=MAX_STREAM_ID_CHARS)]
ModelName = Annotated[str, StringConstraints(min_length=1, max_length=256)]


def split_model(name: str) -> tuple[str, str | None]:
    """(the served model, the LoRA adapter or None) a request's `model` names."""
    base, separator, adapter = name.partition(ADAPTER_SEPARATOR)
    return (base, adapter) if separator and adapter else (name, None)


Count = Annotated[int, Field(ge=0)]
TokenId = Annotated[int, Field(ge=0, le=MAX_TOKEN_ID)]
Milliseconds = Annotated[float, Field(ge=0)]


class WireModel(BaseModel):
    """Unknown fields are refused: a misspelt `max_token` is an error, not a silent default."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


MAX_TOOLS = 128
FunctionName = Annotated[str, StringConstraints(min_length=1, max_length=64)]
ToolCallId = Annotated[str, StringConstraints(min_length=1, max_length=256)]


def json_chars(value: object) -> int:
    """Characters of `value` as compact JSON, non-ASCII as it is: what a schema weighs."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")))
