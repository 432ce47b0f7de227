"""What the side-by-side benchmarks share: why a request failed."""

from __future__ import annotations

import errno

import aiohttp
import pytest
from aiohttp import ClientOSError, ServerDisconnectedError

from loadtest.bench.harness import failure_kind


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (TimeoutError(), "timeout"),
        (ServerDisconnectedError(), "ServerDisconnectedError"),
        (ClientOSError(errno.ECONNRESET, "reset by peer"), "ClientOSError (ECONNRESET)"),
        (aiohttp.ClientError("no_capacity: every agent is busy"), "no_capacity"),
    ],
)
def test_a_failed_request_says_what_ended_it(
    error: aiohttp.ClientError | TimeoutError, kind: str
) -> None:
    assert failure_kind(error) == kind
