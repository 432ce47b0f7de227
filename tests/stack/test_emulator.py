"""The embedded AWS emulator serves for hours: it keeps nothing per request."""

from __future__ import annotations

from moto.dynamodb.models.dynamo_type import Item

from spotgate.registry import Registry, aws_session
from stack.emulator import AwsEmulator


async def test_requests_leave_no_copies_of_items_behind(aws: AwsEmulator) -> None:
    async with Registry.open(aws.settings()) as registry:
        await registry.create_tables()
        for number in range(3):
            await registry.create_key(f"key {number}")
            await registry.list_agents()
            await registry.read_demand()

    assert Item.instances_tracked == []  # type: ignore[attr-defined]


async def test_emptied_it_keeps_its_tables_and_nothing_else(aws: AwsEmulator) -> None:
    settings = aws.settings()
    async with Registry.open(settings) as registry:
        await registry.create_tables()
        await registry.create_key("kept only until emptied")
        async with aws_session(settings.aws).client("sqs", endpoint_url=aws.url) as sqs:
            await sqs.create_queue(QueueName="emptied")
            aws.empty()
            queues = await sqs.list_queues()
        keys = await registry.list_keys()  # DynamoDB refuses a read of a table it lacks

    assert "QueueUrls" not in queues
    assert keys == []
