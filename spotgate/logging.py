"""Structured logging: JSON lines (or a console renderer on a TTY), context bound per request.

Every record passes through `redact_secrets`, so an API key, a JWT or a bearer credential
never reaches a log line, whatever field or message it hides in (ARCHITECTURE.md).
"""

from __future__ import annotations

import contextvars
import logging
import re
import sys
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any, TextIO

import structlog
from aiohttp.http_exceptions import HttpProcessingError
from structlog.typing import EventDict, Processor, WrappedLogger

from spotgate.settings import LogFormat, LogLevel

REDACTED = "[redacted]"

# `sg-<key_id>-<secret>` (ARCHITECTURE.md), compact JWS (three base64url parts, header starts
# `eyJ` = '{"'), and whatever follows "Bearer " in a header echoed into a message.
_SECRET_PATTERNS = (
    re.compile(r"\bsg-[A-Za-z0-9]+-[A-Za-z0-9_\-]{8,}"),
    re.compile(r"\beyJ[A-Za-z0-9_\-]*\.[A-Za-z0-9_\-]+\.[A-Za-z0-9_\-]*"),
    re.compile(r"(?i)(?<=bearer )\s*[^\s\"',;]+"),
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(-----END [A-Z ]*PRIVATE KEY-----|$)", re.S),
)

# Field names whose values are secret whatever they look like.
_SECRET_FIELD_NAMES = frozenset(
    {
        "api_key",
        "authorization",
        "password",
        "private_key",
        "secret",
        "secret_key",
        "signing_key",
        "token",
        "access_token",
        "x-api-key",
    }
)


def one_line(text: str) -> str:
    """`text` with its whitespace runs, newlines included, as single spaces."""
    return " ".join(text.split())


def redact_text(text: str) -> str:
    """Replace every API key, JWT, bearer credential and PEM private key in `text`."""
    for pattern in _SECRET_PATTERNS:
        text = pattern.sub(REDACTED, text)
    return text


def redact_value(value: Any) -> Any:
    """Redact secrets inside strings, mappings, lists and tuples, recursively."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, Mapping):
        return {
            key: REDACTED if _is_secret_field(key) else redact_value(item)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return type(value)(redact_value(item) for item in value)
    if isinstance(value, bytes):
        return redact_text(value.decode("utf-8", "replace"))
    return value


def _is_secret_field(name: object) -> bool:
    return isinstance(name, str) and name.lower() in _SECRET_FIELD_NAMES


def redact_secrets(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
    """Structlog processor: scrub secrets from every field of a log record."""
    for key, value in list(event_dict.items()):
        event_dict[key] = REDACTED if _is_secret_field(key) else redact_value(value)
    return event_dict


# The event of a request aiohttp's parser refused; the hostile-input battery counts these lines.
PARSER_REFUSAL_EVENT = "request refused by the HTTP parser"


class DemoteRefusedRequests(logging.Filter):
    """Log a request aiohttp's parser refused as one warning line, not an error with a traceback.

    A header line over 8190 bytes or a broken request line is the client's fault and costs an
    attacker nothing to send; as error-level tracebacks it would bury real failures. aiohttp
    has already answered it with a 4xx, and its access log line names the client.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """Rewrite parser refusals from `aiohttp.server`; pass every other record unchanged."""
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, HttpProcessingError) or record.levelno <= logging.WARNING:
            return True
        record.msg, record.args = f"{PARSER_REFUSAL_EVENT}: %s", (exc,)
        record.exc_info = None
        record.exc_text = None
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        return logging.getLogger(record.name).isEnabledFor(logging.WARNING)


def _shared_processors() -> list[Processor]:
    return [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.format_exc_info,
        redact_secrets,
    ]


def configure_logging(
    level: LogLevel = "info", fmt: LogFormat = "auto", stream: TextIO | None = None
) -> None:
    """Send structlog and stdlib logging (aiohttp, botocore…) through one redacting pipeline."""
    out = stream if stream is not None else sys.stderr
    use_console = fmt == "console" or (fmt == "auto" and out.isatty())
    renderer: Processor = (
        structlog.dev.ConsoleRenderer(colors=False)
        if use_console
        else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            *_shared_processors(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=_shared_processors(),
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
    )
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    server_log = logging.getLogger("aiohttp.server")
    server_log.filters[:] = [DemoteRefusedRequests()]
    # botocore at debug level prints request headers, signatures included.
    logging.getLogger("botocore").setLevel(max(root.level, logging.INFO))


def get_logger(name: str, **initial: Any) -> structlog.stdlib.BoundLogger:
    """A logger named `name` that follows `configure_logging` even if made at import time.

    It stays a lazy proxy (binding at import time would freeze structlog's defaults into it);
    `initial` fields go in through the proxy's own initial values.
    """
    logger: structlog.stdlib.BoundLogger = structlog.get_logger(name, **initial)
    return logger


def bind_context(**fields: Any) -> Mapping[str, contextvars.Token[Any]]:
    """Bind `request_id`, `stream_id`, `agent_id`… to the current context; returns the tokens."""
    return structlog.contextvars.bind_contextvars(**fields)


def bound_context(**fields: Any) -> AbstractContextManager[None]:
    """Context manager binding fields for the duration of a block."""
    return structlog.contextvars.bound_contextvars(**fields)


def clear_context() -> None:
    """Forget every field bound in the current context."""
    structlog.contextvars.clear_contextvars()


__all__ = [
    "REDACTED",
    "bind_context",
    "bound_context",
    "clear_context",
    "configure_logging",
    "get_logger",
    "redact_secrets",
    "redact_text",
    "redact_value",
]
