"""The `agents` table: registering, heartbeats, the life cycle, and reading the pool.

Every rule of the life cycle is enforced by a conditional write, so two writers (the agent
and the pool manager) can race without breaking it: `gone` is never resurrected, `draining`
never goes back to `ready`, and the first `draining` wins. Every read filters
`expires_at > now`, because DynamoDB's TTL deletes lazily.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from spotgate.registry.base import RegistryBase, is_condition_failure
from spotgate.registry.codec import agent_from_item, agent_to_item, encode
from spotgate.registry.records import (
    AgentGone,
    AgentNotFound,
    AgentRecord,
    AgentState,
    DrainOutcome,
    InvalidTransition,
    RegistryError,
)
from spotgate.registry.schema import (
    BY_CHANGE_INDEX,
    BY_MODEL_INDEX,
    FEED_PARTITIONS,
    feed_shard,
)

if TYPE_CHECKING:
    from types_aiobotocore_dynamodb.type_defs import AttributeValueTypeDef


def instance_agent_id(partition: str, region: str, account: str, instance_id: str) -> str:
    """The id the agent on an EC2 instance registers under: the instance's ARN.

    IAM names the instance a request comes from by that ARN (`${ec2:SourceInstanceARN}`), so
    the agents' role can be held to its own row (`dynamodb:LeadingKeys`) and the pool manager,
    which knows its instances' ARNs, finds the row of each.
    """
    return f"arn:{partition}:ec2:{region}:{account}:instance/{instance_id}"


FEED_SET = "feed = :feed, changed_at = :changed"
"""Part of every update routing must hear of (`_feed_values` gives its values); setting
`feed` too puts an entry written before the feed existed into it."""


class AgentOperations(RegistryBase):
    """The agents' entries: written by the agents and the pool manager, read by everyone."""

    async def register(self, record: AgentRecord) -> AgentRecord:
        """Create an agent's entry as `starting` or `ready` (a `starting` entry may turn ready)."""
        if record.state not in (AgentState.STARTING, AgentState.READY):
            raise InvalidTransition(f"an agent registers as starting or ready, not {record.state}")
        now = self._clock()
        ready = record.state is AgentState.READY
        stored = replace(
            record,
            heartbeat_at=now,
            expires_at=now + self._timings.agent_ttl_seconds,
            started_at=record.started_at or now,
            ready_at=now if ready else None,
            changed_at=now,
            boot=replace(record.boot, ready=now) if ready else record.boot,
        )
        await self._put_over_starting(stored, f"register as {record.state}")
        return stored

    async def register_failed(self, record: AgentRecord) -> None:
        """Write the entry of an agent that could not start: `gone`, with its `failure`.

        In place of nothing or its own `starting` entry, never of a live one; kept as long as
        any `gone` entry, so the pool manager reaps its instance and operators read why.
        """
        now = self._clock()
        stored = replace(
            record,
            state=AgentState.GONE,
            active=0,
            heartbeat_at=now,
            expires_at=now + self._timings.gone_ttl_seconds,
            started_at=record.started_at or now,
            changed_at=now,
        )
        await self._put_over_starting(stored, "register as failed")

    async def _put_over_starting(self, stored: AgentRecord, action: str) -> None:
        """Write an entry where there is none or its agent's own `starting` one."""
        try:
            await self._client.put_item(
                TableName=self._tables.agents,
                Item=agent_to_item(stored),
                ConditionExpression="attribute_not_exists(agent_id) OR #state = :starting",
                ExpressionAttributeNames={"#state": "state"},
                ExpressionAttributeValues={":starting": encode(AgentState.STARTING.value)},
            )
        except ClientError as err:
            if not is_condition_failure(err):
                raise
            raise await self._refusal(stored.agent_id, action) from err

    async def heartbeat(self, agent_id: str, active: int) -> None:
        """Record liveness and load; fails for an unknown or `gone` agent."""
        now = self._clock()
        try:
            await self._client.update_item(
                TableName=self._tables.agents,
                Key={"agent_id": encode(agent_id)},
                UpdateExpression=(
                    "SET active = :active, heartbeat_at = :now, expires_at = :exp, "
                    "heartbeats = if_not_exists(heartbeats, :zero) + :one, " + FEED_SET
                ),
                ConditionExpression="attribute_exists(agent_id) AND #state <> :gone",
                ExpressionAttributeNames={"#state": "state"},
                ExpressionAttributeValues={
                    ":active": encode(active),
                    ":now": encode(now),
                    ":zero": encode(0),
                    ":one": encode(1),
                    ":exp": encode(now + self._timings.agent_ttl_seconds),
                    ":gone": encode(AgentState.GONE.value),
                    **self._feed_values(agent_id, now),
                },
            )
        except ClientError as err:
            if not is_condition_failure(err):
                raise
            raise await self._refusal(agent_id, "heartbeat") from err

    async def set_draining(self, agent_id: str, deadline: float) -> DrainOutcome:
        """Mark an agent `draining` until `deadline`; the first caller's deadline wins."""
        try:
            response = await self._client.update_item(
                TableName=self._tables.agents,
                Key={"agent_id": encode(agent_id)},
                UpdateExpression=(
                    "SET #state = :draining, drain_deadline = :deadline, "
                    "heartbeats_at_drain = if_not_exists(heartbeats, :zero), " + FEED_SET
                ),
                ConditionExpression="attribute_exists(agent_id) AND #state IN (:starting, :ready)",
                ExpressionAttributeNames={"#state": "state"},
                ExpressionAttributeValues={
                    ":draining": encode(AgentState.DRAINING.value),
                    ":deadline": encode(deadline),
                    ":zero": encode(0),
                    ":starting": encode(AgentState.STARTING.value),
                    ":ready": encode(AgentState.READY.value),
                    **self._feed_values(agent_id, self._clock()),
                },
                ReturnValues="ALL_NEW",
            )
        except ClientError as err:
            if not is_condition_failure(err):
                raise
            current = await self.get_agent(agent_id)
            if current is not None and current.state is AgentState.DRAINING:
                return DrainOutcome(first=False, record=current)
            raise await self._refusal(agent_id, "drain", current) from err
        return DrainOutcome(first=True, record=agent_from_item(response["Attributes"]))

    async def record_rebalance(self, agent_id: str, at: float) -> None:
        """Note AWS's rebalance recommendation (an early warning, not a drain); first one kept."""
        try:
            await self._client.update_item(
                TableName=self._tables.agents,
                Key={"agent_id": encode(agent_id)},
                UpdateExpression="SET rebalance_at = if_not_exists(rebalance_at, :at)",
                ConditionExpression="attribute_exists(agent_id) AND #state <> :gone",
                ExpressionAttributeNames={"#state": "state"},
                ExpressionAttributeValues={
                    ":at": encode(at),
                    ":gone": encode(AgentState.GONE.value),
                },
            )
        except ClientError as err:
            if not is_condition_failure(err):
                raise
            raise await self._refusal(agent_id, "record a rebalance for") from err

    async def set_gone(self, agent_id: str) -> None:
        """Mark an agent `gone` for good (idempotent); TTL removes the entry later."""
        now = self._clock()
        try:
            await self._client.update_item(
                TableName=self._tables.agents,
                Key={"agent_id": encode(agent_id)},
                UpdateExpression=(
                    "SET #state = :gone, active = :zero, expires_at = :exp, " + FEED_SET
                ),
                ConditionExpression="attribute_exists(agent_id)",
                ExpressionAttributeNames={"#state": "state"},
                ExpressionAttributeValues={
                    ":gone": encode(AgentState.GONE.value),
                    ":zero": encode(0),
                    ":exp": encode(now + self._timings.gone_ttl_seconds),
                    **self._feed_values(agent_id, now),
                },
            )
        except ClientError as err:
            if not is_condition_failure(err):
                raise
            raise AgentNotFound(f"agent {agent_id} is not registered") from err

    async def remove_gone(self, agent_id: str) -> None:
        """Delete a `gone` entry, so its instance's next boot registers afresh (idempotent).

        Only the pool manager calls it, for an instance of the warm pool it is about to start
        again (the instance keeps its id, its agent its row's key). A live entry is never
        removed: that is refused, as is bringing a `gone` one back in place.
        """
        try:
            await self._client.delete_item(
                TableName=self._tables.agents,
                Key={"agent_id": encode(agent_id)},
                ConditionExpression="attribute_not_exists(agent_id) OR #state = :gone",
                ExpressionAttributeNames={"#state": "state"},
                ExpressionAttributeValues={":gone": encode(AgentState.GONE.value)},
            )
        except ClientError as err:
            if not is_condition_failure(err):
                raise
            raise await self._refusal(agent_id, "remove") from err

    async def record_warm_boot(self, agent_id: str) -> None:
        """Mark the agent's boot a warm start (the pool manager started its stopped instance)."""
        try:
            await self._client.update_item(
                TableName=self._tables.agents,
                Key={"agent_id": encode(agent_id)},
                UpdateExpression="SET boot_kind = :warm",
                ConditionExpression="attribute_exists(agent_id) AND #state <> :gone",
                ExpressionAttributeNames={"#state": "state"},
                ExpressionAttributeValues={
                    ":warm": encode("warm"),
                    ":gone": encode(AgentState.GONE.value),
                },
            )
        except ClientError as err:
            if not is_condition_failure(err):
                raise
            raise await self._refusal(agent_id, "record a warm boot for") from err

    async def get_agent(self, agent_id: str) -> AgentRecord | None:
        """The agent's entry (read consistently), or None if there is none."""
        response = await self._client.get_item(
            TableName=self._tables.agents, Key={"agent_id": encode(agent_id)}, ConsistentRead=True
        )
        item = response.get("Item")
        return agent_from_item(item) if item else None

    async def list_agents(
        self, model: str | None = None, *, include_expired: bool = False
    ) -> list[AgentRecord]:
        """Every unexpired agent, of one model (through the `by_model` index) or of all.

        `include_expired` also returns entries whose heartbeat stopped and that TTL has not
        deleted yet: the pool manager's reaper needs to see those.
        """
        now = self._clock()
        request: dict[str, Any] = {"TableName": self._tables.agents}
        if not include_expired:
            request["FilterExpression"] = "expires_at > :now"
            request["ExpressionAttributeValues"] = {":now": encode(now)}
        if model is None:
            items = self._paginate(self._client.scan, request)
        else:
            request["IndexName"] = BY_MODEL_INDEX
            request["KeyConditionExpression"] = "model = :model"
            values = request.setdefault("ExpressionAttributeValues", {})
            values[":model"] = encode(model)
            items = self._paginate(self._client.query, request)
        return [agent_from_item(item) async for item in items]

    async def changed_since(self, since: float | None) -> list[AgentRecord]:
        """Entries whose `changed_at` is after `since` (None: all), expired and gone included.

        Read from the change feed, which holds only what routing reads (`FEED_FIELDS`): the
        cost is the size of what changed, not of the table. The feed is eventually
        consistent, so a reader asks again a little before its last change.
        """
        pages = await asyncio.gather(
            *(self._changed_in(partition, since) for partition in FEED_PARTITIONS)
        )
        return [record for page in pages for record in page]

    async def _changed_in(self, shard: str, since: float | None) -> list[AgentRecord]:
        request: dict[str, Any] = {
            "TableName": self._tables.agents,
            "IndexName": BY_CHANGE_INDEX,
            "KeyConditionExpression": "feed = :feed",
            "ExpressionAttributeValues": {":feed": encode(shard)},
        }
        if since is not None:
            request["KeyConditionExpression"] += " AND changed_at > :since"
            request["ExpressionAttributeValues"][":since"] = encode(since)
        return [agent_from_item(item) async for item in self._paginate(self._client.query, request)]

    @staticmethod
    def _feed_values(agent_id: str, now: float) -> dict[str, AttributeValueTypeDef]:
        """The values `FEED_SET` writes: the entry moves to the head of its feed partition."""
        return {":feed": encode(feed_shard(agent_id)), ":changed": encode(now)}

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
