"""OpenAI's Files and Batch APIs: requests, objects, the input file's check, the output lines.

Pure: the gateway's routes and its batch worker read and write the records
(`spotgate.registry.batches`) and the files' contents; what a request may say, what a file
must hold, which status a batch goes to next and what each output line says are here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from hashlib import sha256
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from spotgate.settings.shared import MAX_REQUEST_BYTES

BATCH_ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/responses")
"""The endpoints a batch's lines may call here (OpenAI's others serve no LLM text)."""
BatchEndpoint = Literal["/v1/chat/completions", "/v1/completions", "/v1/responses"]
COMPLETION_WINDOW_SECONDS = {"24h": 24 * 3600}
"""OpenAI's one completion window: a batch not done within it expires."""
BATCH_FILE_EXPIRES_SECONDS = 30 * 24 * 3600
"""A `batch` file, and a batch's output, expire 30 days after they were made (OpenAI's default)."""
EXPIRES_AFTER_MIN_SECONDS = 3600
EXPIRES_AFTER_MAX_SECONDS = 30 * 24 * 3600
METADATA_MAX_PAIRS = 16
METADATA_KEY_MAX_CHARS = 64
METADATA_VALUE_MAX_CHARS = 512
CUSTOM_ID_MAX_CHARS = 512
FILE_ERRORS_SHOWN = 100
"""A file that fails its check says at most this many of its problems."""
LIST_LIMIT_MAX = 100
"""Most batches a list returns at once (OpenAI's); files: `FILE_LIST_LIMIT_MAX`."""
FILE_LIST_LIMIT_MAX = 10_000
FILE_PURPOSE = "batch"
OUTPUT_PURPOSE = "batch_output"

Status = Literal[
    "validating",
    "failed",
    "in_progress",
    "finalizing",
    "completed",
    "expired",
    "cancelling",
    "cancelled",
]
ENDED: frozenset[Status] = frozenset({"failed", "completed", "expired", "cancelled"})
"""A batch in one of these is never worked again."""


class ExpiresAfter(BaseModel):
    """When a file expires: `seconds` after it was made (1 hour to 30 days)."""

    model_config = ConfigDict(extra="forbid")

    anchor: Literal["created_at"]
    seconds: Annotated[int, Field(ge=EXPIRES_AFTER_MIN_SECONDS, le=EXPIRES_AFTER_MAX_SECONDS)]


def _metadata(value: dict[str, str] | None) -> dict[str, str] | None:
    if value is None:
        return None
    if len(value) > METADATA_MAX_PAIRS:
        raise ValueError(f"at most {METADATA_MAX_PAIRS} metadata pairs")
    for key, text in value.items():
        if len(key) > METADATA_KEY_MAX_CHARS:
            raise ValueError(f"a metadata key has at most {METADATA_KEY_MAX_CHARS} characters")
        if len(text) > METADATA_VALUE_MAX_CHARS:
            raise ValueError(f"a metadata value has at most {METADATA_VALUE_MAX_CHARS} characters")
    return value


class BatchCreateRequest(BaseModel):
    """`POST /v1/batches`."""

    model_config = ConfigDict(extra="forbid")

    input_file_id: Annotated[str, Field(min_length=1, max_length=64)]
    endpoint: BatchEndpoint
    completion_window: Literal["24h"]
    metadata: dict[str, str] | None = None
    output_expires_after: ExpiresAfter | None = None

    _check_metadata = field_validator("metadata")(_metadata)


class RequestLine(BaseModel):
    """One line of a batch's input file: a request to the batch's endpoint."""

    model_config = ConfigDict(extra="forbid")

    custom_id: Annotated[str, Field(min_length=1, max_length=CUSTOM_ID_MAX_CHARS)]
    method: Literal["POST"]
    url: str
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class FileProblem:
    """Why an input file cannot run: OpenAI's batch error (`line` counts from 1)."""

    code: str
    message: str
    line: int | None = None
    param: str | None = None

    def body(self) -> dict[str, Any]:
        """OpenAI's `BatchError`."""
        return {"code": self.code, "message": self.message, "line": self.line, "param": self.param}


@dataclass(frozen=True, slots=True)
class CheckedFile:
    """An input file that runs: its requests, in order, and the one model they name."""

    lines: tuple[RequestLine, ...]
    model: str


def check_input_file(
    content: bytes, endpoint: str, max_requests: int
) -> CheckedFile | list[FileProblem]:
    """The file's requests, or what is wrong with it (at most `FILE_ERRORS_SHOWN` problems).

    Each non-blank line is a JSON request to `endpoint` with a `custom_id` of its own and a
    `body` naming one model, the same on every line (as OpenAI checks). A body the endpoint
    would refuse is not the file's fault: its line fails alone, with its 4xx, when it runs.
    """
    problems: list[FileProblem] = []
    lines: list[RequestLine] = []
    seen: set[str] = set()
    models: set[str] = set()
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError:
        return [FileProblem("invalid_file", "the file is not UTF-8 text")]
    # Lines end at \n only: U+2028 and the like may sit inside a JSON string.
    for number, raw in enumerate(text.split("\n"), start=1):
        if not raw.strip():
            continue
        problem = _line_problem(raw, number, endpoint, seen, models, lines)
        if problem is not None:
            problems.append(problem)
            if len(problems) >= FILE_ERRORS_SHOWN:
                break
    if not problems and not lines:
        problems.append(FileProblem("empty_file", "the file holds no requests"))
    if not problems and len(lines) > max_requests:
        problems.append(
            FileProblem(
                "too_many_requests",
                f"the file holds {len(lines)} requests; a batch holds at most {max_requests}",
            )
        )
    if not problems and len(models) > 1:
        problems.append(
            FileProblem(
                "mismatched_model",
                f"every request of a batch names the same model; this file names {len(models)}",
                param="body.model",
            )
        )
    return problems if problems else CheckedFile(tuple(lines), next(iter(models)))


def _line_problem(
    raw: str,
    number: int,
    endpoint: str,
    seen: set[str],
    models: set[str],
    lines: list[RequestLine],
) -> FileProblem | None:
    """What is wrong with one line; a good one is added to `lines`."""
    if len(raw) > MAX_REQUEST_BYTES:  # characters: at least as many bytes
        message = f"this line is over {MAX_REQUEST_BYTES:,} bytes, the most a request may be"
        return FileProblem("line_too_long", message, number)
    try:
        parsed = json.loads(raw)
    except (ValueError, RecursionError):  # nested past the parser's depth: no request
        return FileProblem("invalid_json_line", "this line is not valid JSON", number)
    try:
        line = RequestLine.model_validate(parsed)
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"]) or None
        return FileProblem("invalid_request", f"{where}: {first['msg']}", number, where)
    if line.url != endpoint:
        message = f"this line calls {line.url}, the batch's endpoint is {endpoint}"
        return FileProblem("mismatched_endpoint", message, number, "url")
    if line.custom_id in seen:
        message = f"custom_id {line.custom_id!r} is on an earlier line too"
        return FileProblem("duplicate_custom_id", message, number, "custom_id")
    model = line.body.get("model")
    if not isinstance(model, str) or not model:
        return FileProblem(
            "invalid_request", "body.model: a model is required", number, "body.model"
        )
    seen.add(line.custom_id)
    models.add(model)
    lines.append(line)
    return None


@dataclass(frozen=True, slots=True)
class Progress:
    """How far a batch is: its requests, those finished (each once) and those failed."""

    total: int
    completed: int = 0
    failed: int = 0

    @property
    def finished(self) -> int:
        """Requests with an output or error line."""
        return self.completed + self.failed

    def counts(self) -> dict[str, int]:
        """OpenAI's `request_counts`."""
        return {"total": self.total, "completed": self.completed, "failed": self.failed}


def next_status(
    status: Status, *, progress: Progress, cancel_requested: bool, expired: bool
) -> Status:
    """Where a batch being worked goes next (itself when it stays).

    Cancelled or expired, the requests not yet run are dropped, and the batch ends with the
    output of those that did (OpenAI's `cancelling` → `cancelled`, `expired`).
    """
    if status in ENDED or status == "validating":
        return status
    if status == "in_progress" and cancel_requested:
        return "cancelling"
    if status == "in_progress" and expired:
        return "expired"
    if status == "in_progress" and progress.finished >= progress.total:
        return "finalizing"
    if status == "cancelling":
        return "cancelled"
    if status == "finalizing":
        return "completed"
    return status


def request_line_id(batch_id: str, index: int) -> str:
    """The id of a request's output line: the same each time the request is run again."""
    digest = sha256(f"{batch_id}/{index}".encode()).hexdigest()[:24]
    return f"batch_req_{digest}"


def output_line(
    batch_id: str, index: int, custom_id: str, status_code: int, body: Mapping[str, Any]
) -> dict[str, Any]:
    """A request's line of the output file (2xx) or the error file (4xx, 5xx), OpenAI's shape."""
    line_id = request_line_id(batch_id, index)
    return {
        "id": line_id,
        "custom_id": custom_id,
        "response": {"status_code": status_code, "request_id": line_id, "body": dict(body)},
        "error": None,
    }


def unrun_line(batch_id: str, index: int, custom_id: str, status: Status) -> dict[str, Any]:
    """The error-file line of a request a cancelled or expired batch never ran."""
    code = "batch_cancelled" if status == "cancelled" else "batch_expired"
    message = (
        "the batch was cancelled before this request ran"
        if status == "cancelled"
        else "the batch expired before this request ran"
    )
    return {
        "id": request_line_id(batch_id, index),
        "custom_id": custom_id,
        "response": None,
        "error": {"code": code, "message": message},
    }


def not_found_body(kind: str, object_id: str) -> dict[str, Any]:
    """OpenAI's 404 body for a file or batch the caller's key does not own (or that is gone)."""
    message = f"No such {kind} object: {object_id}"
    return {
        "error": {"message": message, "type": "invalid_request_error", "param": "id", "code": None}
    }


@dataclass(slots=True)
class Usage:
    """A batch's tokens so far (OpenAI's `usage`), added to as its requests finish."""

    input_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0

    def add(self, body: Mapping[str, Any]) -> None:
        """Count a finished request's usage, as the chat, completions or Responses body says."""
        usage = body.get("usage")
        if not isinstance(usage, Mapping):
            return
        self.input_tokens += int(usage.get("prompt_tokens", usage.get("input_tokens", 0)) or 0)
        self.output_tokens += int(
            usage.get("completion_tokens", usage.get("output_tokens", 0)) or 0
        )
        details = usage.get("completion_tokens_details") or usage.get("output_tokens_details")
        if isinstance(details, Mapping):
            self.reasoning_tokens += int(details.get("reasoning_tokens", 0) or 0)

    def body(self) -> dict[str, Any]:
        """OpenAI's `BatchUsage`."""
        return {
            "input_tokens": self.input_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": self.output_tokens,
            "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
            "total_tokens": self.input_tokens + self.output_tokens,
        }


def new_batch(
    batch_id: str, request: BatchCreateRequest, now: int, expires_after: int | None = None
) -> dict[str, Any]:
    """OpenAI's `Batch` object of a batch just created (`validating`)."""
    return {
        "id": batch_id,
        "object": "batch",
        "endpoint": request.endpoint,
        "errors": None,
        "input_file_id": request.input_file_id,
        "completion_window": request.completion_window,
        "status": "validating",
        "output_file_id": None,
        "error_file_id": None,
        "created_at": now,
        "in_progress_at": None,
        "expires_at": now + COMPLETION_WINDOW_SECONDS[request.completion_window],
        "finalizing_at": None,
        "completed_at": None,
        "failed_at": None,
        "expired_at": None,
        "cancelling_at": None,
        "cancelled_at": None,
        "request_counts": Progress(0).counts(),
        "metadata": request.metadata,
        "model": None,
        "usage": None,
        "output_expires_after": expires_after,
    }


def batch_as_shown(body: Mapping[str, Any], cancel_requested_at: int | None) -> dict[str, Any]:
    """The batch as its owner sees it: `cancelling` from the moment a cancel is asked for."""
    shown = {name: value for name, value in body.items() if name != "output_expires_after"}
    if cancel_requested_at is not None and shown.get("status") in {"validating", "in_progress"}:
        shown.update(status="cancelling", cancelling_at=cancel_requested_at)
    return shown


def file_object(
    file_id: str, size: int, filename: str, purpose: str, now: float, expires_at: int | None
) -> dict[str, Any]:
    """OpenAI's `File` object."""
    return {
        "id": file_id,
        "object": "file",
        "bytes": size,
        "created_at": int(now),
        "filename": filename,
        "purpose": purpose,
        "status": "processed",
        "expires_at": expires_at,
        "status_details": None,
    }
