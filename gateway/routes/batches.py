"""OpenAI's Batch API: `/v1/batches` (create, list), `/v1/batches/{id}`, `…/cancel`.

The routes record what is asked; the replicas' batch workers (`gateway.batch_worker`) run
it. A key sees only its own batches.
"""

from __future__ import annotations

from aiohttp import web

from gateway.guard import request_principal
from gateway.routes.files import list_limit, page
from gateway.state import STATE
from spotgate.openai_batches import (
    ENDED,
    FILE_PURPOSE,
    LIST_LIMIT_MAX,
    BatchCreateRequest,
    batch_as_shown,
    new_batch,
    not_found_body,
)
from spotgate.openai_http import read_body
from spotgate.protocol import ErrorCode
from spotgate.registry import object_id
from spotgate.wsserver import json_error

LIST_LIMIT_DEFAULT = 20


async def create_batch(request: web.Request) -> web.Response:
    """`POST /v1/batches`: a batch of the requests in an uploaded `batch` file."""
    state = request.app[STATE]
    principal = await request_principal(request)
    if isinstance(principal, web.Response):
        return principal
    body = await read_body(request, BatchCreateRequest, state.settings.http_body_timeout_seconds)
    if isinstance(body, web.Response):
        return body
    source = await state.registry.get_object(principal.key_id, body.input_file_id)
    if source is None or source.get("purpose") != FILE_PURPOSE:
        message = f"input_file_id: no `batch` file {body.input_file_id} (upload it first)"
        return json_error(ErrorCode.INVALID_REQUEST, message, param="input_file_id")
    now = state.clock()
    expires_after = body.output_expires_after.seconds if body.output_expires_after else None
    batch = new_batch(object_id("batch_", now), body, int(now), expires_after)
    await state.registry.create_batch(principal.key_id, batch)
    state.batch_created.set()
    return web.json_response(batch_as_shown(batch, None))


async def get_batch(request: web.Request) -> web.Response:
    """`GET /v1/batches/{batch_id}`."""
    principal = await request_principal(request)
    if isinstance(principal, web.Response):
        return principal
    batch_id = request.match_info["batch_id"]
    stored = await request.app[STATE].registry.get_batch(principal.key_id, batch_id)
    if stored is None:
        return web.json_response(not_found_body("Batch", batch_id), status=404)
    return web.json_response(batch_as_shown(stored.body, stored.cancel_requested_at))


async def list_batches(request: web.Request) -> web.Response:
    """`GET /v1/batches` (`after`, `limit`), newest first."""
    principal = await request_principal(request)
    if isinstance(principal, web.Response):
        return principal
    limit = list_limit(request.query.get("limit"), LIST_LIMIT_DEFAULT, LIST_LIMIT_MAX)
    if isinstance(limit, web.Response):
        return limit
    found, more = await request.app[STATE].registry.list_objects(
        principal.key_id, "batch_", after=request.query.get("after"), limit=limit, newest_first=True
    )
    shown = [batch_as_shown(stored.body, stored.cancel_requested_at) for stored in found]
    return web.json_response(page(shown, more))


async def cancel_batch(request: web.Request) -> web.Response:
    """`POST /v1/batches/{batch_id}/cancel`: `cancelling`, then `cancelled` with what ran."""
    state = request.app[STATE]
    principal = await request_principal(request)
    if isinstance(principal, web.Response):
        return principal
    batch_id = request.match_info["batch_id"]
    stored = await state.registry.request_cancel(principal.key_id, batch_id, int(state.clock()))
    if stored is None:
        return web.json_response(not_found_body("Batch", batch_id), status=404)
    status = stored.body.get("status")
    if status in ENDED and status != "cancelled":
        message = f"batch {batch_id} is {status}: only a batch not ended can be cancelled"
        error = json_error(ErrorCode.INVALID_REQUEST, message, param="batch_id")
        error.set_status(409)
        return error
    state.batch_created.set()
    return web.json_response(batch_as_shown(stored.body, stored.cancel_requested_at))


def setup_batches(app: web.Application) -> None:
    """Add the Batch API's routes."""
    app.router.add_post("/v1/batches", create_batch)
    app.router.add_get("/v1/batches", list_batches)
    app.router.add_get("/v1/batches/{batch_id}", get_batch)
    app.router.add_post("/v1/batches/{batch_id}/cancel", cancel_batch)
