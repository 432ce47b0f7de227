"""The `demand` table: each gateway's queue per model, and pool sizes fixed by hand."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from spotgate.registry.base import RegistryBase
from spotgate.registry.codec import decode_item, encode, encode_item
from spotgate.registry.records import BatchBacklog, Demand, PoolForecast

POOL_TARGET_SOURCE = "~pool-target"  # a `demand` item written by `spotgate pool scale`
POOL_FORECAST_SOURCE = "~pool-forecast"  # a `demand` item written by the pool manager


class DemandOperations(RegistryBase):
    """Demand: the gateways publish it, the pool manager reads it (and the fixed targets).

    The other way, the pool manager publishes when it expects each booting model's next
    agent ready (`PoolForecast`), for the gateways' queues.
    """

    @property
    def demand_ttl_seconds(self) -> float:
        """How long a published demand row counts before it expires."""
        return self._timings.demand_ttl_seconds

    async def publish_demand(
        self,
        model: str,
        gateway_id: str,
        *,
        pending: int,
        active: int,
        backlog: BatchBacklog | None = None,
    ) -> None:
        """One gateway's current queue depth, running streams and batch work for `model`."""
        now = self._clock()
        row: dict[str, object] = {
            "model": model,
            "gateway_id": gateway_id,
            "pending": pending,
            "active": active,
            "at": now,
            "expires_at": now + self._timings.demand_ttl_seconds,
        }
        if backlog is not None:
            row.update(backlog_stream_seconds=backlog.stream_seconds, backlog_due_at=backlog.due_at)
        await self._client.put_item(TableName=self._tables.demand, Item=encode_item(row))

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

    async def publish_forecast(self, model: str, forecast: PoolForecast | None) -> None:
        """The pool's forecast for `model` (None: nothing of it is booting)."""
        key = {"model": encode(model), "gateway_id": encode(POOL_FORECAST_SOURCE)}
        if forecast is None:
            await self._client.delete_item(TableName=self._tables.demand, Key=key)
            return
        now = self._clock()
        await self._client.put_item(
            TableName=self._tables.demand,
            Item={
                **key,
                **encode_item(
                    {
                        "ready_at": forecast.ready_at,
                        "cold_start_seconds": forecast.cold_start_seconds,
                        "at": now,
                        # A pool manager that stops publishing leaves no stale promise behind.
                        "expires_at": now + self._timings.demand_ttl_seconds,
                    }
                ),
            },
        )

    async def read_forecasts(self, models: Iterable[str]) -> dict[str, PoolForecast]:
        """The pool manager's current forecasts for these models (those it has published)."""
        now = self._clock()

        async def read(model: str) -> tuple[str, PoolForecast] | None:
            response = await self._client.get_item(
                TableName=self._tables.demand,
                Key={"model": encode(model), "gateway_id": encode(POOL_FORECAST_SOURCE)},
            )
            item = response.get("Item")
            if item is None:
                return None
            values = decode_item(item)
            if float(values["expires_at"]) <= now:  # TTL deletes late: a stale promise
                return None
            forecast = PoolForecast(
                ready_at=float(values["ready_at"]),
                cold_start_seconds=float(values["cold_start_seconds"]),
            )
            return model, forecast

        found = await asyncio.gather(*(read(model) for model in sorted(set(models))))
        return dict(pair for pair in found if pair is not None)

    async def read_demand(self) -> dict[str, Demand]:
        """Demand per model, summed over gateways that published recently."""
        items = self._paginate(
            self._client.scan,
            {
                "TableName": self._tables.demand,
                "FilterExpression": "expires_at > :now AND gateway_id <> :forecast",
                "ExpressionAttributeValues": {
                    ":now": encode(self._clock()),
                    ":forecast": encode(POOL_FORECAST_SOURCE),
                },
            },
        )
        totals: dict[str, Demand] = {}
        async for item in items:
            values = decode_item(item)
            model = str(values["model"])
            backlog = None
            if "backlog_due_at" in values:
                seconds = float(values["backlog_stream_seconds"])
                backlog = BatchBacklog(seconds, float(values["backlog_due_at"]))
            published = Demand(int(values.get("pending", 0)), int(values.get("active", 0)), backlog)
            totals[model] = totals.get(model, Demand()).plus(published)
        return totals
