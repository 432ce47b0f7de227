"""The `usage` table: tokens and streams per API key, model and minute, added by every gateway.

Each gateway adds what it counted (`gateway.usage`) with DynamoDB's atomic `ADD`, so the
replicas' counts of one minute sum in one item, each write at most once. An item's sort key,
`period`, is the minute (epoch seconds, zero-padded) then the model: a key's items sort by
time, and a range of minutes is one query.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from botocore.exceptions import ClientError

from spotgate.registry.base import RegistryBase, is_condition_failure
from spotgate.registry.codec import decode_item, encode
from spotgate.registry.records import UsageCounts, UsageRow

SECONDS_PER_MINUTE = 60
PERIOD_DIGITS = 12


def period(minute: int, model: str) -> str:
    """The sort key of a key's usage of `model` in the minute starting at `minute`."""
    return f"{minute:0{PERIOD_DIGITS}d}#{model}"


def minute_of(at: float) -> int:
    """The start (epoch seconds) of the minute `at` falls in."""
    return int(at // SECONDS_PER_MINUTE) * SECONDS_PER_MINUTE


class UsageOperations(RegistryBase):
    """Usage: the gateways add to it, `spotgate keys usage` reads it."""

    async def add_usage(
        self, key_id: str, model: str, minute: int, counts: UsageCounts, write_id: str
    ) -> None:
        """Add `counts` to a key's usage of `model` in the minute starting at `minute`, once.

        The item keeps the ids of the writes it took, and a write whose id it holds changes
        nothing: a gateway may send the same write again (its answer was lost, the client
        retried, the gateway stopped while waiting) without counting it twice.
        """
        try:
            await self._client.update_item(
                TableName=self._tables.usage,
                Key={"key_id": encode(key_id), "period": encode(period(minute, model))},
                UpdateExpression=(
                    "ADD prompt_tokens :prompt, completion_tokens :completion, "
                    "streams :streams, flex_tokens :flex, writes :writes "
                    "SET #model = :model, #minute = :minute, expires_at = :expires"
                ),
                ConditionExpression="NOT contains(writes, :write)",
                # MINUTE is one of DynamoDB's reserved words; the names keep them all out of reach.
                ExpressionAttributeNames={"#model": "model", "#minute": "minute"},
                ExpressionAttributeValues={
                    ":prompt": encode(counts.prompt_tokens),
                    ":completion": encode(counts.completion_tokens),
                    ":streams": encode(counts.streams),
                    ":flex": encode(counts.flex_tokens),
                    ":writes": encode({write_id}),
                    ":write": encode(write_id),
                    ":model": encode(model),
                    ":minute": encode(minute),
                    ":expires": encode(minute + self._timings.usage_ttl_seconds),
                },
            )
        except ClientError as err:
            if not is_condition_failure(err):
                raise

    async def read_usage(self, key_id: str | None, since: float) -> list[UsageRow]:
        """Usage per key, model and minute from the minute of `since` on (every key if None)."""
        start = encode(period(minute_of(since), ""))
        operation: Callable[..., Any]
        if key_id is not None:
            operation, request = (
                self._client.query,
                {
                    "TableName": self._tables.usage,
                    "KeyConditionExpression": "key_id = :key AND #period >= :start",
                    "ExpressionAttributeNames": {"#period": "period"},
                    "ExpressionAttributeValues": {":key": encode(key_id), ":start": start},
                },
            )
        else:
            operation, request = (
                self._client.scan,
                {
                    "TableName": self._tables.usage,
                    "FilterExpression": "#period >= :start",
                    "ExpressionAttributeNames": {"#period": "period"},
                    "ExpressionAttributeValues": {":start": start},
                },
            )
        rows = []
        async for item in self._paginate(operation, request):
            values = decode_item(item)
            rows.append(
                UsageRow(
                    key_id=str(values["key_id"]),
                    model=str(values["model"]),
                    minute=int(values["minute"]),
                    counts=UsageCounts(
                        prompt_tokens=int(values.get("prompt_tokens", 0)),
                        completion_tokens=int(values.get("completion_tokens", 0)),
                        streams=int(values.get("streams", 0)),
                        flex_tokens=int(values.get("flex_tokens", 0)),
                    ),
                )
            )
        return sorted(rows, key=lambda row: (row.key_id, row.minute, row.model))
