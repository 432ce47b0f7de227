from __future__ import annotations

import pytest

from spotgate.registry import Registry, aws_session, object_id
from spotgate.registry.batches import PURGE_GRACE_SECONDS, SHOWN_UNTIL, names_an_object
from stack.emulator import AwsEmulator
from tests.support.clocks import FakeClock

LEASE_SECONDS = 30.0


async def make_batch(registry: Registry, owner: str = "k1", batch_id: str = "batch_1") -> None:
    await registry.create_batch(owner, {"id": batch_id, "status": "validating"})


async def test_one_holder_works_a_batch_until_its_lease_runs_out(
    registry: Registry, clock: FakeClock
) -> None:
    await make_batch(registry)

    first = await registry.take_lease("k1", "batch_1", "gw-a", LEASE_SECONDS)
    refused = await registry.take_lease("k1", "batch_1", "gw-b", LEASE_SECONDS)
    renewed = await registry.take_lease("k1", "batch_1", "gw-a", LEASE_SECONDS)
    clock.advance(LEASE_SECONDS + 1)
    taken_over = await registry.take_lease("k1", "batch_1", "gw-b", LEASE_SECONDS)
    lost = await registry.save_batch(
        "k1", {"id": "batch_1", "status": "in_progress"}, "gw-a", LEASE_SECONDS, ended=False
    )

    assert first is not None
    assert first.lease_holder == "gw-a"
    assert refused is None
    assert renewed is not None
    assert taken_over is not None
    assert taken_over.lease_holder == "gw-b"
    assert lost is None  # the old holder's save is refused: it stops at once
    stored = await registry.get_batch("k1", "batch_1")
    assert stored is not None
    assert stored.body["status"] == "validating"


async def test_an_ended_batch_leaves_the_work_list_and_takes_no_lease(
    registry: Registry,
) -> None:
    await make_batch(registry, batch_id="batch_1")
    await make_batch(registry, owner="k2", batch_id="batch_2")
    assert sorted(await registry.open_batches()) == [("k1", "batch_1"), ("k2", "batch_2")]

    await registry.take_lease("k1", "batch_1", "gw-a", LEASE_SECONDS)
    saved = await registry.save_batch(
        "k1", {"id": "batch_1", "status": "completed"}, "gw-a", LEASE_SECONDS, ended=True
    )

    assert saved is not None
    assert saved.lease_holder is None
    assert await registry.open_batches() == [("k2", "batch_2")]
    assert await registry.take_lease("k1", "batch_1", "gw-a", LEASE_SECONDS) is None


async def test_a_cancel_is_recorded_once_and_only_while_the_batch_is_worked(
    registry: Registry,
) -> None:
    await make_batch(registry)

    first = await registry.request_cancel("k1", "batch_1", 100)
    second = await registry.request_cancel("k1", "batch_1", 200)
    stranger = await registry.request_cancel("k2", "batch_1", 300)

    assert first is not None
    assert first.cancel_requested_at == 100
    assert second is not None
    assert second.cancel_requested_at == 100
    assert stranger is None
    await registry.take_lease("k1", "batch_1", "gw-a", LEASE_SECONDS)
    await registry.save_batch(
        "k1", {"id": "batch_1", "status": "completed"}, "gw-a", LEASE_SECONDS, ended=True
    )
    await make_batch(registry, batch_id="batch_2")
    await registry.take_lease("k1", "batch_2", "gw-a", LEASE_SECONDS)
    await registry.save_batch(
        "k1", {"id": "batch_2", "status": "completed"}, "gw-a", LEASE_SECONDS, ended=True
    )
    ended = await registry.request_cancel("k1", "batch_2", 400)
    assert ended is not None
    assert ended.cancel_requested_at is None


async def test_a_keys_objects_list_newest_first_in_pages_and_expire(
    registry: Registry, clock: FakeClock
) -> None:
    ids = []
    for n in range(3):
        file_id = object_id("file-", clock())
        ids.append(file_id)
        expires = int(clock()) + 60 if n == 0 else None
        await registry.put_file("k1", {"id": file_id, "purpose": "batch", "expires_at": expires})
        clock.advance(1)
    await registry.put_file("k2", {"id": object_id("file-", clock()), "purpose": "batch"})

    first, more = await registry.list_objects("k1", "file-", after=None, limit=2, newest_first=True)
    rest, more_after = await registry.list_objects(
        "k1", "file-", after=first[-1].id, limit=2, newest_first=True
    )
    oldest_first, _ = await registry.list_objects(
        "k1", "file-", after=None, limit=10, newest_first=False
    )
    clock.advance(60)
    after_expiry, _ = await registry.list_objects(
        "k1", "file-", after=None, limit=10, newest_first=True
    )

    assert [stored.id for stored in first] == [ids[2], ids[1]]
    assert more
    assert [stored.id for stored in rest] == [ids[0]]
    assert not more_after
    assert [stored.id for stored in oldest_first] == ids
    assert [stored.id for stored in after_expiry] == [ids[2], ids[1]]
    assert await registry.get_object("k1", ids[0]) is None
    assert await registry.get_object("k2", ids[1]) is None


@pytest.mark.parametrize(
    ("text", "prefix", "names"),
    [
        ("file-01a2b3c4d5e6f7a8b9c0d1e2f3", "file-", True),
        ("batch_01a2b3c4d5e6f7a8b9c0d1e2f3", "file-", False),
        ("file-" + "x" * 5000, "file-", False),  # DynamoDB refuses such a key: never asked
        ("", "batch_", False),
    ],
)
def test_only_what_could_be_an_id_made_here_is_looked_up(
    text: str, prefix: str, names: bool
) -> None:
    assert names_an_object(text, prefix) is names


async def test_files_past_their_expiry_are_found_until_their_records_go(
    registry: Registry, clock: FakeClock
) -> None:
    now = int(clock())
    await registry.put_file("k1", {"id": "file-old", "expires_at": now - 1})
    await registry.put_file("k2", {"id": "file-new", "expires_at": now + 60})
    await registry.put_file("k2", {"id": "file-kept", "expires_at": None})
    await make_batch(registry)

    assert await registry.expired_files() == [("k1", "file-old")]
    await registry.delete_object("k1", "file-old")
    clock.advance(61)
    assert await registry.expired_files() == [("k2", "file-new")]


async def test_dynamodb_takes_a_file_record_only_a_day_after_the_sweep_could(
    registry: Registry, aws: AwsEmulator
) -> None:
    await registry.put_file("k1", {"id": "file-a", "expires_at": 1_000})
    settings = aws.settings()
    table = settings.tables.batches
    endpoint = settings.aws.endpoint_url
    async with aws_session(settings.aws).client("dynamodb", endpoint_url=endpoint) as dynamodb:
        ttl = await dynamodb.describe_time_to_live(TableName=table)
        key = {"owner": {"S": "k1"}, "object_id": {"S": "file-a"}}
        item = (await dynamodb.get_item(TableName=table, Key=key))["Item"]

    assert ttl["TimeToLiveDescription"]["AttributeName"] == "expires_at"
    assert item["expires_at"] == {"N": str(1_000 + PURGE_GRACE_SECONDS)}
    assert item[SHOWN_UNTIL] == {"N": "1000"}
