"""One request of a batch, run as its key's own request to the endpoint would run.

The body is read by the endpoint's request model and relayed like any stream of the key
(admission, limits, usage) in the flex tier, behind every interactive stream, and its answer
is the JSON the endpoint would have sent (`stream` is always off). An answer the key may get
by waiting (rate limited, no capacity, the gateway going away) is not the request's result:
the batch runs it again later.
"""

from __future__ import annotations

import json
import time
from contextlib import aclosing
from dataclasses import dataclass, replace
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from gateway.auth import Principal
from gateway.relay import RelayOutcome
from gateway.state import GatewayState
from gateway.streams import admitted_frames, stream_refusal
from spotgate.openai_api import ChatCompletionRequest, CompletionRequest, validation_message
from spotgate.openai_http import collected, collected_response
from spotgate.openai_replies import ForcedTools, Kind, completion_id, error_body
from spotgate.openai_response_writer import ResponseWriter, response_id
from spotgate.openai_responses import ResponsesRequest, responses_param
from spotgate.protocol import ErrorCode
from spotgate.wsserver import json_error

RETRIED_STATUSES = frozenset({408, 429, 503})
"""Answers that say "later", not "no": the request runs again (OpenAI's batches retry too)."""


@dataclass(frozen=True, slots=True)
class RequestResult:
    """A request's HTTP status and JSON body; `retry_after`: run it again after this long.

    `served_seconds`: how long it held an agent (its time less its first wait in the queue).
    """

    status: int
    body: dict[str, Any]
    retry_after: float | None = None
    served_seconds: float = 0.0

    @property
    def final(self) -> bool:
        """Whether this is the request's result (else it runs again)."""
        return self.status not in RETRIED_STATUSES


def _result(response: web.Response) -> RequestResult:
    retry_after = response.headers.get("Retry-After")
    body = json.loads(response.body) if isinstance(response.body, bytes) else {}
    return RequestResult(response.status, body, float(retry_after) if retry_after else None)


RequestModel = ChatCompletionRequest | CompletionRequest | ResponsesRequest
REQUEST_MODELS: dict[str, type[RequestModel]] = {
    "/v1/chat/completions": ChatCompletionRequest,
    "/v1/completions": CompletionRequest,
    "/v1/responses": ResponsesRequest,
}
"""What reads a request's body, by the batch's endpoint."""


def _request(endpoint: str, body: dict[str, Any]) -> RequestModel | RequestResult:
    model = REQUEST_MODELS[endpoint]
    try:
        return model.model_validate({**body, "stream": False})
    except ValidationError as err:
        message, where = validation_message(err.errors(include_url=False)[0])
        if model is ResponsesRequest:
            where = responses_param(where)
        return RequestResult(400, error_body(ErrorCode.INVALID_REQUEST, message, where))


async def run_request(
    state: GatewayState,
    principal: Principal,
    endpoint: str,
    body: dict[str, Any],
    wait_seconds: float,
) -> RequestResult:
    """The endpoint's answer to `body`, sent by `principal`'s key without streaming.

    It waits for agents up to `wait_seconds` (the batch's window), so a request preempted
    for an interactive stream resumes where it was cut, charged once, however long it waits.
    """
    request = _request(endpoint, body)
    if isinstance(request, RequestResult):
        return request
    if isinstance(request, ResponsesRequest):
        rid = response_id()
        frame = request.to_generate_frame(rid, session=None)
    else:
        kind: Kind = "chat" if isinstance(request, ChatCompletionRequest) else "text"
        cid = completion_id(kind)
        frame = request.to_generate_frame(cid, session=None)
    frame = frame.model_copy(update={"service_tier": "flex"})  # behind every interactive stream
    refusal = stream_refusal(state, frame, principal)
    if refusal is not None:
        param = refusal.param
        if isinstance(request, ResponsesRequest):
            param = responses_param(param)
        return _result(json_error(refusal.code, refusal.message, param=param))
    outcome = RelayOutcome()
    started = time.monotonic()
    relayed = admitted_frames(state, frame, principal, outcome, wait_seconds=wait_seconds)
    async with aclosing(relayed) as frames:
        if isinstance(request, ResponsesRequest):
            writer = ResponseWriter(request, rid, ForcedTools.of(frame))
            answer = await collected_response(frames, writer)
        else:
            answer = await collected(
                frames,
                kind=kind,
                cid=cid,
                model=request.model,
                forced=ForcedTools.of(frame),
                service_tier=request.served_tier,
            )
    served_seconds = time.monotonic() - started - outcome.queue_ms / 1000
    return replace(_result(answer), served_seconds=max(0.0, served_seconds))
