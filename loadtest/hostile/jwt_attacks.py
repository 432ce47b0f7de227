"""Forged JWTs (alg none, HS256 with the public key, kid injection, …) and retired keys."""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import secrets
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import websockets
from aiohttp import web

from loadtest.hostile.client import (
    PING,
    REQUEST_TIMEOUT_SECONDS,
    Reply,
    fresh_address,
    http_attempt,
    ws_upgrade,
    ws_url,
)
from loadtest.hostile.limits import AIOHTTP_MAX_FIELD_BYTES, MAX_FRAME_BYTES
from loadtest.hostile.report import Row
from loadtest.hostile.stack import HostileStack
from spotgate.process import serving_on_loopback
from spotgate.tokens import AGENT_AUDIENCE, SigningKey


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def compact(header: dict[str, Any], payload: dict[str, Any], sign: Callable[[bytes], bytes]) -> str:
    """A compact JWS with any header and any signature function."""
    signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(payload).encode())}"
    return f"{signing_input}.{_b64(sign(signing_input.encode()))}"


def claims(issuer: str, subject: str, now: float, **changes: Any) -> dict[str, Any]:
    """Claims a spotgate token would carry, with `changes`."""
    base = {
        "iss": issuer,
        "aud": AGENT_AUDIENCE,
        "sub": subject,
        "iat": int(now),
        "nbf": int(now),
        "exp": int(now) + 300,
        "jti": secrets.token_urlsafe(8),
    }
    return {**base, **changes}


def attack_tokens(
    stack: HostileStack, foreign_jwks_url: str, foreign: SigningKey
) -> dict[str, list[str]]:
    """Forged tokens by attack, all naming a real key id as their subject."""
    now = time.time()
    trusted = stack.signing_key
    payload = claims(stack.gateway_url, stack.keys["fuzz"].record.key_id, now)
    raw_public = base64.urlsafe_b64decode(trusted.verify_key.to_jwk()["x"] + "=")
    public_forms = [
        raw_public,
        trusted.verify_key.to_pem().encode(),
        trusted.verify_key.to_jwk()["x"].encode(),
        json.dumps(trusted.verify_key.to_jwk()).encode(),
    ]
    foreign_jwk = foreign.verify_key.to_jwk()
    ed_foreign = foreign.private_key.sign
    ed_trusted = trusted.private_key.sign
    kid = trusted.kid

    def hs(secret: bytes, digest: str) -> Callable[[bytes], bytes]:
        return lambda data: hmac.new(secret, data, digest).digest()

    return {
        "alg none (none, None, NONE; with and without the trusted kid)": [
            compact({"alg": alg, "typ": "JWT", **extra}, payload, lambda _data: b"")
            for alg in ("none", "None", "NONE")
            for extra in ({}, {"kid": kid})
        ],
        "HS256/HS512 keyed with the public key (raw, PEM, JWK x, JWK JSON)": [
            compact({"alg": alg, "kid": kid}, payload, hs(form, digest))
            for form in public_forms
            for alg, digest in (("HS256", "sha256"), ("HS512", "sha512"))
        ],
        "kid injection (../../etc/passwd, SQL, foreign JWKS URL, 5000 chars, NUL, object; "
        "jku, x5u and embedded jwk headers)": [
            *(
                compact({"alg": "EdDSA", "kid": bad}, payload, ed_foreign)
                for bad in (
                    "../../etc/passwd",
                    "' OR '1'='1' --",
                    foreign_jwks_url,
                    "k" * 5000,
                    "\x00",
                    {"$ne": ""},
                )
            ),
            compact(
                {"alg": "EdDSA", "kid": foreign.kid, "jku": foreign_jwks_url}, payload, ed_foreign
            ),
            compact(
                {"alg": "EdDSA", "kid": foreign.kid, "x5u": foreign_jwks_url}, payload, ed_foreign
            ),
            compact({"alg": "EdDSA", "kid": foreign.kid, "jwk": foreign_jwk}, payload, ed_foreign),
        ],
        "trusted kid, foreign signature": [
            compact({"alg": "EdDSA", "kid": kid}, payload, ed_foreign),
            compact({"alg": "EdDSA", "kid": kid, "jwk": foreign_jwk}, payload, ed_foreign),
        ],
        "huge tokens, signed by the trusted key (9 KB, 64 KB, 1 MB)": [
            compact({"alg": "EdDSA", "kid": kid}, {**payload, "pad": "p" * size}, ed_trusted)
            for size in (9_000, 64_000, 1_000_000)
        ],
        "expired, wrong audience, wrong issuer (trusted key)": [
            compact(
                {"alg": "EdDSA", "kid": kid}, claims(stack.gateway_url, "x", now - 3600), ed_trusted
            ),
            compact({"alg": "EdDSA", "kid": kid}, {**payload, "aud": "someone-else"}, ed_trusted),
            compact(
                {"alg": "EdDSA", "kid": kid}, {**payload, "iss": "https://evil.example"}, ed_trusted
            ),
        ],
    }


async def first_frame_auth(url: str, credential: str) -> str:
    """A browser-style `auth` first frame; what the server answered."""
    sock_url = ws_url(url)
    try:
        async with websockets.connect(
            sock_url,
            max_size=None,
            proxy=None,
            compression=None,
            close_timeout=2,
            local_addr=(fresh_address(), 0),
        ) as ws:
            await ws.send(json.dumps({"type": "auth", "token": credential}))
            await ws.send(PING)
            reply = json.loads(await asyncio.wait_for(ws.recv(), REQUEST_TIMEOUT_SECONDS))
            if reply.get("type") == "pong":
                return "accepted"
            await asyncio.wait_for(ws.wait_closed(), REQUEST_TIMEOUT_SECONDS)
            return f"error frame {reply.get('code')}, close {ws.close_code}"
    except websockets.ConnectionClosed as err:
        # Closed while the client was still writing a huge frame, the close frame may be lost.
        return f"close {err.rcvd.code}" if err.rcvd else "connection dropped"


def judge_refusal(row: Row, where: str, reply: Reply, *, huge: bool) -> None:
    """A forged token must be refused: 401 with a JSON error (or the parser's 400 if huge)."""
    outcome = f"{where}: {reply.outcome()}"
    if reply.status in (101, 200):
        row.record(outcome, f"{where} accepted a forged token")
    elif reply.status == 401 and reply.error is not None:
        row.record(f"{where}: 401 {reply.error['message']}")
    elif huge and (reply.status in (0, 400)):
        row.record(f"{where}: {reply.status or 'connection closed'} (header beyond 8 KiB limit)")
    else:
        row.record(outcome, f"{where} answered {reply.status} {reply.body[:80]!r}")


async def try_token(row: Row, stack: HostileStack, token: str) -> None:
    """One token against both services: HTTP, websocket header and websocket first frame."""
    huge = len(token) > AIOHTTP_MAX_FIELD_BYTES
    for service, url in (("gateway", stack.gateway_url), ("agent", stack.agent_url)):
        judge_refusal(
            row,
            f"{service} http",
            await http_attempt(url, "/v1/chat/completions", token),
            huge=huge,
        )
        auth = {"Authorization": f"Bearer {token}"}
        judge_refusal(row, f"{service} ws", await ws_upgrade(url, auth), huge=huge)
        frame = await first_frame_auth(url, token)
        big_frame = len(token) > MAX_FRAME_BYTES
        ok = frame.endswith("close 1008") or (
            big_frame and frame in ("close 1009", "connection dropped")
        )
        row.record(f"{service} auth frame: {frame}", None if ok else f"{service}: {frame}")


@asynccontextmanager
async def foreign_jwks_server(foreign: SigningKey) -> AsyncIterator[tuple[str, list[str]]]:
    """An attacker's JWKS on loopback; the list records every fetch (there must be none)."""
    fetched: list[str] = []

    async def jwks(request: web.Request) -> web.Response:
        fetched.append(request.path)
        return web.json_response({"keys": [foreign.verify_key.to_jwk()]})

    app = web.Application()
    app.router.add_get("/{tail:.*}", jwks)
    async with serving_on_loopback(app) as url:
        yield f"{url}/.well-known/jwks.json", fetched


async def jwt_attacks(stack: HostileStack) -> list[Row]:
    """Forged tokens against gateway and agent, one row per attack."""
    foreign = SigningKey.generate()
    rows = []
    async with foreign_jwks_server(foreign) as (url, fetched):
        for attack, tokens in attack_tokens(stack, url, foreign).items():
            row = Row("gateway + agent", f"JWT: {attack}")
            for token in tokens:
                await try_token(row, stack, token)
            rows.append(row)
        if fetched:
            rows[2].problems.append(f"a service fetched the attacker's JWKS: {fetched}")
        else:
            rows[2].notes.append("the attacker's JWKS server was never contacted")
    return rows


async def replay_after_rotation(stack: HostileStack) -> Row:
    """A valid token, replayed after the key that signed it was retired from the gateway."""
    row = Row(
        "gateway + agent",
        "JWT: valid token replayed after its signing key was retired "
        "(gateway restarted with a new key only)",
    )
    old = await stack.token("fuzz")
    before = await ws_upgrade(stack.agent_url, {"Authorization": f"Bearer {old}"})
    if before.status != 101:
        row.problems.append(f"the token did not work before rotation: {before.outcome()}")
    await stack.rotate_signing_key()
    await try_token(row, stack, old)
    fresh = await stack.token("fuzz")
    after = await ws_upgrade(stack.agent_url, {"Authorization": f"Bearer {fresh}"})
    if after.status != 101:
        row.problems.append(f"a token of the new key was refused: {after.outcome()}")
    row.notes.append("tokens of the new key: accepted")
    return row
