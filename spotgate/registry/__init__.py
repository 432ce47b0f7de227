"""The DynamoDB registry: agents, launches, API keys, demand, usage, batches (ARCHITECTURE.md).

Every read filters `expires_at > now`, because DynamoDB's TTL deletes lazily; how the agent
life cycle holds with two writers racing is in `agents`.

One `Registry` per process holds one aioboto3 session and one long-lived DynamoDB client.
It is assembled here from one module per concern, over the state in `base`:

- `records`: the records, `AgentState` and the errors; `codec`: items to records and back;
- `schema`: the tables and the `by_model` index; `agents`, `launches`, `keys`, `demand`,
  `usage`, `batches`: the operations on each table; `aws`: the AWS session.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Self

from botocore.config import Config

from spotgate.registry.agents import AgentOperations, instance_agent_id
from spotgate.registry.aws import aws_session
from spotgate.registry.base import Clock
from spotgate.registry.batches import BatchOperations, StoredObject, object_id
from spotgate.registry.demand import POOL_TARGET_SOURCE, DemandOperations
from spotgate.registry.keys import MAX_KEY_WEIGHT, ApiKeyOperations
from spotgate.registry.launches import LaunchOperations, LaunchRecord
from spotgate.registry.records import (
    BOOT_PHASES,
    AgentGone,
    AgentNotFound,
    AgentRecord,
    AgentState,
    ApiKeyDisabled,
    ApiKeyNotFound,
    ApiKeyRecord,
    ApiKeyRejected,
    BatchBacklog,
    BootKind,
    BootPhase,
    BootTimeline,
    CreatedApiKey,
    Demand,
    DrainOutcome,
    EngineKind,
    InvalidTransition,
    Lifecycle,
    PoolForecast,
    RegistryError,
    UsageCounts,
    UsageRow,
)
from spotgate.registry.schema import (
    BY_CHANGE_INDEX,
    BY_MODEL_INDEX,
    BY_WORK_INDEX,
    FEED_FIELDS,
    TABLE_ACTIVE_TIMEOUT_SECONDS,
    TableSetup,
)
from spotgate.registry.usage import UsageOperations, minute_of
from spotgate.settings import SharedSettings

__all__ = [
    "BOOT_PHASES",
    "BY_CHANGE_INDEX",
    "BY_MODEL_INDEX",
    "BY_WORK_INDEX",
    "FEED_FIELDS",
    "MAX_KEY_WEIGHT",
    "POOL_TARGET_SOURCE",
    "TABLE_ACTIVE_TIMEOUT_SECONDS",
    "AgentGone",
    "AgentNotFound",
    "AgentRecord",
    "AgentState",
    "ApiKeyDisabled",
    "ApiKeyNotFound",
    "ApiKeyRecord",
    "ApiKeyRejected",
    "BatchBacklog",
    "BootKind",
    "BootPhase",
    "BootTimeline",
    "Clock",
    "CreatedApiKey",
    "Demand",
    "DrainOutcome",
    "EngineKind",
    "InvalidTransition",
    "LaunchRecord",
    "Lifecycle",
    "PoolForecast",
    "Registry",
    "RegistryError",
    "StoredObject",
    "UsageCounts",
    "UsageRow",
    "aws_session",
    "instance_agent_id",
    "minute_of",
    "object_id",
]


class Registry(
    AgentOperations,
    BatchOperations,
    ApiKeyOperations,
    DemandOperations,
    LaunchOperations,
    UsageOperations,
    TableSetup,
):
    """Async access to the spotgate tables through one long-lived client."""

    @classmethod
    @asynccontextmanager
    async def open(cls, settings: SharedSettings, clock: Clock = time.time) -> AsyncIterator[Self]:
        """Open the registry's client for the life of the `async with` block."""
        aws = settings.aws
        session = aws_session(aws)
        config = Config(retries={"max_attempts": 3, "mode": "standard"}, connect_timeout=5)
        async with AsyncExitStack() as stack:
            client = await stack.enter_async_context(
                session.client("dynamodb", endpoint_url=aws.endpoint_url, config=config)
            )
            yield cls(client, settings, clock)
