"""What the local stack keeps across its own end, even a kill -9: the emulator's journal.

moto holds its state in memory. With a journal, the emulator appends each write that
succeeded to the state that outlives a stack (API keys, usage, files and batches; not the
agents, demand or launches of the pool, which a new stack makes again) to a file before it
answers, and a new emulator replays the file before it serves. A write the client was told
of is in the file; one cut off by the kill was never answered, and its client tries again.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from werkzeug.test import EnvironBuilder
from werkzeug.wsgi import get_input_stream

from spotgate.settings import SharedSettings

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

DYNAMODB_TARGET_PREFIX = "DynamoDB_20120810."
DYNAMODB_WRITES = frozenset(
    {
        "CreateTable",
        "UpdateTable",
        "DeleteTable",
        "UpdateTimeToLive",
        "PutItem",
        "UpdateItem",
        "DeleteItem",
        "BatchWriteItem",
        "TransactWriteItems",
    }
)
S3_WRITE_METHODS = frozenset({"PUT", "POST", "DELETE"})


@dataclass(frozen=True, slots=True)
class Kept:
    """The tables and buckets whose writes the journal keeps."""

    tables: frozenset[str]
    buckets: frozenset[str]

    @classmethod
    def of(cls, shared: SharedSettings) -> Kept:
        """What outlives a local stack: keys, usage, files and batches."""
        tables = shared.tables
        return cls(
            frozenset({tables.keys, tables.usage, tables.batches}),
            frozenset({shared.files_bucket}),
        )


@dataclass(frozen=True, slots=True)
class Request:
    """One HTTP request to the emulator, as the journal holds it."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes

    @classmethod
    def of(cls, environ: WSGIEnvironment, body: bytes) -> Request:
        """The request a WSGI environ describes, with its body read."""
        headers = {
            name[5:].replace("_", "-").title(): str(value)
            for name, value in environ.items()
            if name.startswith("HTTP_") and name != "HTTP_TRANSFER_ENCODING"
        }
        if environ.get("CONTENT_TYPE"):
            headers["Content-Type"] = str(environ["CONTENT_TYPE"])
        return cls(
            str(environ["REQUEST_METHOD"]),
            str(environ.get("PATH_INFO", "/")),
            str(environ.get("QUERY_STRING", "")),
            headers,
            body,
        )

    def environ(self) -> WSGIEnvironment:
        """A WSGI environ that sends this request again."""
        builder = EnvironBuilder(
            path=self.path,
            method=self.method,
            query_string=self.query,
            headers=list(self.headers.items()),
            data=self.body,
        )
        try:
            return builder.get_environ()
        finally:
            builder.close()


def _dynamodb_tables(body: Mapping[str, Any]) -> set[str]:
    """The tables a DynamoDB write names."""
    named = {str(body["TableName"])} if "TableName" in body else set()
    named.update(str(table) for table in body.get("RequestItems", {}))
    for item in body.get("TransactItems", []):
        named.update(str(part["TableName"]) for part in item.values() if "TableName" in part)
    return named


def is_kept(kept: Kept, request: Request) -> bool:
    """Whether the request writes to what the journal keeps."""
    target = request.headers.get("X-Amz-Target", "")
    if target.startswith(DYNAMODB_TARGET_PREFIX):
        if target.removeprefix(DYNAMODB_TARGET_PREFIX) not in DYNAMODB_WRITES:
            return False
        try:
            body = json.loads(request.body)
        except ValueError:
            return False
        return isinstance(body, dict) and bool(_dynamodb_tables(body) & kept.tables)
    if request.method not in S3_WRITE_METHODS or "/s3/aws4_request" not in request.headers.get(
        "Authorization", ""
    ):
        return False
    bucket = request.path.lstrip("/").split("/", 1)[0]
    return bucket in kept.buckets


class AwsJournal:
    """An append-only file of the emulator's kept writes: a header line, then the body."""

    def __init__(self, path: Path, kept: Kept) -> None:
        self.path = path
        self.kept = kept
        self._fd: int | None = None

    def records(self) -> Iterator[tuple[Request, int]]:
        """Each whole request in the file, in order, with the offset where it ends.

        A last one cut short (the disk filled, the machine stopped) ends the file.
        """
        if not self.path.exists():
            return
        with self.path.open("rb") as journal:
            while (header := journal.readline()).endswith(b"\n"):
                try:
                    fields = json.loads(header)
                    size = int(fields.pop("body_bytes"))
                except (ValueError, KeyError):
                    return
                body = journal.read(size)
                if len(body) < size:
                    return
                yield Request(**fields, body=body), journal.tell()

    def replay(self, app: WSGIApplication) -> int:
        """Send every request in the file to `app` again, then keep what follows; how many."""
        count = whole_bytes = 0
        for request, end in self.records():
            for _ in app(request.environ(), _ignored):
                pass
            count, whole_bytes = count + 1, end
        if self.path.exists() and self.path.stat().st_size > whole_bytes:
            os.truncate(self.path, whole_bytes)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        return count

    def append(self, request: Request) -> None:
        """Add a write that succeeded, whole, before its client hears of it."""
        if self._fd is None or not is_kept(self.kept, request):
            return
        header = {
            "method": request.method,
            "path": request.path,
            "query": request.query,
            "headers": request.headers,
            "body_bytes": len(request.body),
        }
        # Written whole before the client hears: a kill leaves it whole or cut short at the end.
        record = memoryview(json.dumps(header).encode() + b"\n" + request.body)
        while record:
            record = record[os.write(self._fd, record) :]


def _ignored(_status: str, _headers: list[tuple[str, str]], _exc: Any = None) -> Callable[..., Any]:
    return lambda _data: None


def read_body(environ: WSGIEnvironment) -> bytes:
    """Read the request's body, and put it back for the application to read."""
    body = get_input_stream(environ).read()
    environ["wsgi.input"] = io.BytesIO(body)
    environ["CONTENT_LENGTH"] = str(len(body))
    environ.pop("HTTP_TRANSFER_ENCODING", None)
    environ["wsgi.input_terminated"] = False
    return body


def journaled_call(
    app: WSGIApplication,
    journal: AwsJournal,
    environ: WSGIEnvironment,
    start_response: StartResponse,
) -> Iterable[bytes]:
    """Answer the request, journaling it first if it was a kept write that succeeded."""
    request = Request.of(environ, read_body(environ))
    statuses: list[int] = []

    def started(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        statuses.append(int(status.split(" ", 1)[0]))
        return start_response(status, headers, exc_info)

    answer = list(app(environ, started))
    if statuses and statuses[0] < 300:
        journal.append(request)
    return answer
