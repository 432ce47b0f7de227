"""EC2 events the pool manager consumes: EventBridge → SQS (ARCHITECTURE.md).

`parse_event` is pure: an SQS message body (an EventBridge event, as JSON) becomes a
`PoolEvent`, `None` for a detail type the pool does not act on, or an `EventError` for a
body that is not such an event. `InterruptionQueue` is the thin I/O part: it receives and
deletes messages on the queue with one long-lived aioboto3 SQS client.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, Self

from botocore.config import Config

from spotgate.logging import get_logger
from spotgate.registry import aws_session
from spotgate.settings import SharedSettings

log = get_logger(__name__)

# No SQS type stubs are installed (only DynamoDB's), so the client is untyped.
SqsClient = Any

EventKind = Literal["interruption", "rebalance", "state-change"]

INTERRUPTION_DETAIL_TYPE = "EC2 Spot Instance Interruption Warning"
REBALANCE_DETAIL_TYPE = "EC2 Instance Rebalance Recommendation"
STATE_CHANGE_DETAIL_TYPE = "EC2 Instance State-change Notification"

SPOT_INTERRUPTION_NOTICE_SECONDS = 120.0
"""AWS interrupts a spot instance two minutes after the warning event."""

EC2_EVENT_PATTERN = {
    "source": ["aws.ec2"],
    "detail-type": [INTERRUPTION_DETAIL_TYPE, REBALANCE_DETAIL_TYPE, STATE_CHANGE_DETAIL_TYPE],
}
"""The EventBridge rule that feeds the pool's queue (the local stack and the CDK app)."""

SQS_MAX_MESSAGES_PER_RECEIVE = 10
SQS_MAX_WAIT_SECONDS = 20
"""Long polling: SQS holds a receive up to 20 s until a message arrives."""

CLIENT_CONNECT_TIMEOUT_SECONDS = 5
CLIENT_MAX_ATTEMPTS = 3
# A long poll answers after up to `SQS_MAX_WAIT_SECONDS`; the read timeout must outlast it.
CLIENT_READ_TIMEOUT_SECONDS = SQS_MAX_WAIT_SECONDS + 10


class EventError(ValueError):
    """A message body that is not a well-formed EC2 event (the message says what is wrong)."""


@dataclass(frozen=True, slots=True)
class PoolEvent:
    """One EC2 event about an instance, as the pool manager acts on it."""

    kind: EventKind
    instance_id: str
    at: float  # epoch seconds of the event (its `time`)
    deadline: float | None = None  # interruption: when the instance goes away
    state: str | None = None  # state-change: the new state (`running`, `terminated`, …)


def _field(mapping: Mapping[str, Any], name: str, where: str) -> str:
    value = mapping.get(name)
    if not isinstance(value, str) or not value:
        raise EventError(f"{where} has no string field {name!r}")
    return value


def parse_time(text: str) -> float:
    """Epoch seconds of an ISO-8601 event time (`2026-11-22T01:02:03Z`); UTC when unzoned."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError as err:
        raise EventError(f"event time {text!r} is not ISO-8601") from err
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


_KINDS: dict[str, EventKind] = {
    INTERRUPTION_DETAIL_TYPE: "interruption",
    REBALANCE_DETAIL_TYPE: "rebalance",
    STATE_CHANGE_DETAIL_TYPE: "state-change",
}


def parse_event(body: str) -> PoolEvent | None:
    """The pool event in an EventBridge message body; None for detail types not acted on."""
    try:
        event = json.loads(body)
    except json.JSONDecodeError as err:
        raise EventError(f"body is not JSON: {err.msg} at position {err.pos}") from err
    if not isinstance(event, dict):
        raise EventError("body is not a JSON object")
    detail_type = _field(event, "detail-type", "event")
    kind = _KINDS.get(detail_type)
    if kind is None:
        return None
    at = parse_time(_field(event, "time", "event"))
    detail = event.get("detail")
    if not isinstance(detail, dict):
        raise EventError(f"{detail_type!r} event has no object 'detail'")
    where = f"{detail_type!r} detail"
    instance_id = _field(detail, "instance-id", where)
    if kind == "interruption":
        # The action (terminate, stop, hibernate) does not change what the pool does: the
        # agent stops serving by the deadline either way. Still required: it proves the shape.
        _field(detail, "instance-action", where)
        return PoolEvent(kind, instance_id, at, deadline=at + SPOT_INTERRUPTION_NOTICE_SECONDS)
    if kind == "state-change":
        return PoolEvent(kind, instance_id, at, state=_field(detail, "state", where))
    return PoolEvent(kind, instance_id, at)


def interruption_warning(instance_id: str, deadline: float, region: str) -> dict[str, Any]:
    """The EventBridge event EC2 emits two minutes before reclaiming a spot instance.

    Dated `SPOT_INTERRUPTION_NOTICE_SECONDS` before `deadline`, as EC2 dates it, so a drill
    (`spotgate pool interrupt --in S`) can ask for any deadline.
    """
    emitted = deadline - SPOT_INTERRUPTION_NOTICE_SECONDS
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": INTERRUPTION_DETAIL_TYPE,
        "source": "aws.ec2",
        "account": "000000000000",
        "time": datetime.fromtimestamp(emitted, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": region,
        "resources": [],
        "detail": {"instance-id": instance_id, "instance-action": "terminate"},
    }


class InterruptionQueue:
    """The SQS queue EventBridge delivers EC2 events to: receive parsed events, delete them."""

    def __init__(self, client: SqsClient, queue_url: str) -> None:
        self._client = client
        self._queue_url = queue_url

    @classmethod
    @asynccontextmanager
    async def open(cls, settings: SharedSettings, queue_url: str) -> AsyncIterator[Self]:
        """Open the queue's SQS client for the life of the `async with` block."""
        aws = settings.aws
        config = Config(
            retries={"max_attempts": CLIENT_MAX_ATTEMPTS, "mode": "standard"},
            connect_timeout=CLIENT_CONNECT_TIMEOUT_SECONDS,
            read_timeout=CLIENT_READ_TIMEOUT_SECONDS,
        )
        async with AsyncExitStack() as stack:
            client = await stack.enter_async_context(
                aws_session(aws).client("sqs", endpoint_url=aws.endpoint_url, config=config)
            )
            yield cls(client, queue_url)

    async def receive(
        self,
        max_messages: int = SQS_MAX_MESSAGES_PER_RECEIVE,
        wait_seconds: int = SQS_MAX_WAIT_SECONDS,
    ) -> list[tuple[PoolEvent | None, str]]:
        """Up to `max_messages` (event, receipt handle) pairs; None for messages to drop.

        A message that is not a well-formed event comes back as None (with a warning that
        never includes the body): the caller deletes it, so one bad message cannot wedge
        the consumer by coming back after every visibility timeout.
        """
        answer = await self._client.receive_message(
            QueueUrl=self._queue_url,
            MaxNumberOfMessages=max_messages,
            WaitTimeSeconds=wait_seconds,
        )
        received: list[tuple[PoolEvent | None, str]] = []
        for message in answer.get("Messages", []):
            handle = str(message["ReceiptHandle"])
            try:
                event = parse_event(str(message.get("Body", "")))
            except EventError as err:
                log.warning(
                    "dropping malformed event message",
                    message_id=message.get("MessageId"),
                    reason=str(err),
                )
                event = None
            received.append((event, handle))
        return received

    async def delete(self, receipt_handle: str) -> None:
        """Delete a received message (the pool has acted on it, or it was malformed)."""
        await self._client.delete_message(QueueUrl=self._queue_url, ReceiptHandle=receipt_handle)
