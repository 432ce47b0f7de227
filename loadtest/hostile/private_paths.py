"""Operations paths spelled every way on the public port, and the policy on the page's files."""

from __future__ import annotations

import asyncio

from loadtest.hostile.client import Reply, http_call
from loadtest.hostile.report import Row
from loadtest.hostile.stack import HostileStack

PATH_TRICKS = (
    "/metrics",
    "/readyz",
    "/%6Detrics",
    "/%72eadyz",
    "//metrics",
    "/metrics/",
    "/./metrics",
    "/static/../metrics",
    "/%2E/readyz",
    "/metrics?x=1",
    "/METRICS",
)
"""Spellings a load balancer's exact path rule misses and a server may decode to the path."""
PAGE_PATHS = ("/", "/static/index.html", "/static/chat.js", "/static/no-such-file")
"""What a browser renders from the gateway: the page (both ways), its script, an error."""


def policy_problem(reply: Reply) -> str | None:
    """Why a response's security headers would let the page be framed or talk elsewhere."""
    policy = reply.headers.get("Content-Security-Policy")
    if policy is None:
        return "no Content-Security-Policy"
    directives = {}
    for directive in policy.split(";"):
        name, _, sources = directive.strip().partition(" ")
        directives[name] = sources.split()
    if directives.get("frame-ancestors") != ["'none'"]:
        return f"frame-ancestors {directives.get('frame-ancestors')}"
    connect = directives.get("connect-src", directives.get("default-src"))
    if connect is None or any(source.endswith(":") or "*" in source for source in connect):
        return f"connect-src {connect}: a whole scheme or a wildcard"
    if reply.headers.get("X-Content-Type-Options") != "nosniff":
        return "no X-Content-Type-Options: nosniff"
    return None


async def private_paths(stack: HostileStack) -> Row:
    """The public port's answers to operations paths, and the policy on what browsers render.

    `/metrics` and `/readyz` must be 404 there however spelled (and served on the operations
    port); the page, its files and an error must carry the policy.
    """
    row = Row(
        "gateway",
        "/metrics and /readyz spelled otherwise on the public port (`/%6Detrics`, `//metrics`, "
        "`/metrics/`, …); the policy on `/`, `/static/index.html`, its script and a 404; the "
        "operations port",
    )
    for path in PATH_TRICKS:
        reply = await asyncio.to_thread(http_call, stack.gateway_url, path, method="GET")
        leaked = b"spotgate_gateway" in reply.body or b"registry" in reply.body
        wrong = reply.status != 404 or leaked
        row.record(
            f"public {reply.status}",
            f"{path}: {reply.status} {reply.body[:80]!r}" if wrong else None,
        )
    for path in PAGE_PATHS:
        reply = await asyncio.to_thread(http_call, stack.gateway_url, path, method="GET")
        problem = policy_problem(reply)
        row.record(
            f"policy on {'an error' if reply.status >= 400 else 'a page or file'}",
            f"{path} ({reply.status}): {problem}" if problem else None,
        )
    for path, marker in (("/metrics", b"spotgate_gateway"), ("/readyz", b'"limits"')):
        reply = await asyncio.to_thread(http_call, stack.gateway_ops_url, path, method="GET")
        served = reply.status == 200 and marker in reply.body
        row.record(
            f"operations port {reply.status}",
            None if served else f"operations {path}: {reply.status} {reply.body[:80]!r}",
        )
    return row
