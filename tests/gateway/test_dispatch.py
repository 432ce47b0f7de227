"""Several gateways, one pool: each agent is the authority on its own capacity."""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Hashable
from dataclasses import replace
from ipaddress import ip_network
from typing import Any

import aiohttp
import pytest

from gateway.dispatch import (
    FEED_OVERLAP_SECONDS,
    FORECAST_READ_SECONDS,
    WHOLE_READ_SECONDS,
    Dispatcher,
    GatewayClosing,
    NoCapacity,
    PoolView,
    QueueFull,
)
from gateway.fair_queue import FORECAST_GRACE_SECONDS, Queued, eta_seconds, wait_deadline
from gateway.router import Candidate, agent_url_allowed
from gpu_agent.runtime import StreamHandle
from spotgate.protocol import GenerateFrame
from spotgate.registry import (
    AgentRecord,
    AgentState,
    CreatedApiKey,
    LaunchRecord,
    PoolForecast,
)
from spotgate.settings import QueueSettings, RoutingSettings
from spotgate.tenancy import tenant_of
from spotgate.tokens import SigningKey
from stack.emulator import AwsEmulator
from tests.gateway.conftest import MODEL, Gateway, running_gateway
from tests.support.agents import AgentFactory, synthetic, wait_for, wait_ready
from tests.support.clocks import FakeClock
from tests.support.wsclient import connect, generate, run_streams, text_of

CAPACITY = 3


class MostStreams(dict[Hashable, StreamHandle]):
    """An agent's table of its streams that remembers the most it ever held at once."""

    most = 0

    def __setitem__(self, key: Hashable, value: StreamHandle) -> None:
        super().__setitem__(key, value)
        self.most = max(self.most, len(self))


async def test_two_gateways_never_put_more_than_its_capacity_on_an_agent_and_queue_the_rest(
    aws: AwsEmulator,
    gateway_key: SigningKey,
    start_agent: AgentFactory,
    api_key: CreatedApiKey,
) -> None:
    queue = QueueSettings(max_pending_per_model=16, deadline_seconds=30.0)
    async with (
        running_gateway(aws, gateway_key, queue=queue) as first,
        running_gateway(aws, gateway_key, queue=queue, public_url=first.url) as second,
    ):
        engine = synthetic(40.0, model=MODEL, ttft_seconds=0.01, capacity=CAPACITY)
        agent = await wait_ready(
            await start_agent(
                engine,
                pinned_public_key=gateway_key.verify_key.to_pem(),
                token_issuer=first.url,
            )
        )
        streams = agent.runtime.streams = MostStreams()
        agent_id = agent.runtime.identity.agent_id  # type: ignore[union-attr]

        async def routable_through_both() -> bool:
            records = [g.state.dispatcher.view.record(agent_id) for g in (first, second)]
            return all(r is not None and r.state is AgentState.READY for r in records)

        await wait_for(routable_through_both)

        async def client(gateway: Gateway, prefix: str) -> dict[str, list[Any]]:
            requests = [generate(f"{prefix}{n}", MODEL, max_tokens=20) for n in range(5)]
            async with connect(gateway.ws_url, api_key.api_key) as ws:
                return await run_streams(ws, *requests)

        # Over 3 × its capacity at once, half through each gateway.
        results = await asyncio.gather(client(first, "a"), client(second, "b"))

    frames = {stream: seen for result in results for stream, seen in result.items()}
    assert len(frames) == 10
    assert all(seen[-1]["type"] == "done" for seen in frames.values()), frames
    assert streams.most == CAPACITY  # full, and never more
    waited = [stream for stream, seen in frames.items() if seen[0]["type"] == "queued"]
    assert len(waited) >= 10 - 2 * CAPACITY  # each gateway alone would send it `CAPACITY`


# --- the view, from the registry's change feed -------------------------------------------


def entry(
    agent_id: str,
    changed_at: float,
    state: AgentState = AgentState.READY,
    expires_at: float = 1_000.0,
) -> AgentRecord:
    return AgentRecord(
        agent_id=agent_id,
        url=f"http://{agent_id}",
        model=MODEL,
        state=state,
        capacity=CAPACITY,
        expires_at=expires_at,
        changed_at=changed_at,
    )


def test_the_view_reads_the_whole_feed_then_what_changed_then_the_whole_feed_again() -> None:
    view = PoolView()
    assert view.next_read_since(now=5.0) is None  # nothing read yet

    view.replace([entry("a", changed_at=9.0)], now=10.0)
    assert view.next_read_since(now=10.5) == 9.0 - FEED_OVERLAP_SECONDS
    view.update([entry("b", changed_at=12.0)], now=12.5)
    assert view.next_read_since(now=13.0) == 12.0 - FEED_OVERLAP_SECONDS
    view.update([], now=13.0)  # nothing changed: the same window again
    assert view.next_read_since(now=13.5) == 12.0 - FEED_OVERLAP_SECONDS

    assert view.next_read_since(now=10.0 + WHOLE_READ_SECONDS) is None


@pytest.mark.parametrize(
    ("known", "read", "state"),
    [
        (entry("a", 5.0), entry("a", 6.0, AgentState.DRAINING), AgentState.DRAINING),
        # The feed lags: an older copy read after a newer one changes nothing.
        (entry("a", 6.0, AgentState.DRAINING), entry("a", 5.0), AgentState.DRAINING),
        (entry("a", 6.0, AgentState.GONE), entry("a", 5.0), AgentState.GONE),
        (entry("a", 5.0, AgentState.DRAINING), entry("a", 5.0, AgentState.DRAINING), "same"),
    ],
)
def test_the_newest_write_of_an_entry_wins_whatever_order_reads_bring_it(
    known: AgentRecord, read: AgentRecord, state: AgentState | str
) -> None:
    view = PoolView()
    view.replace([known], now=1.0)
    view.update([read], now=2.0)
    record = view.record("a")
    assert record is not None
    assert record.state is (known.state if state == "same" else state)
    assert view.newest_change == max(known.changed_at, read.changed_at)


def test_expired_entries_leave_the_view_and_a_whole_read_forgets_deleted_ones() -> None:
    view = PoolView()
    view.replace([entry("a", 1.0, expires_at=20.0), entry("b", 1.0), entry("c", 1.0)], now=1.0)

    view.update([], now=20.0)  # a's heartbeats stopped: it expires in every reader's view
    assert view.record("a") is None
    view.replace([entry("b", 1.0)], now=21.0)  # c was deleted from the table (TTL)
    assert [record.agent_id for record in view.agents[MODEL]] == ["b"]


VPC = [ip_network("10.0.0.0/16"), ip_network("fd00::/8")]


@pytest.mark.parametrize(
    ("url", "networks", "allowed"),
    [
        ("ws://10.0.3.7:8000/v1/ws", VPC, True),
        ("ws://[fd00::7]:8000/v1/ws", VPC, True),
        ("ws://10.1.0.1:8000/v1/ws", VPC, False),  # another network
        ("ws://203.0.113.9:8000/v1/ws", VPC, False),  # the internet
        ("ws://agent.internal:8000/v1/ws", VPC, False),  # a name resolves anywhere
        ("ws://169.254.169.254/latest", VPC, False),  # instance metadata
        ("not a url", VPC, False),
        ("ws://203.0.113.9:8000/v1/ws", [], True),  # none configured: local mode
    ],
)
def test_agent_urls_must_be_addresses_inside_the_configured_networks(
    url: str, networks: list[Any], allowed: bool
) -> None:
    assert agent_url_allowed(url, networks) is allowed


class FeedOf:
    """A registry whose change feed holds these entries."""

    def __init__(self, *records: AgentRecord) -> None:
        self.records = list(records)

    async def changed_since(self, _since: float | None) -> list[AgentRecord]:
        return self.records

    async def get_launches(self, agent_ids: Collection[str]) -> dict[str, LaunchRecord]:
        """Every agent of the feed launched for its model and capacity, as first seen."""
        return {
            r.agent_id: LaunchRecord(r.agent_id, r.model, "local", r.capacity)
            for r in self.records
            if r.agent_id in agent_ids
        }


async def test_a_registry_row_pointing_outside_the_networks_never_reaches_routing() -> None:
    dispatcher = Dispatcher(QueueSettings(), clock=lambda: 1.0, agent_networks=VPC)
    feed: Any = FeedOf(replace(entry("a", 1.0), url="ws://10.0.0.5:8000"))
    await dispatcher.refresh(feed)
    assert dispatcher.view.record("a") is not None

    hijack = replace(entry("a", 2.0), url="ws://203.0.113.9:8000")
    feed.records = [hijack]  # a newer write, from a stolen agent role
    await dispatcher.refresh(feed)
    record = dispatcher.view.record("a")
    assert record is not None
    assert record.url == "ws://10.0.0.5:8000"


@pytest.mark.parametrize(
    ("gateway_region", "remote", "chosen"), [("us-east-1", ["a"], "b"), (None, [], "a")]
)
async def test_an_agent_in_the_gateways_own_region_is_chosen_first_at_equal_load(
    gateway_region: str | None, remote: list[str], chosen: str
) -> None:
    dispatcher = Dispatcher(QueueSettings(), clock=lambda: 1.0, region=gateway_region)
    west = replace(entry("a", 1.0), region="us-west-2")
    east = replace(entry("b", 1.0), region="us-east-1")
    await dispatcher.refresh(FeedOf(west, east))
    assert [c.agent_id for c in dispatcher.candidates(MODEL) if c.remote] == remote
    choice = dispatcher.choose(MODEL, None, ())
    assert choice is not None
    assert choice.agent_id == chosen


MAX_WAIT_SECONDS = 900.0


@pytest.mark.parametrize(
    ("deadline", "forecast", "until"),
    [
        (100.0, None, 100.0),  # nothing booting: the stream's own deadline
        (100.0, PoolForecast(500.0, 400.0), 500.0 + FORECAST_GRACE_SECONDS),  # covers the boot
        (100.0, PoolForecast(2000.0, 1900.0), MAX_WAIT_SECONDS),  # but never past the cap
        (700.0, PoolForecast(50.0, 30.0), 700.0),  # and never shortens it
    ],
)
def test_a_booting_agent_stretches_a_queued_streams_deadline(
    deadline: float, forecast: PoolForecast | None, until: float
) -> None:
    assert wait_deadline(deadline, forecast, 0.0, MAX_WAIT_SECONDS) == until


@pytest.mark.parametrize(
    ("forecast", "now", "eta"),
    [
        (None, 100.0, None),
        (PoolForecast(130.2, 60.0), 100.0, 31.0),
        (PoolForecast(90.0, 60.0), 100.0, 0.0),
    ],
)
def test_the_eta_is_whole_seconds_to_the_forecast_never_negative(
    forecast: PoolForecast | None, now: float, eta: float | None
) -> None:
    assert eta_seconds(forecast, now) == eta


class FeedAndForecasts(FeedOf):
    """A registry with a change feed and the pool manager's forecasts."""

    def __init__(self) -> None:
        super().__init__()
        self.forecasts: dict[str, PoolForecast] = {}

    async def read_forecasts(self, models: Collection[str]) -> dict[str, PoolForecast]:
        return {model: f for model, f in self.forecasts.items() if model in models}


@pytest.mark.parametrize("booting", [True, False])
async def test_a_queued_stream_hears_the_eta_and_outlives_its_deadline_while_one_boots(
    booting: bool,
) -> None:
    clock = FakeClock(1_000.0)
    dispatcher = Dispatcher(QueueSettings(), scale_from_zero_models=(MODEL,), clock=clock)
    registry: Any = FeedAndForecasts()
    events = dispatcher.acquire(MODEL, session=None, exclude=(), deadline=clock.now + 10.0)
    assert await anext(events) == Queued(0, None)  # no forecast read yet
    if booting:
        registry.forecasts = {MODEL: PoolForecast(clock.now + 120.0, 120.0)}
        await dispatcher.refresh(registry)  # a stream waits: the forecasts are read
        assert await anext(events) == Queued(0, 120.0)
    clock.advance(30.0)  # past the stream's own deadline
    if booting:  # the agent booted and registered
        registry.records = [entry("a", clock.now, expires_at=clock.now + 100.0)]
    waiting = asyncio.create_task(anext(events))
    await dispatcher.refresh(registry)
    if booting:
        chosen = await waiting
        assert isinstance(chosen, Candidate)
        assert chosen.agent_id == "a"
    else:
        with pytest.raises(NoCapacity):
            await waiting


async def test_a_forecast_withdrawn_as_its_agent_turns_ready_does_not_end_the_wait() -> None:
    clock = FakeClock(1_000.0)
    dispatcher = Dispatcher(QueueSettings(), scale_from_zero_models=(MODEL,), clock=clock)
    registry: Any = FeedAndForecasts()
    events = dispatcher.acquire(MODEL, session=None, exclude=(), deadline=clock.now + 10.0)
    assert await anext(events) == Queued(0, None)
    registry.forecasts = {MODEL: PoolForecast(clock.now + 120.0, 120.0)}
    await dispatcher.refresh(registry)
    assert await anext(events) == Queued(0, 120.0)
    clock.advance(100.0)
    registry.forecasts = {}  # the pool saw the agent ready before this gateway's view did
    clock.advance(FORECAST_READ_SECONDS)
    await dispatcher.refresh(registry)
    assert await anext(events) == Queued(0, None)  # still waiting: no forecast, no error
    registry.records = [entry("a", clock.now, expires_at=clock.now + 100.0)]
    waiting = asyncio.create_task(anext(events))
    await dispatcher.refresh(registry)
    chosen = await waiting
    assert isinstance(chosen, Candidate)


async def test_an_unreadable_forecast_keeps_the_view_fresh_and_waiters_woken() -> None:
    class Failing(FeedAndForecasts):
        async def read_forecasts(self, models: Collection[str]) -> dict[str, PoolForecast]:
            raise PermissionError("AccessDenied")

    clock = FakeClock(1_000.0)
    dispatcher = Dispatcher(QueueSettings(), scale_from_zero_models=(MODEL,), clock=clock)
    registry: Any = Failing()
    events = dispatcher.acquire(MODEL, session=None, exclude=(), deadline=clock.now + 10.0)
    assert await anext(events) == Queued(0, None)
    registry.records = [entry("a", clock.now, expires_at=clock.now + 100.0)]
    waiting = asyncio.create_task(anext(events))
    await dispatcher.refresh(registry)
    assert isinstance(await waiting, Candidate)
    assert dispatcher.view.last_error is None


def conversation_turn(turns: int, topic: str) -> GenerateFrame:
    messages = [{"role": "system", "content": "Answer about EC2. " * 40}]
    for n in range(turns):
        messages.append({"role": "user", "content": f"{topic} question {n}. " * 30})
        messages.append({"role": "assistant", "content": f"{topic} answer {n}. " * 30})
    messages.append({"role": "user", "content": f"{topic} last question."})
    return GenerateFrame.model_validate(
        {"type": "generate", "id": "s", "model": MODEL, "messages": messages}
    )


async def test_the_next_turn_goes_where_the_conversation_went_and_a_gone_agent_is_forgotten() -> (
    None
):
    dispatcher = Dispatcher(QueueSettings(), clock=lambda: 1.0)
    feed: Any = FeedOf(entry("a", 1.0), entry("b", 1.0))
    await dispatcher.refresh(feed)
    for topic in (f"topic-{n}" for n in range(8)):
        first = dispatcher.prompt_prefix(conversation_turn(1, topic))
        assert first is not None
        by_key = dispatcher.choose(MODEL, None, (), first)
        assert by_key is not None
        # The turn went elsewhere (its agent was full then): the next turn follows it there.
        elsewhere = "b" if by_key.agent_id == "a" else "a"
        dispatcher.taken(elsewhere, first)
        after = dispatcher.choose(
            MODEL, None, (), dispatcher.prompt_prefix(conversation_turn(2, topic))
        )
        assert after is not None
        assert after.agent_id == elsewhere

    held = dispatcher.prefixes.blocks_held()
    feed.records = [entry("a", 2.0, AgentState.GONE), entry("b", 1.0)]
    await dispatcher.refresh(feed)
    blocks = first.blocks
    assert dispatcher.prefixes.matched_blocks("a", blocks) == 0
    assert 0 < dispatcher.prefixes.blocks_held() < held


def test_with_prefix_routing_off_streams_carry_no_prefix() -> None:
    dispatcher = Dispatcher(QueueSettings(), routing=RoutingSettings(prefix_aware=False))
    assert dispatcher.prompt_prefix(conversation_turn(1, "t")) is None


async def test_a_conversation_without_a_session_stays_on_one_agent_through_either_gateway(
    aws: AwsEmulator,
    gateway_key: SigningKey,
    start_agent: AgentFactory,
    api_key: CreatedApiKey,
) -> None:
    async with (
        running_gateway(aws, gateway_key) as first,
        running_gateway(aws, gateway_key, public_url=first.url) as second,
    ):
        agent_ids = []
        for _ in range(3):
            # Room to spare: no agent is so much busier than another that a conversation spills
            # (a replica that did not route its last turn would not know where it went).
            engine = synthetic(200.0, model=MODEL, ttft_seconds=0.01, capacity=64)
            agent = await wait_ready(
                await start_agent(
                    engine,
                    pinned_public_key=gateway_key.verify_key.to_pem(),
                    token_issuer=first.url,
                )
            )
            agent_ids.append(agent.runtime.identity.agent_id)  # type: ignore[union-attr]

        async def routable_through_both() -> bool:
            return all(
                (record := g.state.dispatcher.view.record(agent_id)) is not None
                and record.state is AgentState.READY
                for g in (first, second)
                for agent_id in agent_ids
            )

        await wait_for(routable_through_both)

        gateways = (first, second, first)

        async def conversation(topic: str) -> list[list[dict[str, str]]]:
            """Three turns, each re-sending the history, alternately through each gateway."""
            messages: list[dict[str, str]] = [
                {"role": "system", "content": "Answer about EC2. " * 40}
            ]
            prompts = []
            for turn, gateway in enumerate(gateways):
                messages.append({"role": "user", "content": f"{topic} question {turn}. " * 20})
                prompts.append(list(messages))
                frame = {"type": "generate", "id": f"{topic}-{turn}", "model": MODEL}
                async with connect(gateway.ws_url, api_key.api_key) as ws:
                    seen = await run_streams(ws, {**frame, "messages": messages, "max_tokens": 8})
                frames = seen[f"{topic}-{turn}"]
                assert frames[-1]["type"] == "done", frames
                messages.append({"role": "assistant", "content": text_of(frames)})
            return prompts

        conversations = await asyncio.gather(*(conversation(f"topic-{n}") for n in range(12)))
        async with aiohttp.ClientSession() as http, http.get(f"{first.ops_url}/metrics") as reply:
            exported = await reply.text()

    tenant = tenant_of(api_key.record.key_id, api_key.record.tenant)

    def served_by(prompts: list[list[dict[str, str]]]) -> set[str]:
        """The agents that hold a turn whole, in the index of the gateway that sent it.

        (`start` names no agent; a turn's blocks after the shared system prompt are its own.)
        """
        holders = set()
        for prompt, gateway in zip(prompts, gateways, strict=True):
            frame = GenerateFrame(id="t", model=MODEL, messages=prompt, tenant=tenant)  # type: ignore[arg-type]
            prefix = gateway.state.dispatcher.prompt_prefix(frame)
            assert prefix is not None
            index = gateway.state.dispatcher.prefixes
            full = len(prefix.blocks)
            holders |= {a for a in agent_ids if index.matched_blocks(a, prefix.blocks) == full}
        return holders

    served = [served_by(prompts) for prompts in conversations]
    assert all(len(agents) == 1 for agents in served), served
    held = first.state.dispatcher.prefixes.blocks_held()
    assert held > 0
    assert f"spotgate_gateway_prefix_index_blocks {held:.1f}" in exported
    assert len(set.union(*served)) >= 2  # conversations spread over the agents


async def test_a_closing_gateway_ends_the_waits_in_its_queue_and_places_nothing_more() -> None:
    clock = FakeClock(1_000.0)
    dispatcher = Dispatcher(QueueSettings(), scale_from_zero_models=(MODEL,), clock=clock)
    events = dispatcher.acquire(MODEL, session=None, exclude=(), deadline=clock.now + 60.0)
    assert await anext(events) == Queued(0, None)
    waiting = asyncio.create_task(anext(events))
    dispatcher.close()
    with pytest.raises(GatewayClosing):
        await waiting
    later = dispatcher.acquire(MODEL, session=None, exclude=(), deadline=clock.now + 60.0)
    with pytest.raises(GatewayClosing):
        await anext(later)
    assert dispatcher.pending() == {}


def pin_prompt(pin: int, question: str, tenant: str) -> GenerateFrame:
    """A chat whose system prompt holds a 4-digit secret in its first block."""
    system = f"The vault PIN is {pin:04d}. Never say it. " + "Answer about EC2. " * 40
    return GenerateFrame.model_validate(
        {
            "type": "generate",
            "id": "s",
            "model": MODEL,
            "tenant": tenant,
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": question},
            ],
        }
    )


@pytest.mark.parametrize(("attacker", "found"), [("key:b", True), ("key:a", False)])
async def test_another_tenants_guesses_go_where_load_and_their_own_text_send_them(
    attacker: str, found: bool
) -> None:
    # Key B's prompt holds a PIN; key A knows the rest and tries every PIN, several questions
    # each. Under B's own tenant (as before tenants), the right PIN goes where B's went every
    # time and no other does: the PIN is found. Under A's, it is one more guess.
    dispatcher = Dispatcher(QueueSettings(), clock=lambda: 1.0)
    feed: Any = FeedOf(entry("a", 1.0), entry("b", 1.0), entry("c", 1.0))
    await dispatcher.refresh(feed)
    secret = 4821
    victim = dispatcher.prompt_prefix(pin_prompt(secret, "Hello", "key:b"))
    assert victim is not None
    dispatcher.taken("b", victim)

    def always_on_b(pin: int) -> bool:
        placed = []
        for question in range(6):
            prefix = dispatcher.prompt_prefix(pin_prompt(pin, f"Question {question}?", attacker))
            chosen = dispatcher.choose(MODEL, None, (), prefix)
            assert chosen is not None
            placed.append(chosen.agent_id)
        return set(placed) == {"b"}

    singled_out = [pin for pin in range(4800, 4840) if always_on_b(pin)]
    assert (singled_out == [secret]) is found
    assert (secret in singled_out) is found


async def test_a_stream_under_way_waits_ahead_of_new_ones_even_in_a_full_queue() -> None:
    """A stream moved or resumed mid-reply is never refused for a full queue, nor waits last."""
    clock = FakeClock(1_000.0)
    queue = QueueSettings(max_pending_per_model=1)
    dispatcher = Dispatcher(queue, scale_from_zero_models=(MODEL,), clock=clock)
    registry: Any = FeedAndForecasts()
    new = dispatcher.acquire(MODEL, session=None, exclude=(), deadline=clock.now + 60.0)
    assert await anext(new) == Queued(0, None)
    refused = dispatcher.acquire(MODEL, session=None, exclude=(), deadline=clock.now + 60.0)
    with pytest.raises(QueueFull):
        await anext(refused)
    moved = dispatcher.acquire(
        MODEL, session=None, exclude=(), deadline=clock.now + 60.0, under_way=True
    )
    assert await anext(moved) == Queued(0, None)  # ahead of the new stream
    assert dispatcher.pending() == {MODEL: 2}

    registry.records = [replace(entry("a", clock.now, expires_at=clock.now + 100.0), capacity=1)]
    placing = asyncio.create_task(anext(moved))
    await dispatcher.refresh(registry)
    chosen = await placing
    assert isinstance(chosen, Candidate)
    assert chosen.agent_id == "a"  # the new stream, behind it, could not choose first
    await new.aclose()


async def test_a_flex_stream_takes_an_agent_only_when_no_interactive_stream_waits() -> None:
    """Flex streams wait behind interactive ones, add no demand, and have room of their own."""
    clock = FakeClock(1_000.0)
    dispatcher = Dispatcher(
        QueueSettings(max_pending_per_model=1), scale_from_zero_models=(MODEL,), clock=clock
    )
    registry: Any = FeedAndForecasts()
    deadline = clock.now + 60.0
    flex = dispatcher.acquire(MODEL, session=None, exclude=(), deadline=deadline, flex=True)
    assert await anext(flex) == Queued(0, None)
    interactive = dispatcher.acquire(MODEL, session=None, exclude=(), deadline=deadline)
    assert await anext(interactive) == Queued(0, None)  # ahead of the flex stream
    assert await anext(flex) == Queued(1, None)
    assert dispatcher.pending() == {MODEL: 1}  # the demand: flex streams size no pool
    assert dispatcher.waiting(MODEL) == 2
    second_flex = dispatcher.acquire(MODEL, session=None, exclude=(), deadline=deadline, flex=True)
    with pytest.raises(QueueFull):  # the flex tier's room is full; the interactive one's too
        await anext(second_flex)

    registry.records = [replace(entry("a", clock.now, expires_at=clock.now + 100.0), capacity=1)]
    placing = asyncio.create_task(anext(interactive))
    await dispatcher.refresh(registry)
    chosen = await placing
    assert isinstance(chosen, Candidate)
    dispatcher.started(chosen.agent_id)
    dispatcher.finished(chosen.agent_id)  # the interactive stream ends: the flex one's turn
    assert await anext(flex) == Queued(0, None)
    taken = await anext(flex)
    assert isinstance(taken, Candidate)
    dispatcher.started(taken.agent_id)
    late = dispatcher.acquire(MODEL, session=None, exclude=(), deadline=deadline, flex=True)
    assert await anext(late) == Queued(0, None)
    await late.aclose()


async def test_a_tenants_burst_does_not_hold_another_tenants_stream_behind_it() -> None:
    """Ten streams of one key wait; another key's stream waits behind one of them, not ten."""
    clock = FakeClock(1_000.0)
    dispatcher = Dispatcher(QueueSettings(), scale_from_zero_models=(MODEL,), clock=clock)
    deadline = clock.now + 60.0

    def waiting(tenant: str) -> Any:
        return dispatcher.acquire(
            MODEL, session=None, exclude=(), deadline=deadline, tenant=tenant, cost_tokens=100
        )

    burst = [waiting("heavy") for _ in range(10)]
    assert [await anext(stream) for stream in burst] == [Queued(n, None) for n in range(10)]
    light = waiting("light")

    assert await anext(light) == Queued(1, None)  # after the burst's first, not its last
    dispatcher.weigh("weighty", 4.0)  # its key's weight: four of its streams a round
    weighty = [waiting("weighty") for _ in range(2)]
    # Its first with the other tenants' first; its second a quarter turn on, before the
    # burst's second (weight 1: after it).
    assert [await anext(stream) for stream in weighty] == [Queued(2, None), Queued(3, None)]
    for stream in [*burst, light, *weighty]:
        await stream.aclose()
