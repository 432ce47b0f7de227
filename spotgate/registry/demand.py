"""The `demand` table: each gateway's queue per model, and pool sizes fixed by hand."""

from __future__ import annotations

from spotgate.registry.base import RegistryBase
from spotgate.registry.codec import decode_item, encode, encode_item
from spotgate.registry.records import Demand

POOL_TARGET_SOURCE = "~pool-target"  # a `demand` item written by `spotgate pool scale`


class DemandOperations(RegistryBase):
    """Demand: the gateways publish it, the pool manager reads it (and the fixed targets)."""

    @property
    def demand_ttl_seconds(self) -> float:
        """How long a published demand row counts before it expires."""
        return self._timings.demand_ttl_seconds

    async def publish_demand(
        self, model: str, gateway_id: str, *, pending: int, active: int
    ) -> None:
        """One gateway's current queue depth and running streams for `model`."""
        now = self._clock()
        await self._client.put_item(
            TableName=self._tables.demand,
            Item=encode_item(
                {
                    "model": model,
                    "gateway_id": gateway_id,
                    "pending": pending,
                    "active": active,
                    "at": now,
                    "expires_at": now + self._timings.demand_ttl_seconds,
                }
            ),
        )

    async def set_pool_target(self, model: str, count: int | None) -> None:
        """Fix a model's agent count (`spotgate pool scale`), or hand it back to demand (None).

        Stored in the `demand` table under a source that is not a gateway and without
        `expires_at`, so demand readers skip it and TTL never removes it.
        """
        key = {"model": encode(model), "gateway_id": encode(POOL_TARGET_SOURCE)}
        if count is None:
            await self._client.delete_item(TableName=self._tables.demand, Key=key)
            return
        await self._client.put_item(
            TableName=self._tables.demand,
            Item={**key, "target": encode(count), "at": encode(self._clock())},
        )

    async def read_pool_targets(self) -> dict[str, int]:
        """Agent counts fixed with `set_pool_target`, per model."""
        items = self._paginate(
            self._client.scan,
            {
                "TableName": self._tables.demand,
                "FilterExpression": "gateway_id = :source",
                "ExpressionAttributeValues": {":source": encode(POOL_TARGET_SOURCE)},
            },
        )
        targets: dict[str, int] = {}
        async for item in items:
            values = decode_item(item)
            targets[str(values["model"])] = int(values["target"])
        return targets

    async def read_demand(self) -> dict[str, Demand]:
        """Demand per model, summed over gateways that published recently."""
        items = self._paginate(
            self._client.scan,
            {
                "TableName": self._tables.demand,
                "FilterExpression": "expires_at > :now",
                "ExpressionAttributeValues": {":now": encode(self._clock())},
            },
        )
        totals: dict[str, Demand] = {}
        async for item in items:
            values = decode_item(item)
            model = str(values["model"])
            seen = totals.get(model, Demand())
            totals[model] = Demand(
                pending=seen.pending + int(values.get("pending", 0)),
                active=seen.active + int(values.get("active", 0)),
            )
        return totals
