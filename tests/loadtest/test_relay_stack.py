"""The relay benchmark's paths: every run gets a token to the agent that outlives it."""

from __future__ import annotations

import asyncio
import sys
import time
from subprocess import PIPE, Popen

import aiohttp

from loadtest.bench.harness import Server
from loadtest.bench.relay_stack import AgentToken, RelayPaths
from spotgate.settings import TOKEN_TTL_MAX_SECONDS
from spotgate.tokens import GATEWAY_SUBJECT_PREFIX, KeyRing, SigningKey, verify

ISSUER = "http://127.0.0.1:1"


def test_a_renewed_token_lives_the_longest_a_token_may_and_is_what_the_direct_paths_send() -> None:
    ring = KeyRing([SigningKey.generate()])
    token = AgentToken(ring, ISSUER)
    first = token.headers["Authorization"].removeprefix("Bearer ")  # from the start
    second = token.renew()
    assert token.headers == {"Authorization": f"Bearer {second}"}
    almost_expired = time.time() + TOKEN_TTL_MAX_SECONDS - 60
    for issued in (first, second):
        claims = verify(ring, issued, issuer=ISSUER, now=almost_expired)
        assert claims.sub.startswith(GATEWAY_SUBJECT_PREFIX)


def test_each_run_of_a_direct_path_renews_its_token_and_keeps_its_server() -> None:
    token = AgentToken(KeyRing([SigningKey.generate()]), ISSUER)
    with Popen([sys.executable, "-c", "input()"], stdin=PIPE) as process:
        direct = Server("direct", "http://127.0.0.1:1", token.headers, process, "synth")
        paths = RelayPaths({"direct": direct}, token, start_litellm=None)

        async def two_runs() -> list[str]:
            sent = []
            async with aiohttp.ClientSession() as http:
                for _ in range(2):
                    assert await paths.before_run(http, direct) is direct
                    sent.append(direct.headers["Authorization"])
            return sent

        try:
            first, second = asyncio.run(two_runs())
        finally:
            process.kill()
    assert first != second
