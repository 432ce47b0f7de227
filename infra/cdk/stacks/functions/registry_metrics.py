"""Publish ready agents and queued streams per model, read from the registry, to CloudWatch.

Runs every minute in Lambda. The registry is the truth about agents (ARCHITECTURE.md); the
gateways publish their queue depth to the `demand` table. Nothing here imports spotgate: the
CDK app passes its constants in the environment.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

Item = Mapping[str, Mapping[str, str]]
PUT_METRIC_BATCH = 500
"""PutMetricData takes at most this many values per call."""


def _text(item: Item, name: str) -> str | None:
    return item.get(name, {}).get("S")


def _number(item: Item, name: str) -> float | None:
    value = item.get(name, {}).get("N")
    return float(value) if value is not None else None


def count(
    agents: Iterable[Item],
    demand: Iterable[Item],
    *,
    models: Iterable[str],
    now: float,
    ready_state: str,
    pool_target_source: str,
) -> dict[str, tuple[int, int]]:
    """Model → (ready agents, queued streams), over unexpired entries; `models` always appear."""
    ready: dict[str, int] = dict.fromkeys(models, 0)
    queued: dict[str, int] = dict.fromkeys(models, 0)
    for item in agents:
        model, expires_at = _text(item, "model"), _number(item, "expires_at")
        # TTL deletes lazily: an expired entry is a dead agent, whatever its state says.
        if model is None or expires_at is None or expires_at <= now:
            continue
        ready.setdefault(model, 0)
        if _text(item, "state") == ready_state:
            ready[model] += 1
    for item in demand:
        model, expires_at = _text(item, "model"), _number(item, "expires_at")
        if _text(item, "gateway_id") == pool_target_source or model is None:
            continue
        if expires_at is None or expires_at <= now:
            continue
        queued[model] = queued.get(model, 0) + int(_number(item, "pending") or 0)
    return {
        model: (ready.get(model, 0), queued.get(model, 0)) for model in sorted({*ready, *queued})
    }


def metric_data(counts: Mapping[str, tuple[int, int]]) -> list[dict[str, Any]]:
    """PutMetricData entries: `ReadyAgents` and `QueuedStreams` with a `Model` dimension."""
    data: list[dict[str, Any]] = []
    for model, (ready, queued) in counts.items():
        dimensions = [{"Name": "Model", "Value": model}]
        data.append(
            {"MetricName": "ReadyAgents", "Dimensions": dimensions, "Value": ready, "Unit": "Count"}
        )
        data.append(
            {
                "MetricName": "QueuedStreams",
                "Dimensions": dimensions,
                "Value": queued,
                "Unit": "Count",
            }
        )
    return data


def _scan(client: Any, table: str, attributes: Iterable[str]) -> Iterator[Item]:
    names = {f"#a{index}": name for index, name in enumerate(attributes)}
    pages = client.get_paginator("scan").paginate(
        TableName=table, ProjectionExpression=", ".join(names), ExpressionAttributeNames=names
    )
    for page in pages:
        yield from page.get("Items", [])


def handler(_event: object, _context: object) -> dict[str, Any]:
    """Lambda entry point: scan both tables, publish one value per model and metric."""
    # The Lambda runtime provides boto3; importing it here keeps `count` testable alone.
    import boto3  # type: ignore[import-untyped]

    env = os.environ
    dynamodb = boto3.client("dynamodb")
    counts = count(
        _scan(dynamodb, env["AGENTS_TABLE"], ("model", "state", "expires_at")),
        _scan(dynamodb, env["DEMAND_TABLE"], ("model", "gateway_id", "pending", "expires_at")),
        models=json.loads(env["MODELS"]),
        now=time.time(),
        ready_state=env["READY_STATE"],
        pool_target_source=env["POOL_TARGET_SOURCE"],
    )
    data = metric_data(counts)
    cloudwatch = boto3.client("cloudwatch")
    for start in range(0, len(data), PUT_METRIC_BATCH):
        cloudwatch.put_metric_data(
            Namespace=env["NAMESPACE"], MetricData=data[start : start + PUT_METRIC_BATCH]
        )
    return {"models": {model: list(values) for model, values in counts.items()}}
