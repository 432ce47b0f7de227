from __future__ import annotations

import asyncio
import hashlib
from dataclasses import replace

import aioboto3
import pytest
from pydantic import SecretStr

from spotgate.registry import (
    AgentGone,
    AgentNotFound,
    AgentRecord,
    AgentState,
    ApiKeyDisabled,
    ApiKeyNotFound,
    ApiKeyRejected,
    BatchBacklog,
    BootTimeline,
    Demand,
    InvalidTransition,
    PoolForecast,
    Registry,
    UsageCounts,
    UsageRow,
    aws_session,
    minute_of,
)
from spotgate.settings import AwsSettings
from stack.emulator import AwsEmulator
from tests.support.clocks import FakeClock

AWS_DYNAMODB_URL = "https://dynamodb.us-east-1.amazonaws.com"

TTL = 30.0  # SharedSettings().registry.agent_ttl_seconds
GONE_TTL = 3600.0  # and its gone_ttl_seconds


def agent(agent_id: str = "i-0abc", *, state: AgentState = AgentState.READY, model: str = "m"):
    return AgentRecord(
        agent_id=agent_id,
        url=f"http://10.0.0.1:8000/{agent_id}",
        model=model,
        state=state,
        capacity=64,
        lifecycle="spot",
        instance_type="g6.xlarge",
        zone="us-east-1a",
        engine="vllm",
    )


# --- agents ----------------------------------------------------------------------------------


async def test_register_ready_agent_is_listed_with_all_its_fields(
    registry: Registry, clock: FakeClock
) -> None:
    stored = await registry.register(agent())
    assert stored.heartbeat_at == clock.now
    assert stored.expires_at == clock.now + TTL
    assert stored.ready_at == clock.now

    listed = await registry.list_ready("m")

    assert listed == [stored]
    assert await registry.get_agent("i-0abc") == stored


async def test_the_boot_timeline_is_stored_and_ends_when_the_registry_marks_it_ready(
    registry: Registry, clock: FakeClock
) -> None:
    booted = BootTimeline(instance_start=1.0, agent_start=20.0, engine_loaded=80.0, warmed_up=81.0)
    stored = await registry.register(replace(agent(), boot=booted))
    assert stored.boot == replace(booted, ready=clock.now)
    assert (await registry.get_agent("i-0abc")) == stored
    assert stored.boot.elapsed_seconds() == {
        "agent_start": 19.0,
        "engine_loaded": 79.0,
        "warmed_up": 80.0,
        "ready": clock.now - 1.0,
    }


async def test_list_ready_only_returns_agents_of_that_model(registry: Registry) -> None:
    await registry.register(agent("a", model="m1"))
    await registry.register(agent("b", model="m2"))

    assert [record.agent_id for record in await registry.list_ready("m1")] == ["a"]
    assert {record.agent_id for record in await registry.list_agents()} == {"a", "b"}


async def test_the_change_feed_holds_what_routing_reads_and_only_what_changed(
    registry: Registry, clock: FakeClock
) -> None:
    stored = {name: await registry.register(agent(name)) for name in ("a", "b", "c", "d")}
    before = clock.now
    clock.advance(1)
    await registry.heartbeat("a", active=5)
    await registry.set_draining("b", deadline=clock.now + 60)
    await registry.set_gone("c")
    await registry.record_rebalance("d", at=clock.now)  # routing does not care

    changed = {record.agent_id: record for record in await registry.changed_since(before)}

    assert set(changed) == {"a", "b", "c"}
    assert (changed["a"].active, changed["a"].changed_at) == (5, clock.now)
    assert changed["b"].state is AgentState.DRAINING
    assert changed["c"].state is AgentState.GONE  # readers must hear of it
    everything = await registry.changed_since(None)
    assert {record.agent_id for record in everything} == {"a", "b", "c", "d"}
    [d] = [record for record in everything if record.agent_id == "d"]
    # Only the feed's fields come back; the rest keeps its defaults.
    assert (d.url, d.capacity, d.changed_at) == (stored["d"].url, 64, before)
    assert (d.zone, d.lifecycle, d.rebalance_at) == ("local", "local", None)


async def test_an_entry_written_before_the_feed_existed_joins_it_on_its_next_heartbeat(
    registry: Registry, clock: FakeClock
) -> None:
    """A rolling upgrade: agents registered by an older version are routed to after one beat."""
    await registry.register(agent("old"))
    await registry._client.update_item(  # what an older agent's entry looks like
        TableName=registry._tables.agents,
        Key={"agent_id": {"S": "old"}},
        UpdateExpression="REMOVE feed, changed_at",
    )
    assert await registry.changed_since(None) == []

    clock.advance(1)
    await registry.heartbeat("old", active=0)

    assert [record.agent_id for record in await registry.changed_since(None)] == ["old"]


async def test_starting_agent_may_become_ready_but_is_not_listed_before(
    registry: Registry,
) -> None:
    await registry.register(agent(state=AgentState.STARTING))
    assert await registry.list_ready("m") == []

    await registry.register(agent(state=AgentState.READY))

    assert [record.state for record in await registry.list_ready("m")] == [AgentState.READY]


async def test_registering_a_ready_agent_twice_is_refused(registry: Registry) -> None:
    await registry.register(agent())
    with pytest.raises(InvalidTransition):
        await registry.register(agent())


async def test_gone_is_never_resurrected(registry: Registry) -> None:
    await registry.register(agent())
    await registry.set_gone("i-0abc")
    await registry.set_gone("i-0abc")  # idempotent

    for attempt in (
        registry.register(agent()),
        registry.register(agent(state=AgentState.STARTING)),
        registry.heartbeat("i-0abc", active=1),
        registry.set_draining("i-0abc", deadline=1.0),
        registry.record_rebalance("i-0abc", at=1.0),
    ):
        with pytest.raises(AgentGone):
            await attempt
    record = await registry.get_agent("i-0abc")
    assert record is not None
    assert record.state is AgentState.GONE
    assert await registry.list_ready("m") == []


async def test_an_agent_that_could_not_start_is_gone_with_its_reason_and_replaces_no_live_one(
    registry: Registry, clock: FakeClock
) -> None:
    await registry.register(agent("i-0live"))
    await registry.register(agent("i-0booting", state=AgentState.STARTING))
    failure = "SPOTGATE_AGENT_VLLM__ENGINE_ARGS: --x 1: not an engine argument"
    for agent_id in ("i-0new", "i-0booting"):
        await registry.register_failed(replace(agent(agent_id), failure=failure))
    with pytest.raises(InvalidTransition):
        await registry.register_failed(replace(agent("i-0live"), failure=failure))

    failed = {a.agent_id: a for a in await registry.list_agents() if a.failure is not None}
    assert set(failed) == {"i-0new", "i-0booting"}
    for record in failed.values():
        assert record.state is AgentState.GONE  # reaped by the pool manager, never routed to
        assert record.shown_state == "failed"
        assert record.failure == failure
        assert record.expires_at == clock.now + GONE_TTL
    assert [a.agent_id for a in await registry.list_ready("m")] == ["i-0live"]


async def test_a_stopped_instance_started_again_registers_afresh_once_its_gone_entry_is_removed(
    registry: Registry, clock: FakeClock
) -> None:
    """The warm pool: an instance keeps its id (its agent's key) over a stop and a start."""
    first = await registry.register(replace(agent(), boot=BootTimeline(instance_start=1.0)))
    await registry.set_gone("i-0abc")  # stopped into the warm pool
    with pytest.raises(AgentGone):  # the row itself never comes back
        await registry.register(agent())

    await registry.remove_gone("i-0abc")  # the pool manager, just before it starts it
    await registry.remove_gone("i-0abc")  # idempotent
    assert await registry.get_agent("i-0abc") is None
    clock.advance(600)
    again = await registry.register(replace(agent(), boot=BootTimeline(instance_start=clock.now)))
    assert again.ready_at == clock.now > (first.ready_at or 0)
    assert again.boot_kind == "cold"  # what the agent writes: the pool manager knows better

    await registry.record_warm_boot("i-0abc")
    stored = await registry.get_agent("i-0abc")
    assert stored is not None
    assert stored == replace(again, boot_kind="warm")


@pytest.mark.parametrize(
    "state", [AgentState.STARTING, AgentState.READY, AgentState.DRAINING], ids=str
)
async def test_a_live_entry_is_never_removed(registry: Registry, state: AgentState) -> None:
    """No one takes over a live row by having it removed: only a `gone` one goes."""
    await registry.register(agent(state=AgentState.STARTING))
    if state is AgentState.READY:
        await registry.register(agent())
    elif state is AgentState.DRAINING:
        await registry.set_draining("i-0abc", deadline=2_000_000_000.0)

    with pytest.raises(InvalidTransition):
        await registry.remove_gone("i-0abc")

    record = await registry.get_agent("i-0abc")
    assert record is not None
    assert record.state is state


async def test_a_warm_boot_is_recorded_only_for_a_registered_live_agent(
    registry: Registry,
) -> None:
    with pytest.raises(AgentNotFound):
        await registry.record_warm_boot("i-nobody")
    await registry.register(agent())
    await registry.set_gone("i-0abc")
    with pytest.raises(AgentGone):
        await registry.record_warm_boot("i-0abc")


async def test_draining_never_goes_back_to_ready(registry: Registry) -> None:
    await registry.register(agent())
    await registry.set_draining("i-0abc", deadline=2_000_000_000.0)

    with pytest.raises(InvalidTransition):
        await registry.register(agent())

    record = await registry.get_agent("i-0abc")
    assert record is not None
    assert record.state is AgentState.DRAINING
    assert record.drain_deadline == 2_000_000_000.0
    assert await registry.list_ready("m") == []
    assert [a.state for a in await registry.list_agents("m")] == [AgentState.DRAINING]


async def test_a_draining_agents_stream_count_is_known_once_a_heartbeat_follows_the_drain(
    registry: Registry,
) -> None:
    await registry.register(agent())
    await registry.heartbeat("i-0abc", active=0)
    await registry.set_draining("i-0abc", deadline=2_000_000_000.0)
    stale = await registry.get_agent("i-0abc")
    await registry.heartbeat("i-0abc", active=3)
    heard = await registry.get_agent("i-0abc")

    assert stale is not None
    assert heard is not None
    assert (stale.active, stale.active_since_drain) == (0, False)  # streams since, maybe
    assert (heard.active, heard.active_since_drain) == (3, True)


async def test_heartbeat_of_unknown_agent_fails(registry: Registry) -> None:
    with pytest.raises(AgentNotFound):
        await registry.heartbeat("i-nobody", active=0)
    assert await registry.get_agent("i-nobody") is None


async def test_expired_agents_are_not_listed_and_heartbeats_extend_life(
    registry: Registry, clock: FakeClock
) -> None:
    await registry.register(agent("kept"))
    await registry.register(agent("silent"))

    clock.advance(TTL - 1)
    await registry.heartbeat("kept", active=3)
    clock.advance(2)

    listed = await registry.list_ready("m")
    assert [record.agent_id for record in listed] == ["kept"]
    assert listed[0].active == 3
    assert [record.agent_id for record in await registry.list_agents()] == ["kept"]


async def test_concurrent_set_draining_is_idempotent_and_first_deadline_wins(
    registry: Registry,
) -> None:
    await registry.register(agent())

    outcomes = await asyncio.gather(
        *(registry.set_draining("i-0abc", deadline=1_900_000_000.0 + n) for n in range(10))
    )

    winners = [outcome for outcome in outcomes if outcome.first]
    assert len(winners) == 1
    deadline = winners[0].record.drain_deadline
    assert {outcome.record.drain_deadline for outcome in outcomes} == {deadline}
    assert all(outcome.record.state is AgentState.DRAINING for outcome in outcomes)


async def test_set_draining_and_set_gone_of_unknown_agent_fail(registry: Registry) -> None:
    with pytest.raises(AgentNotFound):
        await registry.set_draining("i-nobody", deadline=1.0)
    with pytest.raises(AgentNotFound):
        await registry.set_gone("i-nobody")


async def test_register_refuses_draining_or_gone_records(registry: Registry) -> None:
    with pytest.raises(InvalidTransition):
        await registry.register(agent(state=AgentState.DRAINING))
    assert await registry.get_agent("i-0abc") is None


async def test_rebalance_is_recorded_once_without_draining(registry: Registry) -> None:
    await registry.register(agent())
    await registry.record_rebalance("i-0abc", at=100.0)
    await registry.record_rebalance("i-0abc", at=200.0)

    record = await registry.get_agent("i-0abc")
    assert record is not None
    assert record.rebalance_at == 100.0
    assert record.state is AgentState.READY


async def test_create_tables_is_idempotent(registry: Registry) -> None:
    await registry.register(agent())
    await registry.create_tables()
    assert await registry.get_agent("i-0abc") is not None


# --- API keys --------------------------------------------------------------------------------


async def test_created_key_verifies_and_carries_its_limits(registry: Registry) -> None:
    created = await registry.create_key(
        "ci", rpm=60, tpm=10_000, max_tokens=512, models=["m"], weight=2.5
    )
    assert created.api_key.startswith(f"sg-{created.record.key_id}-")

    record = await registry.verify_key(created.api_key)

    assert record == created.record
    assert (record.rpm, record.tpm, record.max_tokens, record.weight) == (60, 10_000, 512, 2.5)
    assert record.allows_model("m")
    assert not record.allows_model("other")


async def test_only_the_secret_hash_is_stored(registry: Registry, aws: AwsEmulator) -> None:
    created = await registry.create_key("ci")
    secret = created.api_key.split("-", 2)[2]
    settings = aws.settings()
    session = aioboto3.Session(
        region_name=settings.aws.region,
        aws_access_key_id="local",
        aws_secret_access_key="local",
    )
    async with session.client("dynamodb", endpoint_url=settings.aws.endpoint_url) as client:
        page = await client.scan(TableName=settings.tables.keys)

    [item] = page["Items"]
    assert item["secret_hash"]["S"] == hashlib.sha256(secret.encode()).hexdigest()
    assert secret not in repr(item)


async def test_sessions_share_botocores_parsed_data_but_not_credentials() -> None:
    first, second = (
        aws_session(AwsSettings(region=region, access_key_id=key, secret_access_key=SecretStr(key)))
        for region, key in (("us-east-1", "first"), ("eu-west-1", "second"))
    )

    loader = first._session.get_component("data_loader")
    assert second._session.get_component("data_loader") is loader
    assert (first.region_name, second.region_name) == ("us-east-1", "eu-west-1")
    credentials = [await session.get_credentials() for session in (first, second)]
    assert [c.access_key for c in credentials if c is not None] == ["first", "second"]


@pytest.mark.parametrize(
    "mangle",
    [
        lambda key: key[:-1] + ("A" if key[-1] != "A" else "B"),  # wrong secret
        lambda key: "sg-000000000000-" + key.split("-", 2)[2],  # unknown key id
        lambda key: key.replace("sg-", "sk-"),  # malformed
        lambda key: "",
        lambda key: key + "x" * 300,  # oversize
    ],
)
async def test_wrong_keys_are_rejected_alike(registry: Registry, mangle) -> None:
    created = await registry.create_key("ci")
    with pytest.raises(ApiKeyRejected, match=r"^invalid API key$"):
        await registry.verify_key(mangle(created.api_key))


async def test_disabled_key_is_refused_and_listed_as_disabled(registry: Registry) -> None:
    created = await registry.create_key("ci")
    other = await registry.create_key("other")

    await registry.disable_key(created.record.key_id)

    with pytest.raises(ApiKeyDisabled):
        await registry.verify_key(created.api_key)
    assert (await registry.verify_key(other.api_key)).key_id == other.record.key_id
    listed = {record.key_id: record.disabled for record in await registry.list_keys()}
    assert listed == {created.record.key_id: True, other.record.key_id: False}


async def test_disabling_an_unknown_key_fails(registry: Registry) -> None:
    with pytest.raises(ApiKeyNotFound):
        await registry.disable_key("000000000000")


async def test_key_limits_must_be_positive(registry: Registry) -> None:
    with pytest.raises(ValueError, match="rpm"):
        await registry.create_key("ci", rpm=0)
    with pytest.raises(ValueError, match="weight must be above 0"):
        await registry.create_key("ci", weight=0)
    assert await registry.list_keys() == []


# --- demand ----------------------------------------------------------------------------------


async def test_demand_sums_live_gateways_and_ignores_expired(
    registry: Registry, clock: FakeClock
) -> None:
    await registry.publish_demand("m", "gw-old", pending=100, active=100)
    clock.advance(31)
    await registry.publish_demand("m", "gw-1", pending=2, active=5)
    await registry.publish_demand("m", "gw-2", pending=1, active=0)
    await registry.publish_demand("other", "gw-1", pending=0, active=7)

    assert await registry.read_demand() == {
        "m": Demand(pending=3, active=5),
        "other": Demand(pending=0, active=7),
    }


async def test_batch_backlogs_add_up_over_gateways_due_at_the_earliest(registry: Registry) -> None:
    await registry.publish_demand("m", "gw-1", pending=0, active=1, backlog=BatchBacklog(60, 900))
    await registry.publish_demand("m", "gw-2", pending=0, active=0, backlog=BatchBacklog(40, 500))
    await registry.publish_demand("m", "gw-3", pending=2, active=0)

    assert await registry.read_demand() == {"m": Demand(2, 1, BatchBacklog(100, 500))}


async def test_forecasts_are_read_until_withdrawn_or_expired_and_are_not_demand(
    registry: Registry, clock: FakeClock
) -> None:
    await registry.publish_demand("m", "gw-1", pending=2, active=0)
    await registry.publish_forecast(
        "m", PoolForecast(ready_at=clock.now + 90, cold_start_seconds=120)
    )
    await registry.publish_forecast(
        "n", PoolForecast(ready_at=clock.now + 5, cold_start_seconds=60)
    )
    assert await registry.read_forecasts(["m", "n", "other"]) == {
        "m": PoolForecast(ready_at=clock.now + 90, cold_start_seconds=120),
        "n": PoolForecast(ready_at=clock.now + 5, cold_start_seconds=60),
    }
    assert list(await registry.read_forecasts(["n"])) == ["n"]
    assert await registry.read_demand() == {"m": Demand(pending=2, active=0)}
    await registry.publish_forecast("n", None)  # nothing of it boots any more
    assert list(await registry.read_forecasts(["m", "n"])) == ["m"]
    clock.advance(31)  # a pool manager that stopped publishing promises nothing
    assert await registry.read_forecasts(["m"]) == {}


async def test_demand_is_replaced_not_accumulated_per_gateway(registry: Registry) -> None:
    await registry.publish_demand("m", "gw-1", pending=9, active=9)
    await registry.publish_demand("m", "gw-1", pending=1, active=2)

    assert await registry.read_demand() == {"m": Demand(pending=1, active=2)}


async def test_usage_from_several_gateways_adds_up_per_key_model_and_minute(
    registry: Registry, clock: FakeClock
) -> None:
    minute = minute_of(clock.now)
    one = UsageCounts(prompt_tokens=10, completion_tokens=20, streams=1)
    await registry.add_usage("key-a", "m1", minute, one, "w1")  # one gateway
    await registry.add_usage("key-a", "m1", minute, one + one, "w2")  # another, the same minute
    await registry.add_usage("key-a", "m1", minute, one + one, "w2")  # sent again: taken once
    await registry.add_usage("key-a", "m2", minute, one, "w3")
    await registry.add_usage("key-a", "m1", minute - 3600, one, "w4")  # an hour before
    await registry.add_usage("key-b", "m1", minute, one, "w5")

    recent = await registry.read_usage("key-a", since=clock.now - 60)
    assert recent == [
        UsageRow("key-a", "m1", minute, UsageCounts(30, 60, 3)),
        UsageRow("key-a", "m2", minute, UsageCounts(10, 20, 1)),
    ]
    day = await registry.read_usage("key-a", since=clock.now - 86400)
    assert [(row.model, row.minute) for row in day] == [
        ("m1", minute - 3600),
        ("m1", minute),
        ("m2", minute),
    ]
    every_key = await registry.read_usage(None, since=clock.now - 60)
    assert {row.key_id for row in every_key} == {"key-a", "key-b"}


async def test_a_client_of_a_plain_http_endpoint_builds_no_tls_context(aws: AwsEmulator) -> None:
    settings = aws.settings().aws
    session = aws_session(settings)
    async with session.client("dynamodb", endpoint_url=settings.endpoint_url) as plain:
        await plain.list_tables()
        plain_verify = plain._endpoint.http_session._verify
    async with session.client("dynamodb", endpoint_url=AWS_DYNAMODB_URL) as tls:
        tls_verify = tls._endpoint.http_session._verify

    assert plain_verify is False  # the emulator: no CA bundle parsed for it
    assert tls_verify is not False  # AWS itself: certificates checked as botocore does
