"""The tables (DESIGN.md §2): their keys, the `by_model` index, TTL, and creating them."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Literal

from botocore.exceptions import ClientError

from spotgate.registry.base import RegistryBase
from spotgate.registry.records import RegistryError

BY_MODEL_INDEX = "by_model"
TABLE_ACTIVE_TIMEOUT_SECONDS = 60.0


class TableSetup(RegistryBase):
    """Creating the tables in the emulator (local stack, tests); in AWS the CDK stack does."""

    async def create_tables(self) -> None:
        """Create the four tables (GSI, TTL) if missing; wait until they are active."""
        tables = self._tables
        await self._create_table(
            tables.agents,
            key=[("agent_id", "HASH")],
            attributes={"agent_id": "S", "model": "S"},
            index=(BY_MODEL_INDEX, [("model", "HASH"), ("agent_id", "RANGE")]),
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
        for name in (tables.agents, tables.demand, tables.usage):
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
        index: tuple[str, list[tuple[str, Literal["HASH", "RANGE"]]]] | None = None,
    ) -> None:
        request: dict[str, Any] = {
            "TableName": name,
            "BillingMode": "PAY_PER_REQUEST",
            "KeySchema": [{"AttributeName": attr, "KeyType": kind} for attr, kind in key],
            "AttributeDefinitions": [
                {"AttributeName": attr, "AttributeType": kind} for attr, kind in attributes.items()
            ],
        }
        if index is not None:
            index_name, index_key = index
            request["GlobalSecondaryIndexes"] = [
                {
                    "IndexName": index_name,
                    "KeySchema": [
                        {"AttributeName": attr, "KeyType": kind} for attr, kind in index_key
                    ],
                    "Projection": {"ProjectionType": "ALL"},
                }
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
