"""EC2 events from EventBridge: parsing (pure) and the SQS queue (moto's server)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from structlog.testing import capture_logs

from pool_manager.events import (
    EventError,
    InterruptionQueue,
    PoolEvent,
    interruption_warning,
    parse_event,
)
from spotgate.registry import aws_session
from stack.emulator import AwsEmulator

# The sample events of the AWS documentation (EC2 user guide: spot interruption notices,
# rebalance recommendations; EventBridge: EC2 state-change), with real values filled in.
INTERRUPTION = {
    "version": "0",
    "id": "12345678-1234-1234-1234-123456789012",
    "detail-type": "EC2 Spot Instance Interruption Warning",
    "source": "aws.ec2",
    "account": "123456789012",
    "time": "2026-11-22T01:02:03Z",
    "region": "us-east-2",
    "resources": ["arn:aws:ec2:us-east-2:123456789012:instance/i-1234567890abcdef0"],
    "detail": {"instance-id": "i-1234567890abcdef0", "instance-action": "terminate"},
}
REBALANCE = {
    "version": "0",
    "id": "12345678-1234-1234-1234-123456789012",
    "detail-type": "EC2 Instance Rebalance Recommendation",
    "source": "aws.ec2",
    "account": "123456789012",
    "time": "2026-11-22T01:02:03Z",
    "region": "us-east-2",
    "resources": ["arn:aws:ec2:us-east-2:123456789012:instance/i-1234567890abcdef0"],
    "detail": {"instance-id": "i-1234567890abcdef0"},
}
STATE_CHANGE = {
    "id": "7bf73129-1428-4cd3-a780-95db273d1602",
    "detail-type": "EC2 Instance State-change Notification",
    "source": "aws.ec2",
    "account": "123456789012",
    "time": "2026-11-22T01:02:03Z",
    "region": "us-east-1",
    "resources": ["arn:aws:ec2:us-east-1:123456789012:instance/i-abcd1111"],
    "detail": {"instance-id": "i-abcd1111", "state": "shutting-down"},
}
SCHEDULED_CHANGE = {
    "version": "0",
    "id": "7fb1e9e4-e9c1-4e7b-bd4e-0f0c1c6a2d3e",
    "detail-type": "AWS Health Event",
    "source": "aws.health",
    "account": "123456789012",
    "time": "2026-11-22T01:02:03Z",
    "region": "us-east-1",
    "resources": [],
    "detail": {"service": "EC2"},
}

AT = datetime(2026, 11, 22, 1, 2, 3, tzinfo=UTC).timestamp()


def with_(
    event: dict[str, Any],
    top: dict[str, Any] | None = None,
    detail: dict[str, Any] | None = None,
) -> str:
    """The event as a message body with top-level or `detail` fields changed (None removes)."""
    changed = json.loads(json.dumps(event))
    for target, changes in ((changed, top or {}), (changed.get("detail"), detail or {})):
        for name, value in changes.items():
            if value is None:
                target.pop(name, None)
            else:
                target[name] = value
    return json.dumps(changed)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param(
            json.dumps(INTERRUPTION),
            PoolEvent("interruption", "i-1234567890abcdef0", AT, deadline=AT + 120),
            id="interruption",
        ),
        pytest.param(
            with_(INTERRUPTION, detail={"instance-action": "hibernate"}),
            PoolEvent("interruption", "i-1234567890abcdef0", AT, deadline=AT + 120),
            id="interruption-hibernate",
        ),
        pytest.param(
            json.dumps(REBALANCE),
            PoolEvent("rebalance", "i-1234567890abcdef0", AT),
            id="rebalance",
        ),
        pytest.param(
            json.dumps(STATE_CHANGE),
            PoolEvent("state-change", "i-abcd1111", AT, state="shutting-down"),
            id="state-change",
        ),
        pytest.param(
            with_(STATE_CHANGE, {"time": "2026-11-22T01:02:03.500+00:00"}),
            PoolEvent("state-change", "i-abcd1111", AT + 0.5, state="shutting-down"),
            id="fractional-offset-time",
        ),
        pytest.param(
            with_(STATE_CHANGE, {"time": "2026-11-22T03:02:03+02:00"}),
            PoolEvent("state-change", "i-abcd1111", AT, state="shutting-down"),
            id="zoned-time",
        ),
        pytest.param(json.dumps(SCHEDULED_CHANGE), None, id="unknown-detail-type"),
        pytest.param(
            with_(INTERRUPTION, {"detail-type": "EC2 Spot Instance Request Fulfillment"}),
            None,
            id="other-ec2-detail-type",
        ),
    ],
)
def test_parse_event(body: str, expected: PoolEvent | None) -> None:
    assert parse_event(body) == expected


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        pytest.param("not json {", "not JSON", id="not-json"),
        pytest.param("", "not JSON", id="empty"),
        pytest.param("[1, 2]", "not a JSON object", id="array"),
        pytest.param(with_(INTERRUPTION, {"detail-type": None}), "'detail-type'", id="no-type"),
        pytest.param(with_(INTERRUPTION, {"time": None}), "'time'", id="no-time"),
        pytest.param(with_(REBALANCE, {"time": "yesterday"}), "ISO-8601", id="bad-time"),
        pytest.param(with_(REBALANCE, {"detail": None}), "'detail'", id="no-detail"),
        pytest.param(with_(REBALANCE, {"detail": "x"}), "'detail'", id="detail-not-object"),
        pytest.param(
            with_(INTERRUPTION, detail={"instance-id": None}), "'instance-id'", id="no-instance"
        ),
        pytest.param(
            with_(INTERRUPTION, detail={"instance-action": None}),
            "'instance-action'",
            id="no-action",
        ),
        pytest.param(with_(STATE_CHANGE, detail={"state": None}), "'state'", id="no-state"),
        pytest.param(with_(STATE_CHANGE, detail={"instance-id": 7}), "'instance-id'", id="id-int"),
    ],
)
def test_parse_event_rejects_malformed(body: str, reason: str) -> None:
    with pytest.raises(EventError, match=reason):
        parse_event(body)


def test_event_error_is_a_value_error() -> None:
    assert issubclass(EventError, ValueError)


async def test_queue_receives_parsed_events_and_deletes(aws: AwsEmulator) -> None:
    settings = aws.settings()
    endpoint = settings.aws.endpoint_url
    async with aws_session(settings.aws).client("sqs", endpoint_url=endpoint) as sqs:
        queue_url = (await sqs.create_queue(QueueName="spotgate-events"))["QueueUrl"]
        await sqs.send_message(QueueUrl=queue_url, MessageBody=json.dumps(INTERRUPTION))
        await sqs.send_message(QueueUrl=queue_url, MessageBody="garbage, not an event")

        async with InterruptionQueue.open(settings, queue_url) as queue:
            with capture_logs() as logs:
                received = await queue.receive(wait_seconds=0)
            warnings = [entry for entry in logs if entry["log_level"] == "warning"]
            assert len(warnings) == 1
            assert "not JSON" in warnings[0]["reason"]
            assert "garbage" not in repr(warnings)  # the body is never logged
            events = [event for event, _ in received]
            assert sorted(events, key=lambda event: event is None) == [
                PoolEvent("interruption", "i-1234567890abcdef0", AT, deadline=AT + 120),
                None,
            ]
            for _, handle in received:
                await queue.delete(handle)
            assert await queue.receive(wait_seconds=0) == []

        attributes = await sqs.get_queue_attributes(
            QueueUrl=queue_url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )
    # Deleted, not merely in flight (in-flight messages are invisible to `receive` too).
    assert attributes["Attributes"] == {
        "ApproximateNumberOfMessages": "0",
        "ApproximateNumberOfMessagesNotVisible": "0",
    }


def test_a_drill_warning_parses_back_to_its_deadline() -> None:
    deadline = 1_800_000_100.0
    event = parse_event(json.dumps(interruption_warning("i-0abc", deadline, "us-east-1")))
    assert event is not None
    assert (event.kind, event.instance_id, event.deadline) == ("interruption", "i-0abc", deadline)
