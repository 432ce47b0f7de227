"""The embedded AWS emulator serves for hours: it keeps nothing per request."""

from __future__ import annotations

from moto.dynamodb.models.dynamo_type import Item

from spotgate.registry import Registry
from stack.emulator import AwsEmulator


async def test_requests_leave_no_copies_of_items_behind(aws: AwsEmulator) -> None:
    async with Registry.open(aws.settings()) as registry:
        await registry.create_tables()
        for number in range(3):
            await registry.create_key(f"key {number}")
            await registry.list_agents()
            await registry.read_demand()

    assert Item.instances_tracked == []  # type: ignore[attr-defined]
