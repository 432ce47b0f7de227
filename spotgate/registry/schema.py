"""The tables (ARCHITECTURE.md): their keys, the `by_model` index, TTL, and creating them."""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from botocore.exceptions import ClientError

from spotgate.registry.base import RegistryBase
from spotgate.registry.records import RegistryError

BY_MODEL_INDEX = "by_model"
BY_CHANGE_INDEX = "by_change"
"""The agents' change feed: every write that routing cares about stamps `changed_at`, so a
gateway reads only what changed since its last read instead of the whole table."""
FEED_SHARDS = 2
"""Partitions of the change feed (`feed` is "0" or "1" by agent id). Every heartbeat writes
the index, and one index partition takes about 1,000 writes/s (its sort key only grows, so
DynamoDB cannot split it), so two keep 10,000 agents heartbeating every 5 s within the limit.
Each read is one query per partition, and each query is charged at least half a read unit:
more partitions would cost every gateway that much more on every refresh."""
FEED_FIELDS = (
    "model",
    "url",
    "state",
    "capacity",
    "active",
    "expires_at",
    "max_model_len",
    "max_token_chars",
)
"""What the change feed projects besides its keys: what routing reads of an agent."""
BY_WORK_INDEX = "by_work"
"""The batches still to be worked (sparse: only a batch not yet ended has `work`), which
every gateway replica reads to find one whose lease has run out."""
TABLE_ACTIVE_TIMEOUT_SECONDS = 60.0


FEED_PARTITIONS = tuple(str(number) for number in range(FEED_SHARDS))
"""The values of `feed`: a full read of the change feed is one query for each."""


def feed_shard(agent_id: str) -> str:
    """The change-feed partition an agent's entry is written to."""
    return FEED_PARTITIONS[zlib.crc32(agent_id.encode()) % FEED_SHARDS]


@dataclass(frozen=True, slots=True)
class Index:
    """A global secondary index: its key, and the attributes it projects (None: all)."""

    name: str
    key: list[tuple[str, Literal["HASH", "RANGE"]]]
    projected: tuple[str, ...] | None = None


class TableSetup(RegistryBase):
    """Creating the tables in the emulator (local stack, tests); in AWS the CDK stack does."""

    async def create_tables(self) -> None:
        """Create the six tables (GSI, TTL) if missing; wait until they are active."""
        tables = self._tables
        await self._create_table(
            tables.agents,
            key=[("agent_id", "HASH")],
            attributes={"agent_id": "S", "model": "S", "feed": "S", "changed_at": "N"},
            indexes=[
                Index(BY_MODEL_INDEX, [("model", "HASH"), ("agent_id", "RANGE")]),
                Index(
                    BY_CHANGE_INDEX,
                    [("feed", "HASH"), ("changed_at", "RANGE")],
                    projected=FEED_FIELDS,
                ),
            ],
        )
        await self._create_table(tables.keys, key=[("key_id", "HASH")], attributes={"key_id": "S"})
        await self._create_table(
            tables.demand,
            key=[("model", "HASH"), ("gateway_id", "RANGE")],
            attributes={"model": "S", "gateway_id": "S"},
        )
        await self._create_table(
            tables.usage,
            key=[("key_id", "HASH"), ("period", "RANGE")],
            attributes={"key_id": "S", "period": "S"},
        )
        # What the pool manager launched: written once per agent, no TTL (it deletes them).
        await self._create_table(
            tables.launches, key=[("agent_id", "HASH")], attributes={"agent_id": "S"}
        )
        # Files and batches per owning key (`object_id`: a file's or a batch's id).
        await self._create_table(
            tables.batches,
            key=[("owner", "HASH"), ("object_id", "RANGE")],
            attributes={"owner": "S", "object_id": "S", "work": "S"},
            indexes=[Index(BY_WORK_INDEX, [("work", "HASH"), ("object_id", "RANGE")])],
        )
        for name in (tables.agents, tables.demand, tables.usage, tables.batches):
            await self._client.update_time_to_live(
                TableName=name,
                TimeToLiveSpecification={"Enabled": True, "AttributeName": "expires_at"},
            )

    async def _create_table(
        self,
        name: str,
        *,
        key: list[tuple[str, Literal["HASH", "RANGE"]]],
        attributes: dict[str, Literal["S", "N"]],
        indexes: Sequence[Index] = (),
    ) -> None:
        request: dict[str, Any] = {
            "TableName": name,
            "BillingMode": "PAY_PER_REQUEST",
            "KeySchema": [{"AttributeName": attr, "KeyType": kind} for attr, kind in key],
            "AttributeDefinitions": [
                {"AttributeName": attr, "AttributeType": kind} for attr, kind in attributes.items()
            ],
        }
        if indexes:
            request["GlobalSecondaryIndexes"] = [
                {
                    "IndexName": index.name,
                    "KeySchema": [
                        {"AttributeName": attr, "KeyType": kind} for attr, kind in index.key
                    ],
                    "Projection": (
                        {"ProjectionType": "ALL"}
                        if index.projected is None
                        else {
                            "ProjectionType": "INCLUDE",
                            "NonKeyAttributes": list(index.projected),
                        }
                    ),
                }
                for index in indexes
            ]
        try:
            await self._client.create_table(**request)
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") != "ResourceInUseException":
                raise
        await self._wait_active(name)

    async def _wait_active(self, name: str) -> None:
        deadline = time.monotonic() + TABLE_ACTIVE_TIMEOUT_SECONDS
        while True:
            description = await self._client.describe_table(TableName=name)
            if description["Table"].get("TableStatus") == "ACTIVE":
                return
            if time.monotonic() > deadline:
                raise RegistryError(f"table {name} did not become active")
            await asyncio.sleep(0.5)
