"""Authentication on the gateway's routes, throttled: a client or key that fails too often waits.

`guarded` runs a credential check unless the caller's address or key failed too often
(`gateway.authlimit`), and counts its failures; `request_principal` is that check for the
HTTP routes, answering the error response itself.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from aiohttp import web

from gateway.auth import Principal
from gateway.state import STATE, GatewayState
from spotgate.apikeys import MalformedApiKey, looks_like_api_key, parse_api_key
from spotgate.protocol import ErrorCode
from spotgate.wsserver import AuthRefused, AuthUnavailable, bearer_token, json_error


class AuthThrottled(AuthRefused):
    """Too many failed authentications from this client or for this key: 429, wait."""

    code = ErrorCode.RATE_LIMITED

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def client_address(request: web.Request, trusted_proxy_hops: int) -> str:
    """The caller's address: the peer's, or the one the trusted proxies put in X-Forwarded-For.

    Each proxy appends the address it received from, so the entry `trusted_proxy_hops` from
    the end is the first one no client could have written.
    """
    if trusted_proxy_hops > 0:
        forwarded = [part.strip() for part in request.headers.get("X-Forwarded-For", "").split(",")]
        if len(forwarded) >= trusted_proxy_hops and forwarded[-trusted_proxy_hops]:
            return forwarded[-trusted_proxy_hops]
    return request.remote or "unknown"


Result = TypeVar("Result")


def _key_id(credential: str) -> str | None:
    if not looks_like_api_key(credential):
        return None
    try:
        return parse_api_key(credential).key_id
    except MalformedApiKey:
        return None


async def guarded(
    state: GatewayState,
    request: web.Request,
    credential: str,
    check: Callable[[str], Awaitable[Result]],
) -> Result:
    """Run a credential `check` unless this client or key failed too often; count failures.

    An API key this gateway found valid moments ago is no guess: it skips the budgets (and
    the limit store's round trip), so a busy key pays nothing for them, and its owner keeps
    working while someone else guesses at its id.
    """
    client = client_address(request, state.settings.trusted_proxy_hops)
    key_id = _key_id(credential)
    if not state.authenticator.recognises(credential):
        decision = await state.limits.auth_check(client, key_id, state.clock())
        if not decision.admitted:
            raise AuthThrottled(decision.reason, decision.retry_after)
    try:
        return await check(credential)
    except AuthUnavailable:
        raise  # the registry could not answer: not the caller's failure
    except AuthRefused:
        await state.limits.auth_failed(client, key_id, state.clock())
        raise


async def authenticated(
    request: web.Request, check: Callable[[str], Awaitable[Result]], missing: str
) -> Result | web.Response:
    """What a `guarded` `check` makes of the request's bearer credential, or the refusal."""
    state = request.app[STATE]
    credential = bearer_token(request)
    if credential is None:
        return json_error(ErrorCode.UNAUTHORIZED, missing)
    try:
        return await guarded(state, request, credential, check)
    except AuthRefused as err:
        state.metrics.rejections.labels(reason=err.code.value).inc()
        return json_error(err.code, str(err), err.retry_after)


async def request_principal(request: web.Request) -> Principal | web.Response:
    """The caller of an HTTP route (API key or token), or the error response refusing it."""
    authenticate = request.app[STATE].authenticator.authenticate
    return await authenticated(request, authenticate, "missing 'Authorization: Bearer <key>'")
