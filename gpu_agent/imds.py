"""EC2 instance metadata (IMDSv2): identity at start, then spot notices every few seconds.

The base URL is a setting, so tests and the local pool point it at `gpu_agent.imds_emulator`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime

import aiohttp

from spotgate.logging import get_logger
from spotgate.registry import instance_agent_id

TOKEN_TTL_SECONDS = 21600
TOKEN_REFRESH_MARGIN_SECONDS = 60
REQUEST_TIMEOUT_SECONDS = 2.0
IDENTITY_DOCUMENT_PATH = "/latest/dynamic/instance-identity/document"
PARTITION_PATH = "/latest/meta-data/services/partition"
SPOT_ACTION_PATH = "/latest/meta-data/spot/instance-action"
REBALANCE_PATH = "/latest/meta-data/events/recommendations/rebalance"

log = get_logger(__name__)


class ImdsUnavailable(Exception):
    """The metadata service did not answer (not on EC2, or it is down)."""


@dataclass(frozen=True, slots=True)
class InstanceIdentity:
    """Who this instance is, as EC2 says."""

    instance_id: str
    instance_type: str
    zone: str
    lifecycle: str  # "spot" or "on-demand"
    region: str = "us-east-1"
    account: str = "123456789012"
    partition: str = "aws"
    launched_at: float = 0.0  # epoch seconds (the document's `pendingTime`); 0: unknown

    @property
    def agent_id(self) -> str:
        """The id the agent registers under: the instance's ARN."""
        return instance_agent_id(self.partition, self.region, self.account, self.instance_id)


@dataclass(frozen=True, slots=True)
class SpotNotice:
    """An interruption notice: what AWS will do, and when (epoch seconds)."""

    action: str
    deadline: float


def parse_spot_action(body: str) -> SpotNotice:
    """Read `{"action": "terminate", "time": "2026-11-21T20:00:00Z"}`."""
    document = json.loads(body)
    return SpotNotice(action=str(document["action"]), deadline=epoch_seconds(document["time"]))


def parse_rebalance(body: str) -> float:
    """Read `{"noticeTime": "…"}` as epoch seconds."""
    return epoch_seconds(json.loads(body)["noticeTime"])


def epoch_seconds(moment: object) -> float:
    """An IMDS time (`2026-11-21T20:00:00Z`) as epoch seconds."""
    return datetime.fromisoformat(str(moment).replace("Z", "+00:00")).timestamp()


class ImdsClient:
    """IMDSv2: a session token from PUT, then GETs that carry it."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str) -> None:
        self._session = session
        self._base_url = base_url.rstrip("/")
        self._token: str | None = None
        self._token_expires = 0.0

    async def _token_header(self) -> dict[str, str]:
        if self._token is None or time.monotonic() > self._token_expires:
            try:
                async with self._session.put(
                    f"{self._base_url}/latest/api/token",
                    headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_SECONDS)},
                    timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_SECONDS),
                ) as response:
                    response.raise_for_status()
                    self._token = await response.text()
            except (aiohttp.ClientError, TimeoutError) as err:
                raise ImdsUnavailable(f"no IMDSv2 token from {self._base_url}: {err}") from err
            self._token_expires = (
                time.monotonic() + TOKEN_TTL_SECONDS - TOKEN_REFRESH_MARGIN_SECONDS
            )
        return {"X-aws-ec2-metadata-token": self._token}

    async def get(self, path: str) -> str | None:
        """The text at `path`, or None when IMDS says 404 (no such notice)."""
        headers = await self._token_header()
        try:
            async with self._session.get(
                f"{self._base_url}{path}",
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_SECONDS),
            ) as response:
                if response.status == 404:
                    return None
                if response.status == 401:
                    self._token = None
                response.raise_for_status()
                return await response.text()
        except (aiohttp.ClientError, TimeoutError) as err:
            raise ImdsUnavailable(f"IMDS {path}: {err}") from err

    async def identity(self) -> InstanceIdentity:
        """Who this instance is: id, type, zone, lifecycle, launch time, ARN parts."""

        async def read(path: str) -> str:
            value = await self.get(path)
            if value is None:
                raise ImdsUnavailable(f"IMDS has no {path}")
            return value.strip()

        try:
            document = json.loads(await read(IDENTITY_DOCUMENT_PATH))
            account, region = str(document["accountId"]), str(document["region"])
            pending = document.get("pendingTime")
            launched_at = epoch_seconds(pending) if pending else 0.0
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise ImdsUnavailable(f"IMDS identity document unreadable: {err}") from err
        return InstanceIdentity(
            instance_id=await read("/latest/meta-data/instance-id"),
            instance_type=await read("/latest/meta-data/instance-type"),
            zone=await read("/latest/meta-data/placement/availability-zone"),
            lifecycle=await read("/latest/meta-data/instance-life-cycle"),
            region=region,
            account=account,
            partition=await read(PARTITION_PATH),
            launched_at=launched_at,
        )

    async def spot_notice(self) -> SpotNotice | None:
        """The pending interruption, if AWS has announced one."""
        body = await self.get(SPOT_ACTION_PATH)
        return parse_spot_action(body) if body else None

    async def rebalance_recommendation(self) -> float | None:
        """When AWS recommended rebalancing, if it has."""
        body = await self.get(REBALANCE_PATH)
        return parse_rebalance(body) if body else None


async def watch_notices(
    client: ImdsClient,
    *,
    poll_seconds: float,
    on_interruption: Callable[[SpotNotice], Awaitable[None]],
    on_rebalance: Callable[[float], Awaitable[None]],
) -> None:
    """Poll IMDS until cancelled; call each handler once, on the first notice of its kind."""
    rebalance_seen = False
    failed_polls = 0  # in a row
    while True:
        try:
            if not rebalance_seen and (at := await client.rebalance_recommendation()) is not None:
                rebalance_seen = True
                await on_rebalance(at)
            notice = await client.spot_notice()
            if notice is not None:
                await on_interruption(notice)
                return
        except (ImdsUnavailable, ValueError, KeyError) as err:
            failed_polls += 1
            level = logging.WARNING if failure_warned(failed_polls) else logging.DEBUG
            log.log(level, "imds poll failed", error=str(err), failed_polls=failed_polls)
        else:
            if failed_polls:
                log.info("imds answers again", failed_polls=failed_polls)
            failed_polls = 0
        await asyncio.sleep(poll_seconds)


FAILED_POLLS_PER_WARNING = 60
"""An IMDS that stays unreachable is warned of at its first failed poll, then once every this
many (5 minutes at the default 5-second poll): spot notices cannot be seen meanwhile, and a
line every poll would bury what else the log says."""


def failure_warned(failed_polls: int) -> bool:
    """Whether the `failed_polls`-th failed poll in a row is logged as a warning (else debug)."""
    return failed_polls % FAILED_POLLS_PER_WARNING == 1
