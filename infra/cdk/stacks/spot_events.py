"""EC2's spot and instance events, delivered by EventBridge to the pool manager's SQS queue."""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from pool_manager.events import EC2_EVENT_PATTERN

MESSAGE_RETENTION_SECONDS = 60 * 60
"""An EC2 event older than an hour describes an instance long gone; no use keeping it."""
DLQ_RETENTION_DAYS = 14
MAX_RECEIVES = 5
"""A message the pool manager failed to handle five times goes to the dead-letter queue."""
VISIBILITY_TIMEOUT_SECONDS = 60
"""Longer than one reconcile pass, so a message is not handed out twice while acted on."""


def event_pattern() -> events.EventPattern:
    """`EC2_EVENT_PATTERN` as a CDK pattern; the pool manager's parser reads the same one."""
    unknown = set(EC2_EVENT_PATTERN) - {"source", "detail-type"}
    if unknown:
        raise ValueError(f"EC2_EVENT_PATTERN has fields the CDK app does not map: {unknown}")
    return events.EventPattern(
        source=list(EC2_EVENT_PATTERN["source"]),
        detail_type=list(EC2_EVENT_PATTERN["detail-type"]),
    )


class SpotEvents(Construct):
    """Interruption warnings, rebalance recommendations and state changes → encrypted queue."""

    def __init__(self, scope: Construct, construct_id: str) -> None:
        super().__init__(scope, construct_id)
        self.dead_letters = sqs.Queue(
            self,
            "DeadLetters",
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            retention_period=Duration.days(DLQ_RETENTION_DAYS),
            removal_policy=RemovalPolicy.DESTROY,
        )
        self.queue = sqs.Queue(
            self,
            "Queue",
            # SQS-managed keys: EventBridge can deliver to them without a key policy of ours.
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            retention_period=Duration.seconds(MESSAGE_RETENTION_SECONDS),
            visibility_timeout=Duration.seconds(VISIBILITY_TIMEOUT_SECONDS),
            dead_letter_queue=sqs.DeadLetterQueue(
                queue=self.dead_letters, max_receive_count=MAX_RECEIVES
            ),
            removal_policy=RemovalPolicy.DESTROY,
        )
        self.rule = events.Rule(
            self,
            "Ec2Events",
            description="EC2 spot interruption warnings, rebalance recommendations, state changes",
            event_pattern=event_pattern(),
        )
        self.rule.add_target(targets.SqsQueue(self.queue))
