from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import pytest
from structlog.testing import capture_logs

from gpu_agent.imds import (
    FAILED_POLLS_PER_WARNING,
    ImdsClient,
    ImdsUnavailable,
    SpotNotice,
    failure_warned,
    parse_spot_action,
    watch_notices,
)
from spotgate.process import ChildProcesses, loopback_socket, socket_port
from tests.support.agents import IMDS_LAUNCHED_AT, Imds

GUARD_SECONDS = 60.0
"""A guard against a watcher that never answers, not a speed check."""


async def test_imds_v2_token_is_required(imds: Imds) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{imds.url}/latest/meta-data/instance-id") as response:
            assert response.status == 401
        async with http.put(f"{imds.url}/latest/api/token") as response:
            assert response.status == 400  # no TTL header


async def test_identity_and_notices_through_the_client(imds: Imds) -> None:
    async with aiohttp.ClientSession() as http:
        client = ImdsClient(http, imds.url)
        identity = await client.identity()
        assert (identity.instance_id, identity.lifecycle) == ("i-0test", "spot")
        # The ARN IAM names this instance by: the agent's registry row may be only that one.
        assert identity.agent_id == "arn:aws:ec2:us-east-1:123456789012:instance/i-0test"
        assert identity.launched_at == IMDS_LAUNCHED_AT  # the document's `pendingTime`
        # What the agent's boot script advertises it on (infra/cdk/stacks/agent_boot.sh).
        assert await client.get("/latest/meta-data/local-ipv4") == "127.0.0.1"
        assert await client.spot_notice() is None
        assert await client.rebalance_recommendation() is None

        async with http.post(f"{imds.url}/_emulator/rebalance"):
            pass
        async with http.post(f"{imds.url}/_emulator/spot-notice", json={"in_seconds": 120}):
            pass

        notice = await client.spot_notice()
        assert notice is not None
        assert notice.action == "terminate"
        assert abs(notice.deadline - (time.time() + 120)) < 2
        assert await client.rebalance_recommendation() is not None


async def test_watcher_reports_rebalance_then_interruption_once(imds: Imds) -> None:
    seen: list[object] = []
    rebalanced = asyncio.Event()

    async def on_interruption(notice: SpotNotice) -> None:
        seen.append(notice)

    async def on_rebalance(at: float) -> None:
        seen.append(at)
        rebalanced.set()

    async with aiohttp.ClientSession() as http:
        watcher = asyncio.create_task(
            watch_notices(
                ImdsClient(http, imds.url),
                poll_seconds=0.05,
                on_interruption=on_interruption,
                on_rebalance=on_rebalance,
            )
        )
        async with http.post(f"{imds.url}/_emulator/rebalance"):
            pass
        # Seen before the notice is given: posted together, one poll could find the notice
        # (its second question) but not the recommendation (its first) and return.
        await asyncio.wait_for(rebalanced.wait(), GUARD_SECONDS)
        async with http.post(f"{imds.url}/_emulator/spot-notice", json={"in_seconds": 60}):
            pass
        await asyncio.wait_for(watcher, GUARD_SECONDS)  # returns after the first interruption

    assert isinstance(seen[0], float)
    assert isinstance(seen[1], SpotNotice)
    assert len(seen) == 2


def test_spot_action_parsing() -> None:
    notice = parse_spot_action('{"action": "stop", "time": "2026-11-21T20:00:00Z"}')
    assert notice.action == "stop"
    assert notice.deadline == 1795291200.0
    with pytest.raises(KeyError):
        parse_spot_action('{"action": "stop"}')


async def test_the_emulator_answers_a_client_that_connected_before_it_started(
    tmp_path: Path,
) -> None:
    """An agent may ask for its identity before its IMDS emulator runs: it waits, it is answered."""
    sock = loopback_socket()  # listening: connections queue until the child accepts them
    reader, writer = await asyncio.open_connection("127.0.0.1", socket_port(sock))
    processes = ChildProcesses(tmp_path)
    args = ["gpu_agent.imds_emulator", "--listen-fd", str(sock.fileno()), "--instance-id", "i-0"]
    processes.start("imds", args, {}, (sock,))
    sock.close()
    try:
        writer.write(
            b"PUT /latest/api/token HTTP/1.0\r\nX-aws-ec2-metadata-token-ttl-seconds: 60\r\n\r\n"
        )
        await writer.drain()
        async with asyncio.timeout(60):
            status_line = await reader.readline()
        assert status_line.split()[1] == b"200", status_line
    finally:
        writer.close()
        processes.close()


@pytest.mark.parametrize(
    ("failed_polls", "warned"),
    [
        (1, True),
        (2, False),
        (FAILED_POLLS_PER_WARNING, False),
        (FAILED_POLLS_PER_WARNING + 1, True),
    ],
)
def test_an_unreachable_imds_is_warned_of_first_then_once_in_a_while(
    failed_polls: int, warned: bool
) -> None:
    assert failure_warned(failed_polls) is warned


class FailingImds:
    """An IMDS that fails `failing` polls, then answers with no notice; `answered` once it did."""

    def __init__(self, failing: int) -> None:
        self.failing = failing
        self.answered = asyncio.Event()

    async def rebalance_recommendation(self) -> float | None:
        if self.failing:
            self.failing -= 1
            raise ImdsUnavailable("no IMDSv2 token")
        self.answered.set()
        return None

    async def spot_notice(self) -> SpotNotice | None:
        return None


async def test_a_failing_imds_is_warned_of_in_a_few_lines_and_its_answer_again_told() -> None:
    async def never(_: object) -> None:
        raise AssertionError("no notice was given")

    imds = FailingImds(FAILED_POLLS_PER_WARNING + 5)
    with capture_logs() as logs:
        watcher = asyncio.create_task(
            watch_notices(
                imds,  # type: ignore[arg-type]
                poll_seconds=0,
                on_interruption=never,
                on_rebalance=never,
            )
        )
        await asyncio.wait_for(imds.answered.wait(), GUARD_SECONDS)
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)

    failed = [entry for entry in logs if entry["event"] == "imds poll failed"]
    assert len(failed) == FAILED_POLLS_PER_WARNING + 5  # every one, most at debug
    warned = [entry["failed_polls"] for entry in failed if entry["log_level"] == "warning"]
    assert warned == [1, FAILED_POLLS_PER_WARNING + 1]
    answered = [entry for entry in logs if entry["event"] == "imds answers again"]
    assert [entry["failed_polls"] for entry in answered] == [FAILED_POLLS_PER_WARNING + 5]
