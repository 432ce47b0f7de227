"""The `batches` table: files' and batches' records by owning key, and the batches' leases.

An item is one object, keyed by its owner (the API key that made it) and its id, holding
OpenAI's object as JSON. Ids are time-ordered (`object_id`), so a key's objects list newest
first by their sort key. A batch not yet ended carries `work` (the sparse `by_work` index):
every gateway replica reads it to find batches, and one works each at a time, holding a
lease (`lease_holder`, `lease_until`) it renews with every save. A cancel is its own
attribute, so the API writes it without racing the worker's saves.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from spotgate.registry.base import RegistryBase, is_condition_failure
from spotgate.registry.codec import decode_item, encode
from spotgate.registry.schema import BY_WORK_INDEX

SHOWN_UNTIL = "shown_until"
"""A file record's attribute: its `expires_at` as the API shows it (the item's own
`expires_at`, DynamoDB's TTL, is a day later)."""
PURGE_GRACE_SECONDS = 86_400
MAX_OBJECT_ID_CHARS = 64
"""Ids made here are 33 to 38 characters; a longer one names nothing (and DynamoDB refuses
sort keys over 1,024 bytes: a client's 5,000-character id must not become a 500)."""
WORK_OPEN = "open"
"""`work` of every batch still to be worked (one partition: a few writes per batch)."""


def names_an_object(text: str, prefix: str) -> bool:
    """Whether `text` could be an id made here with `prefix` (else nothing has it)."""
    return text.startswith(prefix) and len(text) <= MAX_OBJECT_ID_CHARS


def shown_until(values: dict[str, Any]) -> object:
    """When a record stops being shown (records written before `shown_until`: at the TTL)."""
    return values.get(SHOWN_UNTIL, values.get("expires_at"))


def object_id(prefix: str, now: float) -> str:
    """A new id (`file-…`, `batch_…`) that sorts by creation time, then at random."""
    return f"{prefix}{int(now * 1000):012x}{secrets.token_hex(8)}"


@dataclass(frozen=True, slots=True)
class StoredObject:
    """A file's or batch's record: OpenAI's object as last saved; a batch's cancel and worker."""

    owner: str
    body: dict[str, Any]
    cancel_requested_at: int | None = None
    lease_holder: str | None = None
    lease_until: float | None = None

    @property
    def id(self) -> str:
        """The batch's id."""
        return str(self.body["id"])


def _stored_object(item: dict[str, Any]) -> StoredObject:
    values = decode_item(item)
    cancel = values.get("cancel_requested_at")
    lease_until = values.get("lease_until")
    holder = values.get("lease_holder")
    return StoredObject(
        owner=str(values["owner"]),
        body=json.loads(str(values["body"])),
        cancel_requested_at=int(cancel) if isinstance(cancel, int | float) else None,
        lease_holder=str(holder) if holder is not None else None,
        lease_until=float(lease_until) if isinstance(lease_until, int | float) else None,
    )


class BatchOperations(RegistryBase):
    """Files' and batches' records: the API's reads and writes, and the workers' leases."""

    async def put_file(self, owner: str, body: dict[str, Any]) -> None:
        """Record a file (OpenAI's `File` object), shown until its `expires_at`, if any.

        DynamoDB's TTL (the item's `expires_at`) takes the record a day later: the hourly
        sweep, which deletes its contents from S3 with it, sees it first.
        """
        item = {
            "owner": encode(owner),
            "object_id": encode(str(body["id"])),
            "body": encode(json.dumps(body)),
        }
        if body.get("expires_at") is not None:
            item[SHOWN_UNTIL] = encode(int(body["expires_at"]))
            item["expires_at"] = encode(int(body["expires_at"]) + PURGE_GRACE_SECONDS)
        await self._client.put_item(TableName=self._tables.batches, Item=item)

    async def get_object(self, owner: str, object_id: str) -> dict[str, Any] | None:
        """A file or batch the key owns, as OpenAI's object (None: none, or expired)."""
        if len(object_id) > MAX_OBJECT_ID_CHARS:
            return None
        item = await self._item(owner, object_id)
        return json.loads(str(decode_item(item)["body"])) if item is not None else None

    async def get_batch(self, owner: str, batch_id: str) -> StoredObject | None:
        """A batch the key owns, with its cancel and lease."""
        if not names_an_object(batch_id, "batch_"):
            return None
        item = await self._item(owner, batch_id)
        return _stored_object(item) if item is not None else None

    async def _item(self, owner: str, object_id: str) -> dict[str, Any] | None:
        reply = await self._client.get_item(
            TableName=self._tables.batches,
            Key={"owner": encode(owner), "object_id": encode(object_id)},
            ConsistentRead=True,
        )
        item = reply.get("Item")
        if item is None:
            return None
        expires = shown_until(decode_item(item))
        if isinstance(expires, int | float) and expires <= self._clock():
            return None
        return dict(item)

    async def delete_object(self, owner: str, object_id: str) -> bool:
        """Forget a file the key owns; whether there was one."""
        reply = await self._client.delete_item(
            TableName=self._tables.batches,
            Key={"owner": encode(owner), "object_id": encode(object_id)},
            ReturnValues="ALL_OLD",
        )
        return bool(reply.get("Attributes"))

    async def list_objects(
        self,
        owner: str,
        prefix: str,
        *,
        after: str | None,
        limit: int,
        newest_first: bool,
        purpose: str | None = None,
    ) -> tuple[list[StoredObject], bool]:
        """The key's objects with ids starting `prefix` (and of `purpose`), after `after`.

        Also whether more follow.
        """
        request: dict[str, Any] = {
            "TableName": self._tables.batches,
            "KeyConditionExpression": "#owner = :owner AND begins_with(object_id, :prefix)",
            "ExpressionAttributeNames": {"#owner": "owner"},
            "ExpressionAttributeValues": {":owner": encode(owner), ":prefix": encode(prefix)},
            "ScanIndexForward": not newest_first,
        }
        if after is not None and names_an_object(after, prefix):
            request["ExclusiveStartKey"] = {"owner": encode(owner), "object_id": encode(after)}
        now = self._clock()
        found: list[StoredObject] = []
        async for item in self._paginate(self._client.query, request):
            expires = shown_until(decode_item(item))
            if isinstance(expires, int | float) and expires <= now:
                continue
            stored = _stored_object(item)
            if purpose is not None and stored.body.get("purpose") != purpose:
                continue
            if len(found) == limit:
                return found, True
            found.append(stored)
        return found, False

    async def expired_files(self) -> list[tuple[str, str]]:
        """Files past their `expires_at` whose records DynamoDB's TTL has not taken yet.

        (owner, file id) of each: their contents are deleted with them. A scan of the whole
        table, done once an hour by each replica.
        """
        request: dict[str, Any] = {
            "TableName": self._tables.batches,
            "FilterExpression": f"begins_with(object_id, :file) AND {SHOWN_UNTIL} <= :now",
            "ExpressionAttributeValues": {":file": encode("file-"), ":now": encode(self._clock())},
            "ProjectionExpression": "#owner, object_id",
            "ExpressionAttributeNames": {"#owner": "owner"},
        }
        found = []
        async for item in self._paginate(self._client.scan, request):
            values = decode_item(item)
            found.append((str(values["owner"]), str(values["object_id"])))
        return found

    async def create_batch(self, owner: str, body: dict[str, Any]) -> None:
        """Record a new batch, to be worked (`validating`)."""
        await self._client.put_item(
            TableName=self._tables.batches,
            Item={
                "owner": encode(owner),
                "object_id": encode(str(body["id"])),
                "body": encode(json.dumps(body)),
                "work": encode(WORK_OPEN),
            },
            ConditionExpression="attribute_not_exists(object_id)",
        )

    async def request_cancel(self, owner: str, batch_id: str, now: int) -> StoredObject | None:
        """Ask for a batch to be cancelled (the first time counts); the batch, or None if none."""
        if await self.get_batch(owner, batch_id) is None:
            return None
        try:
            await self._client.update_item(
                TableName=self._tables.batches,
                Key={"owner": encode(owner), "object_id": encode(batch_id)},
                UpdateExpression="SET cancel_requested_at = :now",
                ConditionExpression=(
                    "attribute_exists(#work) AND attribute_not_exists(cancel_requested_at)"
                ),
                ExpressionAttributeNames={"#work": "work"},
                ExpressionAttributeValues={":now": encode(now)},
            )
        except ClientError as err:
            if not is_condition_failure(err):
                raise
        return await self.get_batch(owner, batch_id)

    async def open_batches(self) -> list[tuple[str, str]]:
        """Every batch still to be worked: (owner, batch id), oldest first."""
        request: dict[str, Any] = {
            "TableName": self._tables.batches,
            "IndexName": BY_WORK_INDEX,
            "KeyConditionExpression": "#work = :open",
            "ExpressionAttributeNames": {"#work": "work"},
            "ExpressionAttributeValues": {":open": encode(WORK_OPEN)},
        }
        return [
            (str(values["owner"]), str(values["object_id"]))
            async for values in (
                decode_item(item) async for item in self._paginate(self._client.query, request)
            )
        ]

    async def take_lease(
        self, owner: str, batch_id: str, holder: str, seconds: float
    ) -> StoredObject | None:
        """Work the batch for `seconds` from now: it, if no other holder's lease is running."""
        now = self._clock()
        return await self._update_worked(
            owner,
            batch_id,
            "SET lease_holder = :me, lease_until = :until",
            "(attribute_not_exists(lease_until) OR lease_until < :now OR lease_holder = :me)",
            {":me": encode(holder), ":until": encode(now + seconds), ":now": encode(now)},
        )

    async def save_batch(
        self, owner: str, body: dict[str, Any], holder: str, seconds: float, *, ended: bool
    ) -> StoredObject | None:
        """Save the batch's object and renew the lease (or end the work); None: lease lost."""
        values = {":body": encode(json.dumps(body)), ":me": encode(holder)}
        if ended:
            update = "SET #body = :body REMOVE #work, lease_holder, lease_until"
        else:
            update = "SET #body = :body, lease_until = :until"
            values[":until"] = encode(self._clock() + seconds)
        return await self._update_worked(
            owner, str(body["id"]), update, "lease_holder = :me", values
        )

    async def _update_worked(
        self,
        owner: str,
        batch_id: str,
        update: str,
        condition: str,
        values: dict[str, Any],
    ) -> StoredObject | None:
        """Update a batch still to be worked, if `condition` holds: it after, or None."""
        names = {"#work": "work", **({"#body": "body"} if "#body" in update else {})}
        try:
            reply = await self._client.update_item(
                TableName=self._tables.batches,
                Key={"owner": encode(owner), "object_id": encode(batch_id)},
                UpdateExpression=update,
                ConditionExpression=f"attribute_exists(#work) AND {condition}",
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
                ReturnValues="ALL_NEW",
            )
        except ClientError as err:
            if is_condition_failure(err):
                return None
            raise
        return _stored_object(reply["Attributes"])
