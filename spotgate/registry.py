"""The DynamoDB registry: agents, API keys and demand (DESIGN.md §2).

Every rule of the agent life cycle is enforced by a conditional write, so two writers (the
agent and the pool manager) can race without breaking it: `gone` is never resurrected,
`draining` never goes back to `ready`, and the first `draining` wins. Every read filters
`expires_at > now`, because DynamoDB's TTL deletes lazily.

One `Registry` per process holds one aioboto3 session and one long-lived DynamoDB client.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import MISSING, dataclass, field, replace
from decimal import Decimal
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal, Self

import aioboto3
from botocore.config import Config
from botocore.exceptions import ClientError

from spotgate import __version__
from spotgate.admission import model_allowed
from spotgate.apikeys import (
    MalformedApiKey,
    hash_secret,
    new_api_key,
    parse_api_key,
    secret_matches,
)
from spotgate.settings import AwsSettings, SharedSettings

if TYPE_CHECKING:
    from types_aiobotocore_dynamodb.client import DynamoDBClient
    from types_aiobotocore_dynamodb.type_defs import AttributeValueTypeDef

Clock = Callable[[], float]
Lifecycle = Literal["spot", "on-demand", "local"]
EngineKind = Literal["vllm", "synthetic"]

BY_MODEL_INDEX = "by_model"
POOL_TARGET_SOURCE = "~pool-target"  # a `demand` item written by `spotgate pool scale`
TABLE_ACTIVE_TIMEOUT_SECONDS = 60.0


class AgentState(StrEnum):
    """Life cycle of an agent: starting → ready → draining → gone."""

    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    GONE = "gone"


class RegistryError(Exception):
    """A registry operation was refused."""


class AgentNotFound(RegistryError):
    """No such agent is registered."""


class AgentGone(RegistryError):
    """The agent is `gone`; it can never come back under this id."""


class InvalidTransition(RegistryError):
    """The write would break the life cycle (e.g. `draining` → `ready`)."""


class ApiKeyRejected(RegistryError):
    """The API key is malformed, unknown or does not match (one error: no oracle)."""


class ApiKeyDisabled(RegistryError):
    """The API key is valid but disabled."""


class ApiKeyNotFound(RegistryError):
    """No key with this id exists."""


@dataclass(frozen=True, slots=True)
class AgentRecord:
    """One agent's registry item."""

    agent_id: str
    url: str
    model: str
    state: AgentState
    capacity: int
    active: int = 0
    heartbeat_at: float = 0.0
    expires_at: float = 0.0
    drain_deadline: float | None = None
    rebalance_at: float | None = None
    lifecycle: Lifecycle = "local"
    instance_type: str = "local"
    zone: str = "local"
    started_at: float = 0.0
    ready_at: float | None = None
    engine: EngineKind = "vllm"
    version: str = __version__
    # The model's context in tokens, and the most prompt characters one token stands for
    # (`spotgate.context`): the gateway refuses prompts they prove too long. 0: not published.
    max_model_len: int = 0
    max_token_chars: int = 0

    def is_live(self, now: float) -> bool:
        """Whether the entry has not expired (heartbeats keep pushing `expires_at`)."""
        return self.expires_at > now


@dataclass(frozen=True, slots=True)
class DrainOutcome:
    """Result of `set_draining`: `first` is False when another writer had drained it already."""

    first: bool
    record: AgentRecord


@dataclass(frozen=True, slots=True)
class ApiKeyRecord:
    """An API key's settings (never its secret or hash)."""

    key_id: str
    name: str
    rpm: int | None = None
    tpm: int | None = None
    max_tokens: int | None = None
    models: frozenset[str] = field(default_factory=frozenset)
    disabled: bool = False
    created_at: float = 0.0

    def allows_model(self, model: str) -> bool:
        """Whether this key may use `model` (an empty set means every model)."""
        return model_allowed(self.models, model)


@dataclass(frozen=True, slots=True)
class CreatedApiKey:
    """A new key: `api_key` is the full text, shown to its owner once and never stored."""

    record: ApiKeyRecord
    api_key: str


@dataclass(frozen=True, slots=True)
class Demand:
    """Streams waiting and running for one model, summed over live gateways."""

    pending: int = 0
    active: int = 0


# --- item encoding -------------------------------------------------------------------------


def _encode(value: object) -> AttributeValueTypeDef:
    if isinstance(value, bool):
        return {"BOOL": value}
    if isinstance(value, int | float):
        return {"N": repr(value)}
    if isinstance(value, str):
        return {"S": value}
    if isinstance(value, frozenset | set):
        return {"SS": sorted(str(item) for item in value)}
    raise TypeError(f"cannot store {type(value).__name__} in DynamoDB")


def _encode_item(values: Mapping[str, object]) -> dict[str, AttributeValueTypeDef]:
    """Attribute map of the non-empty values (DynamoDB stores no empty sets, `None` is absent)."""
    return {
        name: _encode(value)
        for name, value in values.items()
        if value is not None and value != frozenset()
    }


def _decode(attribute: Mapping[str, Any]) -> object:
    if "S" in attribute:
        return str(attribute["S"])
    if "N" in attribute:
        number = Decimal(attribute["N"])
        return int(number) if number == number.to_integral_value() else float(number)
    if "BOOL" in attribute:
        return bool(attribute["BOOL"])
    if "SS" in attribute:
        return frozenset(attribute["SS"])
    raise TypeError(f"unexpected DynamoDB attribute {sorted(attribute)}")


def _decode_item(item: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    return {name: _decode(attribute) for name, attribute in item.items()}


_AGENT_REQUIRED_FIELDS = frozenset(
    name
    for name, spec in AgentRecord.__dataclass_fields__.items()
    if spec.default is MISSING and spec.default_factory is MISSING
)


def _agent_from_item(item: Mapping[str, Mapping[str, Any]]) -> AgentRecord:
    values = _decode_item(item)
    values["state"] = AgentState(values["state"])
    for name in ("heartbeat_at", "expires_at", "started_at"):
        values[name] = float(values.get(name, 0.0))
    known = AgentRecord.__dataclass_fields__
    return AgentRecord(**{name: value for name, value in values.items() if name in known})


def _agent_to_item(record: AgentRecord) -> dict[str, AttributeValueTypeDef]:
    return _encode_item({name: getattr(record, name) for name in AgentRecord.__dataclass_fields__})


def _key_from_item(item: Mapping[str, Mapping[str, Any]]) -> ApiKeyRecord:
    values = _decode_item(item)
    values.pop("secret_hash", None)
    known = ApiKeyRecord.__dataclass_fields__
    return ApiKeyRecord(**{name: value for name, value in values.items() if name in known})


def _is_condition_failure(err: ClientError) -> bool:
    return err.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException"


def aws_session(aws: AwsSettings) -> aioboto3.Session:
    """An aioboto3 session for the settings' region, with their credentials when set."""
    return aioboto3.Session(
        region_name=aws.region,
        aws_access_key_id=aws.access_key_id,
        aws_secret_access_key=(
            aws.secret_access_key.get_secret_value() if aws.secret_access_key else None
        ),
    )


# --- the registry --------------------------------------------------------------------------


class Registry:
    """Async access to the three spotgate tables through one long-lived client."""

    def __init__(
        self, client: DynamoDBClient, settings: SharedSettings, clock: Clock = time.time
    ) -> None:
        self._client = client
        self._tables = settings.tables
        self._timings = settings.registry
        self._clock = clock

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

    # -- tables --

    async def create_tables(self) -> None:
        """Create the three tables (GSI, TTL) if missing; wait until they are active."""
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
        for name in (tables.agents, tables.demand):
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

    # -- agents --

    async def register(self, record: AgentRecord) -> AgentRecord:
        """Create an agent's entry as `starting` or `ready` (a `starting` entry may turn ready)."""
        if record.state not in (AgentState.STARTING, AgentState.READY):
            raise InvalidTransition(f"an agent registers as starting or ready, not {record.state}")
        now = self._clock()
        stored = replace(
            record,
            heartbeat_at=now,
            expires_at=now + self._timings.agent_ttl_seconds,
            started_at=record.started_at or now,
            ready_at=now if record.state is AgentState.READY else None,
        )
        try:
            await self._client.put_item(
                TableName=self._tables.agents,
                Item=_agent_to_item(stored),
                ConditionExpression="attribute_not_exists(agent_id) OR #state = :starting",
                ExpressionAttributeNames={"#state": "state"},
                ExpressionAttributeValues={":starting": _encode(AgentState.STARTING.value)},
            )
        except ClientError as err:
            if not _is_condition_failure(err):
                raise
            raise await self._refusal(record.agent_id, f"register as {record.state}") from err
        return stored

    async def heartbeat(self, agent_id: str, active: int) -> None:
        """Record liveness and load; fails for an unknown or `gone` agent."""
        now = self._clock()
        try:
            await self._client.update_item(
                TableName=self._tables.agents,
                Key={"agent_id": _encode(agent_id)},
                UpdateExpression="SET active = :active, heartbeat_at = :now, expires_at = :exp",
                ConditionExpression="attribute_exists(agent_id) AND #state <> :gone",
                ExpressionAttributeNames={"#state": "state"},
                ExpressionAttributeValues={
                    ":active": _encode(active),
                    ":now": _encode(now),
                    ":exp": _encode(now + self._timings.agent_ttl_seconds),
                    ":gone": _encode(AgentState.GONE.value),
                },
            )
        except ClientError as err:
            if not _is_condition_failure(err):
                raise
            raise await self._refusal(agent_id, "heartbeat") from err

    async def set_draining(self, agent_id: str, deadline: float) -> DrainOutcome:
        """Mark an agent `draining` until `deadline`; the first caller's deadline wins."""
        try:
            response = await self._client.update_item(
                TableName=self._tables.agents,
                Key={"agent_id": _encode(agent_id)},
                UpdateExpression="SET #state = :draining, drain_deadline = :deadline",
                ConditionExpression="attribute_exists(agent_id) AND #state IN (:starting, :ready)",
                ExpressionAttributeNames={"#state": "state"},
                ExpressionAttributeValues={
                    ":draining": _encode(AgentState.DRAINING.value),
                    ":deadline": _encode(deadline),
                    ":starting": _encode(AgentState.STARTING.value),
                    ":ready": _encode(AgentState.READY.value),
                },
                ReturnValues="ALL_NEW",
            )
        except ClientError as err:
            if not _is_condition_failure(err):
                raise
            current = await self.get_agent(agent_id)
            if current is not None and current.state is AgentState.DRAINING:
                return DrainOutcome(first=False, record=current)
            raise await self._refusal(agent_id, "drain", current) from err
        return DrainOutcome(first=True, record=_agent_from_item(response["Attributes"]))

    async def record_rebalance(self, agent_id: str, at: float) -> None:
        """Note AWS's rebalance recommendation (an early warning, not a drain); first one kept."""
        try:
            await self._client.update_item(
                TableName=self._tables.agents,
                Key={"agent_id": _encode(agent_id)},
                UpdateExpression="SET rebalance_at = if_not_exists(rebalance_at, :at)",
                ConditionExpression="attribute_exists(agent_id) AND #state <> :gone",
                ExpressionAttributeNames={"#state": "state"},
                ExpressionAttributeValues={
                    ":at": _encode(at),
                    ":gone": _encode(AgentState.GONE.value),
                },
            )
        except ClientError as err:
            if not _is_condition_failure(err):
                raise
            raise await self._refusal(agent_id, "record a rebalance for") from err

    async def set_gone(self, agent_id: str) -> None:
        """Mark an agent `gone` for good (idempotent); TTL removes the entry later."""
        try:
            await self._client.update_item(
                TableName=self._tables.agents,
                Key={"agent_id": _encode(agent_id)},
                UpdateExpression="SET #state = :gone, active = :zero, expires_at = :exp",
                ConditionExpression="attribute_exists(agent_id)",
                ExpressionAttributeNames={"#state": "state"},
                ExpressionAttributeValues={
                    ":gone": _encode(AgentState.GONE.value),
                    ":zero": _encode(0),
                    ":exp": _encode(self._clock() + self._timings.gone_ttl_seconds),
                },
            )
        except ClientError as err:
            if not _is_condition_failure(err):
                raise
            raise AgentNotFound(f"agent {agent_id} is not registered") from err

    async def get_agent(self, agent_id: str) -> AgentRecord | None:
        """The agent's entry (read consistently), or None if there is none."""
        response = await self._client.get_item(
            TableName=self._tables.agents, Key={"agent_id": _encode(agent_id)}, ConsistentRead=True
        )
        item = response.get("Item")
        return _agent_from_item(item) if item else None

    async def list_agents(
        self,
        model: str | None = None,
        *,
        include_expired: bool = False,
        fields: Collection[str] | None = None,
    ) -> list[AgentRecord]:
        """Every unexpired agent, of one model (through the `by_model` index) or of all.

        `include_expired` also returns entries whose heartbeat stopped and that TTL has not
        deleted yet: the pool manager's reaper needs to see those. `fields` reads only those
        attributes (the others keep their defaults): parsing a response costs the caller's
        event loop time in proportion to the attributes in it.
        """
        now = self._clock()
        request: dict[str, Any] = {"TableName": self._tables.agents}
        if fields is not None:
            wanted = sorted(set(fields) | _AGENT_REQUIRED_FIELDS)
            names = {f"#f{number}": name for number, name in enumerate(wanted)}
            request["ProjectionExpression"] = ", ".join(names)
            request["ExpressionAttributeNames"] = names
        if not include_expired:
            request["FilterExpression"] = "expires_at > :now"
            request["ExpressionAttributeValues"] = {":now": _encode(now)}
        if model is None:
            items = self._paginate(self._client.scan, request)
        else:
            request["IndexName"] = BY_MODEL_INDEX
            request["KeyConditionExpression"] = "model = :model"
            values = request.setdefault("ExpressionAttributeValues", {})
            values[":model"] = _encode(model)
            items = self._paginate(self._client.query, request)
        return [_agent_from_item(item) async for item in items]

    async def list_ready(self, model: str) -> list[AgentRecord]:
        """Unexpired `ready` agents serving `model`."""
        return [agent for agent in await self.list_agents(model) if agent.state is AgentState.READY]

    async def _refusal(
        self, agent_id: str, action: str, current: AgentRecord | None = None
    ) -> RegistryError:
        """Explain why a conditional write on an agent failed."""
        if current is None:
            current = await self.get_agent(agent_id)
        if current is None:
            return AgentNotFound(f"cannot {action} agent {agent_id}: it is not registered")
        if current.state is AgentState.GONE:
            return AgentGone(f"cannot {action} agent {agent_id}: it is gone")
        return InvalidTransition(f"cannot {action} agent {agent_id}: it is {current.state}")

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

    # -- API keys --

    async def create_key(
        self,
        name: str,
        *,
        rpm: int | None = None,
        tpm: int | None = None,
        max_tokens: int | None = None,
        models: Iterable[str] = (),
    ) -> CreatedApiKey:
        """Create a key; the returned full key text is the only time it is ever available."""
        if not name.strip():
            raise ValueError("a key needs a name")
        for label, limit in (("rpm", rpm), ("tpm", tpm), ("max_tokens", max_tokens)):
            if limit is not None and limit < 1:
                raise ValueError(f"{label} must be positive")
        api_key, parsed = new_api_key()
        record = ApiKeyRecord(
            key_id=parsed.key_id,
            name=name,
            rpm=rpm,
            tpm=tpm,
            max_tokens=max_tokens,
            models=frozenset(models),
            created_at=self._clock(),
        )
        item = _encode_item(
            {
                **{name: getattr(record, name) for name in ApiKeyRecord.__dataclass_fields__},
                "secret_hash": hash_secret(parsed.secret),
            }
        )
        await self._client.put_item(
            TableName=self._tables.keys,
            Item=item,
            ConditionExpression="attribute_not_exists(key_id)",
        )
        return CreatedApiKey(record=record, api_key=api_key)

    async def verify_key(self, api_key: str) -> ApiKeyRecord:
        """The record of a valid, enabled key; `ApiKeyRejected` or `ApiKeyDisabled` otherwise."""
        try:
            parsed = parse_api_key(api_key)
        except MalformedApiKey as err:
            raise ApiKeyRejected("invalid API key") from err
        response = await self._client.get_item(
            TableName=self._tables.keys, Key={"key_id": _encode(parsed.key_id)}
        )
        item = response.get("Item")
        stored_hash = item["secret_hash"].get("S") if item and "secret_hash" in item else None
        if not secret_matches(stored_hash, parsed.secret) or item is None:
            raise ApiKeyRejected("invalid API key")
        record = _key_from_item(item)
        if record.disabled:
            raise ApiKeyDisabled(f"API key {record.key_id} is disabled")
        return record

    async def get_key(self, key_id: str) -> ApiKeyRecord | None:
        """A key's settings by id (for holders of a token issued to it), or None."""
        response = await self._client.get_item(
            TableName=self._tables.keys, Key={"key_id": _encode(key_id)}
        )
        item = response.get("Item")
        return _key_from_item(item) if item else None

    async def disable_key(self, key_id: str) -> None:
        """Disable a key at once; tokens it already obtained expire on their own (≤ 15 min)."""
        try:
            await self._client.update_item(
                TableName=self._tables.keys,
                Key={"key_id": _encode(key_id)},
                UpdateExpression="SET disabled = :true",
                ConditionExpression="attribute_exists(key_id)",
                ExpressionAttributeValues={":true": _encode(True)},
            )
        except ClientError as err:
            if not _is_condition_failure(err):
                raise
            raise ApiKeyNotFound(f"no API key with id {key_id}") from err

    async def list_keys(self) -> list[ApiKeyRecord]:
        """Every key's settings, oldest first."""
        items = self._paginate(self._client.scan, {"TableName": self._tables.keys})
        records = [_key_from_item(item) async for item in items]
        return sorted(records, key=lambda record: (record.created_at, record.key_id))

    # -- demand --

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
            Item=_encode_item(
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
        key = {"model": _encode(model), "gateway_id": _encode(POOL_TARGET_SOURCE)}
        if count is None:
            await self._client.delete_item(TableName=self._tables.demand, Key=key)
            return
        await self._client.put_item(
            TableName=self._tables.demand,
            Item={**key, "target": _encode(count), "at": _encode(self._clock())},
        )

    async def read_pool_targets(self) -> dict[str, int]:
        """Agent counts fixed with `set_pool_target`, per model."""
        items = self._paginate(
            self._client.scan,
            {
                "TableName": self._tables.demand,
                "FilterExpression": "gateway_id = :source",
                "ExpressionAttributeValues": {":source": _encode(POOL_TARGET_SOURCE)},
            },
        )
        targets: dict[str, int] = {}
        async for item in items:
            values = _decode_item(item)
            targets[str(values["model"])] = int(values["target"])
        return targets

    async def read_demand(self) -> dict[str, Demand]:
        """Demand per model, summed over gateways that published recently."""
        items = self._paginate(
            self._client.scan,
            {
                "TableName": self._tables.demand,
                "FilterExpression": "expires_at > :now",
                "ExpressionAttributeValues": {":now": _encode(self._clock())},
            },
        )
        totals: dict[str, Demand] = {}
        async for item in items:
            values = _decode_item(item)
            model = str(values["model"])
            seen = totals.get(model, Demand())
            totals[model] = Demand(
                pending=seen.pending + int(values.get("pending", 0)),
                active=seen.active + int(values.get("active", 0)),
            )
        return totals
