"""The OpenAI-compatible HTTP API: `/v1/models`, `/v1/chat/completions`, `/v1/completions`."""

from __future__ import annotations

from contextlib import aclosing

from aiohttp import web

from gateway.guard import request_principal
from gateway.relay import RelayOutcome
from gateway.state import STATE
from gateway.streams import admitted_frames, stream_refusal
from spotgate.openai_api import ChatCompletionRequest, CompletionRequest
from spotgate.openai_http import SseDeltas, read_body, respond, respond_response
from spotgate.openai_replies import ForcedTools, completion_id
from spotgate.openai_response_writer import ResponseWriter, response_id
from spotgate.openai_responses import ResponsesRequest, responses_param
from spotgate.wsserver import json_error


async def models(request: web.Request) -> web.Response:
    """`GET /v1/models`: what the caller's key may use of the models served here.

    Served: models with ready agents, and those that can scale from zero. A key is needed,
    as with OpenAI's: which models run here is nobody else's business. Each says its context,
    `max_model_len`, as vLLM's does: the most any of its agents holds (null while none has
    said, a model scaling from zero); the chat page keeps conversations within it.
    """
    principal = await request_principal(request)
    if isinstance(principal, web.Response):
        return principal
    state = request.app[STATE]
    view = state.dispatcher.view
    served = view.ready_models() | set(state.settings.models)
    names = sorted(served & principal.models if principal.models else served)
    data = []
    for name in names:
        limits = view.context_limits(name)
        data.append(
            {
                "id": name,
                "object": "model",
                "owned_by": "spotgate",
                "created": 0,
                "max_model_len": limits.max_model_len if limits else None,
            }
        )
    return web.json_response({"object": "list", "data": data})


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """`POST /v1/chat/completions` (SSE when `stream` is true)."""
    return await _openai(request, ChatCompletionRequest, "chat")


async def completions(request: web.Request) -> web.StreamResponse:
    """`POST /v1/completions` (SSE when `stream` is true)."""
    return await _openai(request, CompletionRequest, "text")


async def _openai(
    request: web.Request,
    model: type[ChatCompletionRequest] | type[CompletionRequest],
    kind: str,
) -> web.StreamResponse:
    state = request.app[STATE]
    principal = await request_principal(request)
    if isinstance(principal, web.Response):
        return principal
    body = await read_body(request, model, state.settings.http_body_timeout_seconds)
    if isinstance(body, web.Response):
        return body
    cid = completion_id("chat" if kind == "chat" else "text")
    frame = body.to_generate_frame(cid, session=request.headers.get("X-Session-Id"))
    refusal = stream_refusal(state, frame, principal)
    if refusal is not None:
        return json_error(refusal.code, refusal.message, param=refusal.param)
    # The handler drives the relay itself (no task, no queue between them): if the client
    # goes away, the failed write ends the handler and `aclosing` cancels the agent's stream.
    # Deltas that come while the client keeps up are written from the agent link's reader.
    direct = SseDeltas(request) if body.stream else None
    relayed = admitted_frames(state, frame, principal, RelayOutcome(), direct=direct)
    async with aclosing(relayed) as frames:
        return await respond(
            request,
            frames,
            kind="chat" if kind == "chat" else "text",
            cid=cid,
            model=body.model,
            stream=body.stream,
            include_usage=body.include_usage,
            forced=ForcedTools.of(frame),
            direct=direct,
            service_tier=body.served_tier,
        )


async def responses(request: web.Request) -> web.StreamResponse:
    """`POST /v1/responses`: the Responses API, stateless (events when `stream` is true)."""
    state = request.app[STATE]
    principal = await request_principal(request)
    if isinstance(principal, web.Response):
        return principal
    body = await read_body(request, ResponsesRequest, state.settings.http_body_timeout_seconds)
    if isinstance(body, web.Response):
        return body
    rid = response_id()
    frame = body.to_generate_frame(rid, session=request.headers.get("X-Session-Id"))
    refusal = stream_refusal(state, frame, principal)
    if refusal is not None:
        return json_error(refusal.code, refusal.message, param=responses_param(refusal.param))
    writer = ResponseWriter(body, rid, ForcedTools.of(frame))
    direct = SseDeltas(request) if body.stream else None
    relayed = admitted_frames(state, frame, principal, RelayOutcome(), direct=direct)
    async with aclosing(relayed) as frames:
        return await respond_response(request, frames, writer, stream=body.stream, direct=direct)


def setup_openai_compat(app: web.Application) -> None:
    """Add the OpenAI-compatible routes."""
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/responses", responses)
