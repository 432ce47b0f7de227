"""What the side-by-side benchmarks share: where their servers' logs go, why a request failed."""

from __future__ import annotations

import errno
from pathlib import Path

import aiohttp
import pytest
from aiohttp import ClientOSError, ServerDisconnectedError

from loadtest.bench.harness import failure_kind, logs_dir


def test_logs_asked_for_are_kept_and_others_go_with_the_run(tmp_path: Path) -> None:
    kept = tmp_path / "kept" / "logs"
    with logs_dir(kept) as logs:
        (logs / "gateway.log").write_text("served")
    with logs_dir(None) as scratch:
        (scratch / "gateway.log").write_text("served")

    assert logs == kept
    assert (kept / "gateway.log").read_text() == "served"
    assert not scratch.exists()


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
