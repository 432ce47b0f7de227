"""The `keys` table: creating, verifying, disabling and listing API keys.

Only a key's hash is stored; the full key text exists once, in `create_key`'s answer.
"""

from __future__ import annotations

from collections.abc import Iterable

from botocore.exceptions import ClientError

from spotgate.apikeys import (
    MalformedApiKey,
    hash_secret,
    new_api_key,
    parse_api_key,
    secret_matches,
)
from spotgate.registry.base import RegistryBase, is_condition_failure
from spotgate.registry.codec import encode, encode_item, key_from_item
from spotgate.registry.records import (
    ApiKeyDisabled,
    ApiKeyNotFound,
    ApiKeyRecord,
    ApiKeyRejected,
    CreatedApiKey,
)
from spotgate.tenancy import valid_tenant_name

MAX_KEY_WEIGHT = 1_000.0
"""A key's weight at most: a thousand times another's share is as good as all of it."""


class ApiKeyOperations(RegistryBase):
    """API keys: the CLI manages them, the gateway verifies them."""

    async def create_key(
        self,
        name: str,
        *,
        rpm: int | None = None,
        tpm: int | None = None,
        max_tokens: int | None = None,
        models: Iterable[str] = (),
        max_streams: int | None = None,
        tenant: str | None = None,
        weight: float = 1.0,
    ) -> CreatedApiKey:
        """Create a key; the returned full key text is the only time it is ever available."""
        if not name.strip():
            raise ValueError("a key needs a name")
        limits = (("rpm", rpm), ("tpm", tpm), ("max_tokens", max_tokens))
        for label, limit in (*limits, ("max_streams", max_streams)):
            if limit is not None and limit < 1:
                raise ValueError(f"{label} must be positive")
        if not 0 < weight <= MAX_KEY_WEIGHT:
            raise ValueError(f"weight must be above 0 and at most {MAX_KEY_WEIGHT:g}")
        if tenant is not None and not valid_tenant_name(tenant):
            raise ValueError(
                "tenant: 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit"
            )
        api_key, parsed = new_api_key()
        record = ApiKeyRecord(
            key_id=parsed.key_id,
            name=name,
            rpm=rpm,
            tpm=tpm,
            max_tokens=max_tokens,
            models=frozenset(models),
            created_at=self._clock(),
            max_streams=max_streams,
            tenant=tenant,
            weight=weight,
        )
        item = encode_item(
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
            TableName=self._tables.keys, Key={"key_id": encode(parsed.key_id)}
        )
        item = response.get("Item")
        stored_hash = item["secret_hash"].get("S") if item and "secret_hash" in item else None
        if not secret_matches(stored_hash, parsed.secret) or item is None:
            raise ApiKeyRejected("invalid API key")
        record = key_from_item(item)
        if record.disabled:
            raise ApiKeyDisabled(f"API key {record.key_id} is disabled")
        return record

    async def get_key(self, key_id: str) -> ApiKeyRecord | None:
        """A key's settings by id (for holders of a token issued to it), or None."""
        response = await self._client.get_item(
            TableName=self._tables.keys, Key={"key_id": encode(key_id)}
        )
        item = response.get("Item")
        return key_from_item(item) if item else None

    async def disable_key(self, key_id: str) -> None:
        """Disable a key at once; tokens it already obtained expire on their own (≤ 15 min)."""
        try:
            await self._client.update_item(
                TableName=self._tables.keys,
                Key={"key_id": encode(key_id)},
                UpdateExpression="SET disabled = :true",
                ConditionExpression="attribute_exists(key_id)",
                ExpressionAttributeValues={":true": encode(True)},
            )
        except ClientError as err:
            if not is_condition_failure(err):
                raise
            raise ApiKeyNotFound(f"no API key with id {key_id}") from err

    async def list_keys(self) -> list[ApiKeyRecord]:
        """Every key's settings, oldest first."""
        items = self._paginate(self._client.scan, {"TableName": self._tables.keys})
        records = [key_from_item(item) async for item in items]
        return sorted(records, key=lambda record: (record.created_at, record.key_id))
