"""The `launches` table: what the pool manager vouches for of each agent it launched.

An agent writes its own `agents` row, so a compromised one can put anything in it (a model it
was not launched for, a capacity of a million). The pool manager, which launched it, writes
here what it launched: the model, the instance type and the most streams such an instance
serves, and the agent's URL where it is known at launch. Only the pool manager's role may
write this table (agents have no access); gateways route to an agent only as far as its row
agrees with its launch record (`gateway/vouching.py`). Records never change once written.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from spotgate.registry.base import RegistryBase
from spotgate.registry.codec import decode_item, encode, encode_item

if TYPE_CHECKING:
    from types_aiobotocore_dynamodb.type_defs import KeysAndAttributesTypeDef

BATCH_GET_MAX_KEYS = 100
"""DynamoDB's most keys in one `BatchGetItem`."""


@dataclass(frozen=True, slots=True)
class LaunchRecord:
    """An agent the pool manager launched, and what it vouches for."""

    agent_id: str
    model: str
    instance_type: str
    capacity: int  # the most streams an agent on this instance type may say it serves
    # Where the agent listens, when the launcher knows it (local agents: their loopback URL);
    # None: any URL inside the gateways' `agent_networks` (EC2: the agents' private subnets).
    url: str | None = None
    launched_at: float = 0.0


def launch_from_item(item: dict[str, Any]) -> LaunchRecord:
    """A `launches` item as a record; attributes the record does not know are ignored."""
    values = decode_item(item)
    known = LaunchRecord.__dataclass_fields__
    return LaunchRecord(**{name: value for name, value in values.items() if name in known})


class LaunchOperations(RegistryBase):
    """Launch records: written by the pool manager, read by the gateways."""

    async def record_launch(self, record: LaunchRecord) -> None:
        """Write (or write again: it is the same) what the pool manager launched."""
        await self._client.put_item(
            TableName=self._tables.launches, Item=encode_item(asdict(record))
        )

    async def forget_launch(self, agent_id: str) -> None:
        """Remove an agent's launch record (its instance is terminated); idempotent."""
        await self._client.delete_item(
            TableName=self._tables.launches, Key={"agent_id": encode(agent_id)}
        )

    async def get_launches(self, agent_ids: Collection[str]) -> dict[str, LaunchRecord]:
        """The launch records of these agents (agents without one are absent)."""
        found: dict[str, LaunchRecord] = {}
        ids = sorted(set(agent_ids))
        for start in range(0, len(ids), BATCH_GET_MAX_KEYS):
            wanted: dict[str, KeysAndAttributesTypeDef] = {
                self._tables.launches: {
                    "Keys": [
                        {"agent_id": encode(i)} for i in ids[start : start + BATCH_GET_MAX_KEYS]
                    ]
                }
            }
            while wanted:  # what DynamoDB left unprocessed (throttling) is asked for again
                answer = await self._client.batch_get_item(RequestItems=wanted)
                for item in answer.get("Responses", {}).get(self._tables.launches, []):
                    record = launch_from_item(item)
                    found[record.agent_id] = record
                unprocessed = answer.get("UnprocessedKeys") or {}
                wanted = {name: {"Keys": list(keys["Keys"])} for name, keys in unprocessed.items()}
        return found
