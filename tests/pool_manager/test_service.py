"""The pool manager end to end: local provider (real agent processes), gateway, moto server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import openai
import pytest

from gateway.dispatch import FORECAST_READ_SECONDS
from pool_manager.events import interruption_warning
from pool_manager.local_provider import NO_SPOT_ZONES_FILE
from pool_manager.metrics import PoolMetrics
from pool_manager.service import (
    UnknownRegion,
    create_app,
    model_policy_settings,
    open_provider,
    policy_settings,
    run_pool,
)
from spotgate.process import free_port
from spotgate.registry import AgentState, CreatedApiKey, Registry, aws_session
from spotgate.settings import (
    AgentSettings,
    LocalPoolSettings,
    Placement,
    PoolModel,
    PoolSettings,
    QueueSettings,
    SyntheticSettings,
    local_placements,
    settings_env,
)
from spotgate.tokens import SigningKey
from stack.emulator import AwsEmulator
from tests.gateway.conftest import Gateway, running_gateway
from tests.support.agents import expected_text, wait_for
from tests.support.clocks import ShiftedClock
from tests.support.metrics import metric_value, scrape
from tests.support.wsclient import connect, generate, receive, send

MODEL = "synthetic"


@pytest.fixture
async def gateway(aws: AwsEmulator) -> AsyncIterator[Gateway]:
    queue = QueueSettings(max_pending_per_model=64, deadline_seconds=60.0)
    key = SigningKey.generate()
    async with running_gateway(aws, key, models=(MODEL,), queue=queue) as running:
        yield running


@pytest.fixture
async def api_key(aws: AwsEmulator) -> CreatedApiKey:
    async with Registry.open(aws.settings()) as registry:
        return await registry.create_key("test")


@pytest.fixture
async def queue_url(aws: AwsEmulator) -> str:
    async with aws_session(aws.settings().aws).client("sqs", endpoint_url=aws.url) as sqs:
        return str((await sqs.create_queue(QueueName=f"events-{uuid.uuid4().hex}"))["QueueUrl"])


def pool_settings(
    aws: AwsEmulator, gateway: Gateway, logs: Path, **overrides: object
) -> PoolSettings:
    fields: dict[str, object] = {
        "shared": aws.settings(),
        "provider": "local",
        "models": (MODEL,),
        "spot_overprovision": 0,
        "on_demand_fallback": False,
        "loop_seconds": 0.5,
        "event_wait_seconds": 0,
        "port": 0,
        "local": LocalPoolSettings(
            engine="synthetic",
            jwks_url=f"{gateway.url}/.well-known/jwks.json",
            drain_grace_seconds=15.0,
            log_dir=str(logs),
            agent_env=settings_env(
                AgentSettings(
                    synthetic=SyntheticSettings(tokens_per_second=20),
                    heartbeat_seconds=1,
                    imds_poll_seconds=0.5,
                )
            ),
        ),
    }
    return PoolSettings(**{**fields, **overrides})  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def pool_running(settings: PoolSettings) -> AsyncIterator[None]:
    stop = asyncio.Event()
    task = asyncio.create_task(run_pool(settings, stop))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)


async def ready_agents(aws: AwsEmulator) -> list[str]:
    async with Registry.open(aws.settings()) as registry:
        return sorted(a.agent_id for a in await registry.list_ready(MODEL))


async def test_a_request_to_an_empty_pool_queues_an_agent_starts_and_it_completes(
    aws: AwsEmulator,
    gateway: Gateway,
    api_key: CreatedApiKey,
    tmp_path: Path,
    openai_client: Callable[..., openai.AsyncOpenAI],
) -> None:
    assert await ready_agents(aws) == []
    port = free_port()
    async with pool_running(pool_settings(aws, gateway, tmp_path, port=port)):
        client = openai_client(
            base_url=f"{gateway.url}/v1", api_key=api_key.api_key, max_retries=0, timeout=90
        )
        reply = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "wake up"}], max_tokens=6
        )
        assert reply.choices[0].message.content == expected_text("wake up", 6)
        assert await ready_agents(aws) == ["local-1"]
        exposition = await scrape(f"http://127.0.0.1:{port}/metrics")
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{port}/healthz") as response,
        ):
            assert response.status == 200
        assert (
            metric_value(
                exposition, "spotgate_pool_launches_total", lifecycle="spot", region="local"
            )
            == 1
        )
        assert metric_value(exposition, "spotgate_pool_target_agents", model="synthetic") == 1
    async with Registry.open(aws.settings()) as registry:
        record = await registry.get_agent("local-1")
    assert record is not None
    assert (record.state, record.lifecycle, record.zone) == (AgentState.GONE, "spot", "local-a")


LOAD_SECONDS = 4.0  # the agent's stand-in model load: it outlasts the test's steps below
COLD_START_SECONDS = 120.0  # the pool's assumed launch-to-ready, before it has timed one


async def test_a_scale_from_zero_longer_than_the_queue_deadline_waits_with_an_eta(
    aws: AwsEmulator, tmp_path: Path
) -> None:
    # The queue judges its deadline by a clock the test moves: the deadline passes once the
    # forecast is known, whatever the machine's pace, and the boot covers it. The clock moves
    # less than the agents' registry lifetime in all, or the view would drop them as expired.
    queue = QueueSettings(deadline_seconds=15.0)
    clock = ShiftedClock()
    async with running_gateway(aws, SigningKey.generate(), models=(MODEL,), queue=queue) as gw:
        dispatcher = gw.state.dispatcher
        dispatcher._clock = clock
        async with Registry.open(aws.settings()) as registry:
            api_key = await registry.create_key("cold")
        agent = AgentSettings(
            synthetic=SyntheticSettings(tokens_per_second=50, load_seconds=LOAD_SECONDS),
            heartbeat_seconds=1,
        )
        settings = pool_settings(aws, gw, tmp_path, cold_start_seconds=COLD_START_SECONDS)
        local = settings.local.model_copy(update={"agent_env": settings_env(agent)})
        async with (
            pool_running(settings.model_copy(update={"local": local})),
            connect(gw.ws_url, api_key.api_key) as ws,
            Registry.open(aws.settings()) as registry,
        ):
            asked_at = clock()
            await send(ws, generate("cold", MODEL, content="wake up", max_tokens=4))

            async def published() -> bool:
                return MODEL in await registry.read_forecasts([MODEL])

            async def heard() -> bool:
                return MODEL in dispatcher.forecasts

            await wait_for(published, within=120)
            clock.advance(FORECAST_READ_SECONDS)  # the gateway's next refresh reads it
            await wait_for(heard, within=120)
            clock.advance(queue.deadline_seconds)  # the stream's own deadline is past
            frames = []
            while not frames or frames[-1]["type"] not in ("done", "error"):
                frames.append(await asyncio.wait_for(receive(ws), 120))
    assert frames[-1]["type"] == "done", frames[-1]
    assert clock() - asked_at > queue.deadline_seconds  # it outlived its deadline
    queued = [f for f in frames if f["type"] == "queued"]
    assert queued[0]["position"] == 0
    etas = [float(f["eta_seconds"]) for f in queued if f.get("eta_seconds") is not None]
    assert etas, queued
    assert 0 < etas[0] <= COLD_START_SECONDS
    async with Registry.open(aws.settings()) as registry:
        record = await registry.get_agent("local-1")
    assert record is not None
    boot = record.boot
    assert 0 < boot.instance_start <= boot.agent_start < boot.engine_loaded
    assert boot.engine_loaded - boot.agent_start >= LOAD_SECONDS
    assert boot.engine_loaded <= boot.warmed_up <= boot.ready == record.ready_at


async def interruption(queue: str, aws: AwsEmulator, agent_id: str, in_seconds: float) -> None:
    """EC2's spot warning on the queue, with the deadline `in_seconds` away."""
    body = interruption_warning(agent_id, time.time() + in_seconds, "us-east-1")
    async with aws_session(aws.settings().aws).client("sqs", endpoint_url=aws.url) as sqs:
        await sqs.send_message(QueueUrl=queue, MessageBody=json.dumps(body))


async def test_an_interrupted_agent_is_replaced_and_every_stream_completes_exactly(
    aws: AwsEmulator, gateway: Gateway, api_key: CreatedApiKey, tmp_path: Path, queue_url: str
) -> None:
    settings = pool_settings(aws, gateway, tmp_path, min_agents=2, interruption_queue_url=queue_url)
    # 15 s of reply at 10 tokens/s: the notice lands mid-stream however slowly the fifty
    # streams were placed and the notice travels (queue, pool manager, IMDS) on a busy machine.
    max_tokens = 150
    agent = AgentSettings(
        synthetic=SyntheticSettings(tokens_per_second=10),
        heartbeat_seconds=1,
        imds_poll_seconds=0.5,
    )
    local = settings.local.model_copy(update={"agent_env": settings_env(agent)})
    async with pool_running(settings.model_copy(update={"local": local})):

        async def two_routable() -> bool:
            view = gateway.state.dispatcher.view
            return len([r for r in view.agents.get(MODEL, []) if r.state is AgentState.READY]) == 2

        await wait_for(two_routable, within=90)
        sockets = [connect(gateway.ws_url, api_key.api_key) for _ in range(5)]
        async with contextlib.AsyncExitStack() as stack:
            connections = [await stack.enter_async_context(s) for s in sockets]
            for n, ws in enumerate(connections):
                for m in range(10):
                    await send(
                        ws, generate(f"s{n}-{m}", MODEL, content=f"{n}/{m}", max_tokens=max_tokens)
                    )
            frames: dict[str, list[dict[str, object]]] = {}

            async def collect(ws: object) -> None:
                pending = 10
                while pending:
                    frame = await receive(ws)  # type: ignore[arg-type]
                    frames.setdefault(str(frame["id"]), []).append(frame)
                    pending -= frame["type"] in ("done", "error")

            readers = [asyncio.create_task(collect(ws)) for ws in connections]

            async def all_placed() -> bool:
                return sum(gateway.state.dispatcher.outstanding.values()) == 50

            # The notice goes as soon as every stream is on an agent: each has its whole
            # reply left to run when the victim hears it, however slowly they were placed.
            await wait_for(all_placed, within=30)
            victim = "local-1"
            # `start` names no agent: the gateway's own count says how many streams it holds.
            on_victim = gateway.state.dispatcher.outstanding[victim]
            await interruption(queue_url, aws, victim, in_seconds=8)
            await asyncio.wait_for(asyncio.gather(*readers), 120)

        for key, got in frames.items():
            n, m = key[1:].split("-")
            done = got[-1]
            assert done["type"] == "done", done
            text = "".join(str(f["text"]) for f in got if f["type"] == "delta")
            assert text == expected_text(f"{n}/{m}", max_tokens), key
            assert done["usage"]["completion_tokens"] == max_tokens  # type: ignore[index]
        moved = [
            k
            for k, got in frames.items()
            if len({f["agent"] for f in got if f["type"] == "start"}) == 2
        ]
        assert on_victim > 0
        assert len(moved) == on_victim  # every stream on the victim moved, none lost

        async def replaced() -> bool:
            return "local-3" in await ready_agents(aws) and victim not in await ready_agents(aws)

        await wait_for(replaced, within=60)


async def test_a_region_without_spot_is_filled_from_another_and_a_stream_moves_back_exactly(
    aws: AwsEmulator, gateway: Gateway, api_key: CreatedApiKey, tmp_path: Path, queue_url: str
) -> None:
    # Spot is cheaper in the gateway's region, us-east-1, but it has none: the west fills the
    # target. Once the east has spot again and the west agent is interrupted, the stream it
    # serves moves back east. A refused or interrupted zone is risky for a second only.
    east, west = "us-east-1", "us-west-2"
    placements = tuple(
        p.model_copy(update={"spot_price_per_hour": 0.3 if p.zone.startswith(east) else 0.5})
        for p in local_placements((east, west))
    )
    (tmp_path / NO_SPOT_ZONES_FILE).write_text("us-east-1a\nus-east-1b\n")
    settings = pool_settings(
        aws, gateway, tmp_path, min_agents=1, regions=(east, west), placements=placements,
        risky_placement_seconds=1.0, interruption_queue_url=queue_url,
    )  # fmt: skip
    agent = AgentSettings(
        synthetic=SyntheticSettings(tokens_per_second=10),
        heartbeat_seconds=1,
        imds_poll_seconds=0.5,
    )
    local = settings.local.model_copy(update={"agent_env": settings_env(agent)})
    max_tokens = 150  # 15 s: the notice lands mid-stream however slowly it travels
    async with (
        pool_running(settings.model_copy(update={"local": local})),
        Registry.open(aws.settings()) as registry,
    ):

        async def routable() -> bool:
            view = gateway.state.dispatcher.view
            return any(r.state is AgentState.READY for r in view.agents.get(MODEL, []))

        await wait_for(routable, within=90)
        (served,) = await registry.list_ready(MODEL)
        assert (served.region, served.zone) == (west, "us-west-2a")

        (tmp_path / NO_SPOT_ZONES_FILE).unlink()  # the east has spot again
        async with connect(gateway.ws_url, api_key.api_key) as ws:
            await send(ws, generate("s", MODEL, content="east west", max_tokens=max_tokens))
            frames = [await receive(ws)]
            while frames[-1]["type"] != "delta":
                frames.append(await receive(ws))
            await interruption(queue_url, aws, served.agent_id, in_seconds=8)
            while frames[-1]["type"] not in ("done", "error"):
                frames.append(await asyncio.wait_for(receive(ws), 120))
        # The only agent besides the one interrupted: its replacement, where the stream went.
        (replacement,) = await registry.list_ready(MODEL)

    assert frames[-1]["type"] == "done", frames[-1]
    text = "".join(str(f["text"]) for f in frames if f["type"] == "delta")
    assert text == expected_text("east west", max_tokens)
    assert len({f["agent"] for f in frames if f["type"] == "start"}) == 2  # it moved
    assert (replacement.region, replacement.zone) == (east, "us-east-1a")


async def test_a_zone_in_no_ec2_region_stops_the_start_naming_it() -> None:
    typo = Placement(
        instance_type="g6.xlarge", zone="us-est-1a", spot_price_per_hour=0.4,
        on_demand_price_per_hour=1.0,
    )  # fmt: skip
    line = r"no EC2 region is called us-est-1 \(zones us-est-1a\)"
    with pytest.raises(UnknownRegion, match=line):
        async with open_provider(PoolSettings(provider="ec2", placements=(typo,))):
            pass


async def test_healthz_fails_once_reconcile_passes_stall(aiohttp_client) -> None:  # type: ignore[no-untyped-def]
    metrics = PoolMetrics()
    client = await aiohttp_client(create_app(PoolSettings(loop_seconds=2.0), metrics))
    assert (await client.get("/healthz")).status == 503  # no pass yet
    metrics.last_pass_at = time.time()
    assert (await client.get("/healthz")).status == 200
    metrics.last_pass_at = time.time() - 7  # more than three loop intervals ago
    response = await client.get("/healthz")
    assert response.status == 503
    assert (await response.json())["status"] == "stalled"


@pytest.mark.parametrize(
    ("model", "warm_pool_size", "idle_seconds"),
    [
        (PoolModel(name="plain"), 2, 600.0),  # the pool's
        (PoolModel(name="own", warm_pool_size=0, scale_to_zero_idle_seconds=90), 0, 90.0),
        (PoolModel(name="warm", warm_pool_size=3), 3, 600.0),
    ],
)
def test_each_model_keeps_its_own_warm_pool_and_idle_time_else_the_pools(
    model: PoolModel, warm_pool_size: int, idle_seconds: float
) -> None:
    settings = PoolSettings(models=(model,), warm_pool_size=2, scale_to_zero_idle_seconds=600)
    policy = model_policy_settings(settings)[model.name]
    assert (policy.warm_pool_size, policy.scale_down_idle_seconds) == (
        warm_pool_size, idle_seconds,
    )  # fmt: skip
    assert policy_settings(settings).warm_pool_size == 2


def test_the_live_pool_holds_the_on_demand_margin_the_simulator_does() -> None:
    settings = PoolSettings(
        models=(PoolModel(name="m"),),
        on_demand_margin=True,
        on_demand_margin_spot_age_seconds=3600,
        on_demand_margin_shortage_seconds=60,
    )
    policy = model_policy_settings(settings)["m"]
    assert (
        policy.on_demand_margin,
        policy.on_demand_margin_spot_age_seconds,
        policy.on_demand_margin_shortage_seconds,
    ) == (True, 3600.0, 60.0)
    assert PoolSettings().on_demand_margin is False  # opt-in, as the warm pool
