"""OpenAI's Files API for batches: `/v1/files`, `/v1/files/{id}`, `/v1/files/{id}/content`.

Upload and list; get, delete, and read a file's bytes. A key sees only the files it made,
and its batches' output and error files.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiohttp import BodyPartReader, web

from gateway.guard import request_principal
from gateway.state import STATE
from spotgate.file_store import file_key
from spotgate.openai_batches import (
    BATCH_FILE_EXPIRES_SECONDS,
    EXPIRES_AFTER_MAX_SECONDS,
    EXPIRES_AFTER_MIN_SECONDS,
    FILE_LIST_LIMIT_MAX,
    FILE_PURPOSE,
    file_object,
    not_found_body,
)
from spotgate.protocol import ErrorCode
from spotgate.registry import object_id
from spotgate.wsserver import json_error

UPLOAD_CHUNK_BYTES = 256 * 1024
DOWNLOAD_CHUNK_BYTES = 256 * 1024
"""A download goes out this much at a time: a 200 MB file is never held whole."""
DOWNLOAD_STALL_SECONDS = 60.0
"""A download whose client takes no chunk for this long is cut off: it holds an S3 connection."""
UPLOAD_MIN_BYTES_PER_SECOND = 256 * 1024
UPLOAD_RATE_GRACE_SECONDS = 10.0
"""An upload averaging less than 256 KiB/s after its first 10 s is cut off (408): a replica
reads few uploads at once, and a trickle must not hold one of them for its whole timeout."""
FORM_FIELD_MAX_BYTES = 1024
"""A form field besides the file (`purpose`, `expires_after[…]`) is short."""
FORM_FIELDS = frozenset({"purpose", "expires_after[anchor]", "expires_after[seconds]"})
UPLOAD_BUSY_RETRY_SECONDS = 1.0


class UploadRefused(Exception):
    """An upload this gateway does not take: the message says why (a 400 or 413)."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.param = param
        self.status = status


async def _read_part(part: BodyPartReader, limit: int, what: str) -> bytes:
    data = bytearray()
    started = time.monotonic()
    while chunk := await part.read_chunk(UPLOAD_CHUNK_BYTES):
        data += chunk
        if len(data) > limit:
            raise UploadRefused(f"{what} exceeds {limit} bytes", param=what, status=413)
        if too_slow(len(data), time.monotonic() - started):
            message = f"upload slower than {UPLOAD_MIN_BYTES_PER_SECOND // 1024} KiB/s"
            raise UploadRefused(message, param=what, status=408)
    return bytes(data)


def too_slow(received_bytes: int, elapsed_seconds: float) -> bool:
    """Whether an upload holds its slot for too little: past a grace, under the least rate."""
    if elapsed_seconds <= UPLOAD_RATE_GRACE_SECONDS:
        return False
    return received_bytes < UPLOAD_MIN_BYTES_PER_SECOND * elapsed_seconds


async def _read_form(
    request: web.Request, max_file_bytes: int
) -> tuple[dict[str, str], bytes, str]:
    """The upload's fields, its file's bytes and name."""
    try:
        reader = await request.multipart()
    except (AssertionError, ValueError, KeyError) as err:
        raise UploadRefused("send the file as multipart/form-data") from err
    fields: dict[str, str] = {}
    content: bytes | None = None
    filename = "upload.jsonl"
    while (part := await reader.next()) is not None:
        if not isinstance(part, BodyPartReader) or part.name is None:
            raise UploadRefused("a form part without a name, or nested")
        if part.name == "file":
            filename = part.filename or filename
            content = await _read_part(part, max_file_bytes, "file")
        elif part.name in FORM_FIELDS:
            data = await _read_part(part, FORM_FIELD_MAX_BYTES, part.name)
            fields[part.name] = data.decode("utf-8", errors="replace")
        else:
            raise UploadRefused(f"unknown form field {part.name[:64]!r}", param=part.name[:64])
    if content is None:
        raise UploadRefused("no file in the form (the field is `file`)", param="file")
    return fields, content, filename


def _expires_after_seconds(fields: dict[str, str]) -> int:
    seconds = fields.get("expires_after[seconds]")
    if seconds is None:
        return BATCH_FILE_EXPIRES_SECONDS
    if fields.get("expires_after[anchor]", "created_at") != "created_at":
        raise UploadRefused("expires_after.anchor: only created_at", param="expires_after")
    try:
        value = int(seconds)
    except ValueError:
        value = -1
    if not EXPIRES_AFTER_MIN_SECONDS <= value <= EXPIRES_AFTER_MAX_SECONDS:
        message = (
            f"expires_after.seconds: from {EXPIRES_AFTER_MIN_SECONDS} "
            f"to {EXPIRES_AFTER_MAX_SECONDS}"
        )
        raise UploadRefused(message, param="expires_after")
    return value


async def create_file(request: web.Request) -> web.Response:
    """`POST /v1/files` (multipart: `file`, `purpose` `batch`, optional `expires_after`)."""
    state = request.app[STATE]
    principal = await request_principal(request)
    if isinstance(principal, web.Response):
        return principal
    settings = state.settings.batch
    if state.uploads.locked() or principal.key_id in state.uploading:
        message = "this gateway is taking other uploads (one a key at a time); retry"
        return json_error(ErrorCode.RATE_LIMITED, message, UPLOAD_BUSY_RETRY_SECONDS)
    state.uploading.add(principal.key_id)
    try:
        async with state.uploads, asyncio.timeout(settings.upload_timeout_seconds):
            fields, content, filename = await _read_form(request, settings.max_file_bytes)
        if fields.get("purpose") != FILE_PURPOSE:
            message = "purpose: only `batch` files are served here"
            raise UploadRefused(message, param="purpose")
        expires_seconds = _expires_after_seconds(fields)
    except UploadRefused as refused:
        error = json_error(ErrorCode.INVALID_REQUEST, str(refused), param=refused.param)
        error.set_status(refused.status)
        return error
    except TimeoutError:
        message = f"upload not received within {settings.upload_timeout_seconds:g} s"
        return json_error(ErrorCode.TIMEOUT, message)
    finally:
        state.uploading.discard(principal.key_id)
    now = state.clock()
    file_id = object_id("file-", now)
    expires_at = int(now) + expires_seconds
    body = file_object(file_id, len(content), filename[:256], FILE_PURPOSE, now, expires_at)
    await state.files.put(file_key(file_id), content)
    await state.registry.put_file(principal.key_id, body)
    return web.json_response(body)


async def _owned_file(request: web.Request) -> tuple[str, dict[str, Any]] | web.Response:
    """The caller's key and the file it names, if the key owns it; a 401 or 404 otherwise."""
    principal = await request_principal(request)
    if isinstance(principal, web.Response):
        return principal
    file_id = request.match_info["file_id"]
    body = await request.app[STATE].registry.get_object(principal.key_id, file_id)
    if body is None or body.get("object") != "file":
        return web.json_response(not_found_body("File", file_id), status=404)
    return principal.key_id, body


async def get_file(request: web.Request) -> web.Response:
    """`GET /v1/files/{file_id}`."""
    owned = await _owned_file(request)
    if isinstance(owned, web.Response):
        return owned
    return web.json_response(owned[1])


async def file_content(request: web.Request) -> web.StreamResponse:
    """`GET /v1/files/{file_id}/content`: the file's bytes, streamed as S3 gives them."""
    owned = await _owned_file(request)
    if isinstance(owned, web.Response):
        return owned
    file_id = str(owned[1]["id"])
    state = request.app[STATE]
    if state.downloads.locked():
        message = "this gateway is sending other downloads; retry"
        return json_error(ErrorCode.RATE_LIMITED, message, UPLOAD_BUSY_RETRY_SECONDS)
    async with state.downloads, state.files.reading(file_key(file_id)) as stored:
        if stored is None:
            return web.json_response(not_found_body("File", file_id), status=404)
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        response.content_length = stored.length
        await response.prepare(request)
        async for chunk in stored.chunks(DOWNLOAD_CHUNK_BYTES):
            # Waits while the client is slow to read; one that stops reading lets go.
            async with asyncio.timeout(DOWNLOAD_STALL_SECONDS):
                await response.write(chunk)
        await response.write_eof()
        return response


async def delete_file(request: web.Request) -> web.Response:
    """`DELETE /v1/files/{file_id}`."""
    state = request.app[STATE]
    owned = await _owned_file(request)
    if isinstance(owned, web.Response):
        return owned
    owner, file_id = owned[0], str(owned[1]["id"])
    await state.registry.delete_object(owner, file_id)
    await state.files.delete(file_key(file_id))
    return web.json_response({"id": file_id, "object": "file", "deleted": True})


async def list_files(request: web.Request) -> web.Response:
    """`GET /v1/files` (`purpose`, `limit`, `after`, `order`), newest first by default."""
    state = request.app[STATE]
    principal = await request_principal(request)
    if isinstance(principal, web.Response):
        return principal
    query = request.query
    limit = list_limit(query.get("limit"), FILE_LIST_LIMIT_MAX, FILE_LIST_LIMIT_MAX)
    if isinstance(limit, web.Response):
        return limit
    order = query.get("order", "desc")
    if order not in {"asc", "desc"}:
        return json_error(ErrorCode.INVALID_REQUEST, "order: asc or desc", param="order")
    found, more = await state.registry.list_objects(
        principal.key_id,
        "file-",
        after=query.get("after"),
        limit=limit,
        newest_first=order == "desc",
        purpose=query.get("purpose"),
    )
    return web.json_response(page([stored.body for stored in found], more))


def list_limit(raw: str | None, default: int, most: int) -> int | web.Response:
    """A list's `limit` query parameter, from 1 to `most`; a 400 otherwise."""
    if raw is None:
        return default
    try:
        limit = int(raw)
    except ValueError:
        limit = 0
    if not 1 <= limit <= most:
        return json_error(ErrorCode.INVALID_REQUEST, f"limit: from 1 to {most}", param="limit")
    return limit


def page(data: list[dict[str, object]], more: bool) -> dict[str, object]:
    """OpenAI's cursor page of `data`."""
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": more,
    }


def setup_files(app: web.Application) -> None:
    """Add the Files API's routes."""
    app.router.add_post("/v1/files", create_file)
    app.router.add_get("/v1/files", list_files)
    app.router.add_get("/v1/files/{file_id}", get_file)
    app.router.add_delete("/v1/files/{file_id}", delete_file)
    app.router.add_get("/v1/files/{file_id}/content", file_content)
