"""What every group of registry operations shares: one client, the table names, a clock."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from spotgate.settings import SharedSettings

if TYPE_CHECKING:
    from types_aiobotocore_dynamodb.client import DynamoDBClient

Clock = Callable[[], float]


class RegistryBase:
    """The state behind `Registry`; the operations are mixins over it (agents, keys, …)."""

    def __init__(
        self, client: DynamoDBClient, settings: SharedSettings, clock: Clock = time.time
    ) -> None:
        self._client = client
        self._tables = settings.tables
        self._timings = settings.registry
        self._clock = clock

    @staticmethod
    async def _paginate(
        operation: Callable[..., Any], request: dict[str, Any]
    ) -> AsyncIterator[dict[str, Any]]:
        while True:
            page = await operation(**request)
            for item in page.get("Items", []):
                yield item
            last = page.get("LastEvaluatedKey")
            if not last:
                return
            request = {**request, "ExclusiveStartKey": last}


def is_condition_failure(err: ClientError) -> bool:
    """Whether a write was refused because its `ConditionExpression` did not hold."""
    return err.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException"
