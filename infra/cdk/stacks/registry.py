"""The DynamoDB tables of ARCHITECTURE.md: agents, launches, keys, demand, usage and batches."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aws_cdk import RemovalPolicy
from aws_cdk import aws_dynamodb as dynamodb
from constructs import Construct

from spotgate.registry import BY_CHANGE_INDEX, BY_MODEL_INDEX, BY_WORK_INDEX, FEED_FIELDS
from spotgate.settings import SharedSettings
from spotgate.settings_env_names import env_names
from stacks.common import acknowledge
from stacks.config import DeployConfig

TTL_ATTRIBUTE = "expires_at"
"""ARCHITECTURE.md: readers also filter on it, since DynamoDB's TTL deletes lazily."""


def _string_key(name: str) -> dynamodb.Attribute:
    return dynamodb.Attribute(name=name, type=dynamodb.AttributeType.STRING)


class Registry(Construct):
    """Agents (`by_model`, `by_change`; TTL), launches, keys, demand, usage, batches (`by_work`)."""

    def __init__(self, scope: Construct, construct_id: str, *, config: DeployConfig) -> None:
        super().__init__(scope, construct_id)
        self.agents = dynamodb.Table(
            self,
            "Agents",
            table_name=table_name(config, "agents"),
            partition_key=_string_key("agent_id"),
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            time_to_live_attribute=TTL_ATTRIBUTE,
            removal_policy=RemovalPolicy.DESTROY,
        )
        self.agents.add_global_secondary_index(
            index_name=BY_MODEL_INDEX,
            partition_key=_string_key("model"),
            sort_key=_string_key("agent_id"),
            projection_type=dynamodb.ProjectionType.ALL,
        )
        # The change feed gateways route from: only what routing reads, ordered by change.
        self.agents.add_global_secondary_index(
            index_name=BY_CHANGE_INDEX,
            partition_key=_string_key("feed"),
            sort_key=dynamodb.Attribute(name="changed_at", type=dynamodb.AttributeType.NUMBER),
            projection_type=dynamodb.ProjectionType.INCLUDE,
            non_key_attributes=list(FEED_FIELDS),
        )
        # What the pool manager launched, and vouches for: only its role writes here (agents
        # write their own rows above, and could put anything in them). No TTL: the pool
        # manager deletes a record when it ends the instance.
        self.launches = dynamodb.Table(
            self,
            "Launches",
            table_name=table_name(config, "launches"),
            partition_key=_string_key("agent_id"),
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            removal_policy=RemovalPolicy.DESTROY,
        )
        # API keys are the one thing here people cannot recreate by waiting: keep them when
        # the stack goes, and keep 35 days of history.
        self.keys = self._kept_table(
            "Keys", table_name(config, "keys"), partition_key=_string_key("key_id")
        )
        self.demand = dynamodb.Table(
            self,
            "Demand",
            table_name=table_name(config, "demand"),
            partition_key=_string_key("model"),
            sort_key=_string_key("gateway_id"),
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            time_to_live_attribute=TTL_ATTRIBUTE,
            removal_policy=RemovalPolicy.DESTROY,
        )
        # What each key used, per model and minute: billing records, kept like the keys
        # (and removed by TTL after `usage_ttl_seconds`, 400 days by default).
        self.usage = self._kept_table(
            "Usage",
            table_name(config, "usage"),
            partition_key=_string_key("key_id"),
            sort_key=_string_key("period"),
            time_to_live_attribute=TTL_ATTRIBUTE,
        )
        # Files and batches per owning key (`object_id`: a file's or a batch's id): customers'
        # work, kept like the keys; each record goes at its `expires_at`.
        self.batches = self._kept_table(
            "Batches",
            table_name(config, "batches"),
            partition_key=_string_key("owner"),
            sort_key=_string_key("object_id"),
            time_to_live_attribute=TTL_ATTRIBUTE,
        )
        # Sparse: only a batch not yet ended has `work`. Every gateway replica reads it for a
        # batch whose lease has run out.
        self.batches.add_global_secondary_index(
            index_name=BY_WORK_INDEX,
            partition_key=_string_key("work"),
            sort_key=_string_key("object_id"),
            projection_type=dynamodb.ProjectionType.ALL,
        )
        for table in (self.agents, self.demand):
            acknowledge(
                table,
                "AwsSolutions-DDB3",
                "Heartbeat state rewritten every few seconds, expired by TTL: nothing to restore.",
            )
        acknowledge(
            self.launches,
            "AwsSolutions-DDB3",
            "Written again by the pool manager for every instance it finds: nothing to restore.",
        )

    def _kept_table(self, construct_id: str, name: str, **keys: Any) -> dynamodb.Table:
        """A table kept when the stack goes, with point-in-time recovery (35 days)."""
        return dynamodb.Table(
            self,
            construct_id,
            table_name=name,
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            removal_policy=RemovalPolicy.RETAIN,
            **keys,
        )

    def environment(self, region: str) -> dict[str, str]:
        """The shared `SPOTGATE_…` settings that point a service at these tables."""
        tables: dict[str, dynamodb.Table] = {kind: getattr(self, kind) for kind in TABLE_KINDS}
        return registry_environment(region, {kind: t.table_name for kind, t in tables.items()})


TABLE_KINDS = ("agents", "keys", "demand", "usage", "launches", "batches")


def table_name(config: DeployConfig, kind: str) -> str:
    """The name of the pool's `kind` table: `<poolName>-<kind>`."""
    return f"{config.pool_name}-{kind}"


def registry_environment(region: str, tables: Mapping[str, str]) -> dict[str, str]:
    """The shared `SPOTGATE_…` settings that point a service at the tables in `region`."""
    return env_names(
        SharedSettings,
        {"aws.region": region, **{f"tables.{kind}": name for kind, name in tables.items()}},
    )


def home_registry_environment(config: DeployConfig) -> dict[str, str]:
    """The settings that point an agent in another region at the home region's tables."""
    return registry_environment(
        config.region, {kind: table_name(config, kind) for kind in TABLE_KINDS}
    )
