"""The gateway end to end: real agents (synthetic engine), real clients, real moto server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import time
from collections.abc import AsyncGenerator, Callable
from typing import cast

import aiohttp
import openai
import pytest
import websockets

from gateway import auth as gateway_auth
from gateway.agent_link import AgentLink
from gateway.routes.websocket import allowed_origins, origin_allowed
from gateway.state import public_url
from gpu_agent.engine import EngineStep, GenerationRequest
from gpu_agent.synthetic_engine import SyntheticEngine
from spotgate.registry import AgentState, CreatedApiKey, Registry, aws_session
from spotgate.settings import (
    MAX_REQUEST_BYTES,
    AgentSettings,
    GatewaySettings,
    LimitStoreSettings,
    QueueSettings,
    SyntheticSettings,
)
from spotgate.tenancy import cache_salt, tenant_of
from spotgate.tokens import KeyRing, SigningKey, issue, verify
from spotgate.wsserver import receive_limit
from stack.emulator import AwsEmulator
from tests.gateway.conftest import (
    MODEL,
    AgentProcess,
    AgentProcesses,
    Gateway,
    GatewayAgentFactory,
    agents_of,
    completed_on,
    replicas,
    running_gateway,
    serving,
)
from tests.support.agents import (
    AgentFactory,
    HeldEngine,
    Imds,
    WedgingEngine,
    expected_text,
    spot_notice,
    synthetic,
    wait_for,
)
from tests.support.metrics import metric_value, scrape
from tests.support.wsclient import (
    Frame,
    connect,
    generate,
    receive,
    receive_to_end,
    run_streams,
    send,
    text_of,
)


async def test_api_key_buys_a_token_that_agents_can_verify(
    gateway: Gateway, api_key: CreatedApiKey
) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"{gateway.url}/v1/token", headers={"Authorization": f"Bearer {api_key.api_key}"}
        ) as response:
            assert response.status == 200
            assert response.headers["Cache-Control"] == "no-store"
            body = await response.json()
        async with http.get(f"{gateway.url}/.well-known/jwks.json") as response:
            published = KeyRing.from_jwks(await response.json())
        async with http.post(
            f"{gateway.url}/v1/token", headers={"Authorization": "Bearer sg-000000000000-nope"}
        ) as response:
            assert response.status == 401
            assert (await response.json())["error"]["code"] == "unauthorized"

    claims = verify(published, body["token"], issuer=gateway.url, now=time.time())
    assert claims.sub == api_key.record.key_id
    assert body["ws_url"] == gateway.ws_url
    assert body["expires_at"] == claims.exp


async def test_the_gateway_publishes_its_public_keys_for_agents_in_ssm(
    aws: AwsEmulator, gateway_key: SigningKey
) -> None:
    async with (
        running_gateway(aws, gateway_key, jwks_parameter="/pool/gateway-jwks") as gw,
        aiohttp.ClientSession() as http,
        http.get(f"{gw.url}/.well-known/jwks.json") as response,
    ):
        served = await response.json()
    aws_settings = aws.settings().aws
    session = aws_session(aws_settings)
    async with session.client("ssm", endpoint_url=aws_settings.endpoint_url) as ssm:
        parameter = await ssm.get_parameter(Name="/pool/gateway-jwks")
    assert json.loads(parameter["Parameter"]["Value"]) == served
    assert served["keys"][0]["kid"] == gateway_key.kid


async def test_openai_sdk_through_the_gateway(
    gateway: Gateway,
    gateway_agent: GatewayAgentFactory,
    api_key: CreatedApiKey,
    aws: AwsEmulator,
    openai_client: Callable[..., openai.AsyncOpenAI],
) -> None:
    await gateway_agent()
    client = openai_client(base_url=f"{gateway.url}/v1", api_key=api_key.api_key, max_retries=0)
    messages = [{"role": "user", "content": "hello"}]

    whole = await client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=12,  # type: ignore[arg-type]
    )
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=12,
        stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    text = await client.completions.create(model=MODEL, prompt="hello", max_tokens=5)
    listed = await client.models.list()

    assert whole.choices[0].message.content == expected_text("hello", 12)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == (
        expected_text("hello", 12)
    )
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 12
    assert len((text.choices[0].text or "").split()) == 5
    assert {model.id for model in listed.data} == {MODEL, "scalable"}
    async with Registry.open(aws.settings()) as registry:
        narrow = await registry.create_key("narrow", models=[MODEL, "elsewhere"])
    narrow_client = openai_client(
        base_url=f"{gateway.url}/v1", api_key=narrow.api_key, max_retries=0
    )
    assert [model.id for model in (await narrow_client.models.list()).data] == [MODEL]
    async with aiohttp.ClientSession() as http, http.get(f"{gateway.url}/v1/models") as r:
        assert r.status == 401  # as OpenAI's: no key, no list
    with pytest.raises(openai.AuthenticationError):
        await openai_client(
            base_url=f"{gateway.url}/v1",
            api_key="sg-000000000000-wrongwrongwrongwrong",
            max_retries=0,
        ).chat.completions.create(model=MODEL, messages=messages)  # type: ignore[arg-type]


async def test_the_shapes_current_sdks_send_are_read_and_the_unsupported_named(
    gateway: Gateway,
    gateway_agent: GatewayAgentFactory,
    api_key: CreatedApiKey,
    openai_client: Callable[..., openai.AsyncOpenAI],
) -> None:
    await gateway_agent()
    client = openai_client(base_url=f"{gateway.url}/v1", api_key=api_key.api_key, max_retries=0)
    parts = await client.chat.completions.create(
        model=MODEL,
        messages=[
            {
                "role": "user",
                "content": [{"type": "text", "text": "hel"}, {"type": "text", "text": "lo"}],
            }
        ],
        max_completion_tokens=12,
    )
    assert parts.choices[0].message.content == expected_text("hello", 12)
    everyday = await client.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "developer", "content": "Answer briefly."},
            {"role": "user", "name": "ada", "content": [{"type": "text", "text": "hi"}]},
        ],
        max_completion_tokens=5,
        seed=-1,
        user="u" * 1000,
        metadata={"team": "search"},
        store=False,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in everyday]
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 5
    with pytest.raises(openai.BadRequestError) as refused:
        await client.chat.completions.create(
            model=MODEL,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,"}}
                    ],
                }
            ],
        )
    assert "'image_url' parts are not supported" in str(refused.value)
    with pytest.raises(openai.BadRequestError) as two:
        await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], n=2
        )
    assert "n:" in str(two.value)
    assert two.value.param == "n"


async def test_websocket_through_the_gateway_with_key_or_token(
    gateway: Gateway, gateway_agent: GatewayAgentFactory, api_key: CreatedApiKey
) -> None:
    agent = await gateway_agent()
    async with connect(gateway.ws_url, api_key.api_key) as ws:
        frames = (await run_streams(ws, generate("a", MODEL, content="hi", max_tokens=20)))["a"]
    handle = frames[0]["agent"]
    assert frames[0] == {"type": "start", "id": "a", "engine": "synthetic", "agent": handle}
    # A handle of this stream's own, never the agent's id (its clients learn no pool's names).
    assert handle != agent.runtime.identity.agent_id  # type: ignore[union-attr]
    assert len(handle) == 16
    assert text_of(frames) == expected_text("hi", 20)
    assert frames[-1]["usage"]["completion_tokens"] == 20

    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{gateway.url}/v1/token", headers={"Authorization": f"Bearer {api_key.api_key}"}
        ) as response,
    ):
        token = (await response.json())["token"]
    async with connect(gateway.ws_url, None) as ws:  # a browser: first-frame auth
        await send(ws, {"type": "auth", "token": token})
        frames = (await run_streams(ws, generate("b", MODEL, content="hi", max_tokens=20)))["b"]
    assert text_of(frames) == expected_text("hi", 20)


async def test_draining_agents_get_nothing_and_sessions_stick(
    gateway: Gateway,
    gateway_agent: GatewayAgentFactory,
    api_key: CreatedApiKey,
    aws: AwsEmulator,
) -> None:
    first, second = await gateway_agent(), await gateway_agent()
    async with connect(gateway.ws_url, api_key.api_key) as ws:
        for n in range(5):
            await run_streams(ws, generate(f"s{n}", MODEL, max_tokens=2, session="chat-7"))
        served = await completed_on((first, second), (0, 0), 5)
        assert sorted(served) == [0, 5]  # all on one agent
        drained = (first, second)[served.index(5)].runtime.identity.agent_id  # type: ignore[union-attr]
        async with Registry.open(aws.settings()) as registry:
            await registry.set_draining(drained, deadline=time.time() + 120)

        async def out_of_view() -> bool:
            record = gateway.state.dispatcher.view.record(drained)
            return record is not None and record.state is AgentState.DRAINING

        await wait_for(out_of_view)
        for n in range(5):
            await run_streams(ws, generate(f"t{n}", MODEL, max_tokens=2, session="chat-7"))
    assert await completed_on((first, second), served, 5) == [
        0 if count else 5 for count in served
    ]  # none more on the draining agent


async def test_a_key_disabled_while_its_socket_is_open_gets_no_more_streams_there(
    gateway: Gateway,
    gateway_agent: GatewayAgentFactory,
    api_key: CreatedApiKey,
    aws: AwsEmulator,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await gateway_agent()
    async with connect(gateway.ws_url, api_key.api_key) as ws:
        served = await run_streams(ws, generate("before", MODEL, max_tokens=2))
        async with Registry.open(aws.settings()) as registry:
            await registry.disable_key(api_key.record.key_id)
        monkeypatch.setattr(gateway_auth, "KEY_CACHE_SECONDS", 0.0)  # the cache time is over
        refused = await run_streams(ws, generate("after", MODEL, max_tokens=2))
    assert served["before"][-1]["type"] == "done"
    [error] = refused["after"]
    assert (error["type"], error["code"]) == ("error", "unauthorized")
    assert error["message"] == "this API key was disabled or deleted"


async def test_kill_9_of_the_serving_agent_loses_nothing(
    gateway: Gateway, agent_processes: AgentProcesses, api_key: CreatedApiKey
) -> None:
    agents: list[AgentProcess] = await agent_processes(2, 40.0)

    async def both_routable() -> bool:
        view = gateway.state.dispatcher.view
        return all(view.record(a.agent_id) is not None for a in agents)

    await wait_for(both_routable, within=60)
    async with connect(gateway.ws_url, api_key.api_key) as ws:
        # 5 s of reply: the kill lands mid-stream even if this process is held up seconds.
        await send(ws, generate("s", MODEL, content="keep going", max_tokens=200))
        start = await receive(ws)
        frames = [start]
        while sum(f.get("n", 0) for f in frames) < 10:
            frames.append(await receive(ws))
        [victim_id] = serving(gateway)
        victim = next(a for a in agents if a.agent_id == victim_id)
        victim.process.send_signal(signal.SIGKILL)
        await receive_to_end(ws, frames)

    done = frames[-1]
    assert done["type"] == "done", done
    assert text_of(frames) == expected_text("keep going", 200)
    assert sum(f["n"] for f in frames if f["type"] == "delta") == 200
    assert done["usage"]["completion_tokens"] == 200
    starts = [f["agent"] for f in frames if f["type"] == "start"]
    assert starts[0] == start["agent"]
    assert len(set(starts)) == 2  # moved, and the client was told
    assert not any(a.agent_id in str(frames) for a in agents)  # by handles, never agent ids


def assert_moved_once_exactly(frames: list[Frame], content: str, tokens: int) -> None:
    """The reply to `content` came whole and exact, all its tokens counted, from two agents."""
    assert frames[-1]["type"] == "done", frames[-1]
    assert text_of(frames) == expected_text(content, tokens)
    assert frames[-1]["usage"]["completion_tokens"] == tokens
    assert len({f["agent"] for f in frames if f["type"] == "start"}) == 2  # moved once


async def test_a_stream_on_a_wedged_engine_moves_once_the_stall_limit_passes(
    aws: AwsEmulator,
    gateway_key: SigningKey,
    limit_store: LimitStoreSettings,
    start_agent: AgentFactory,
    api_key: CreatedApiKey,
) -> None:
    stall = QueueSettings(max_pending_per_model=4, deadline_seconds=5.0, stall_seconds=1.0)
    async with running_gateway(aws, gateway_key, limit_store=limit_store, queue=stall) as gw:
        agents = agents_of(gw, start_agent)
        engine = WedgingEngine(MODEL, after_tokens=20)
        wedged = await agents(engine=engine)
        async with connect(gw.ws_url, api_key.api_key) as ws:
            await send(ws, generate("s", MODEL, content="hang on", max_tokens=60))
            frames = [await receive(ws)]
            assert serving(gw) == {wedged.runtime.identity.agent_id}  # type: ignore[union-attr]
            await engine.wedged.wait()
            await agents(imds_url="http://127.0.0.1:9")  # somewhere to go
            await receive_to_end(ws, frames)
        streams_left = dict(wedged.runtime.streams)

    assert_moved_once_exactly(frames, "hang on", 60)
    assert streams_left == {}  # the wedged agent was told to stop its stream


async def test_spot_notice_moves_the_stream_exactly(
    gateway: Gateway, gateway_agent: GatewayAgentFactory, api_key: CreatedApiKey, imds: Imds
) -> None:
    # 15 s of reply: still running when the notice comes, however long the second agent takes
    # to start on a busy machine (at 120 tokens it could finish first, and never move).
    stream_tokens = 600
    slow = await gateway_agent(tokens_per_second=40.0)
    async with connect(gateway.ws_url, api_key.api_key) as ws:
        await send(ws, generate("s", MODEL, content="drain me", max_tokens=stream_tokens))
        frames = [await receive(ws)]
        assert serving(gateway) == {slow.runtime.identity.agent_id}  # type: ignore[union-attr]
        # Somewhere to move to (fast, to finish the rest soon), outside the emulated instance
        # that gets the notice.
        await gateway_agent(tokens_per_second=4000.0, imds_url="http://127.0.0.1:9")
        # 16 s to the deadline, 15 s margin: the long stream is handed back at once.
        await spot_notice(imds, in_seconds=16)
        await receive_to_end(ws, frames)

    assert_moved_once_exactly(frames, "drain me", stream_tokens)


def assert_moved_early_once(gateway: Gateway) -> None:
    """The stream moved once, to a continuation open before the break, with no divergence."""
    metrics = gateway.state.metrics
    assert metrics.early_moves._value.get() == 1
    assert metrics.resumes._value.get() == 1
    assert metrics.early_move_divergences._value.get() == 0


async def test_a_spot_notice_moves_the_stream_before_its_agent_breaks_it(
    gateway: Gateway, gateway_agent: GatewayAgentFactory, api_key: CreatedApiKey, imds: Imds
) -> None:
    # 45 s to the deadline, 15 s margin, 60 s of tokens: the agent says `moving` at once and
    # streams on; the other agent catches up and the stream switches there, the draining
    # agent's stream cancelled long before the margin (30 s on), however slow the machine.
    stream_tokens = 2400
    draining = await gateway_agent(tokens_per_second=40.0)
    async with connect(gateway.ws_url, api_key.api_key) as ws:
        await send(ws, generate("s", MODEL, content="move me early", max_tokens=stream_tokens))
        frames = [await receive(ws)]
        next_engine = synthetic(4000.0, model=MODEL, ttft_seconds=0.01)
        await gateway_agent(engine=next_engine, imds_url="http://127.0.0.1:9")
        await spot_notice(imds, in_seconds=45)
        await receive_to_end(ws, frames)

    assert_moved_once_exactly(frames, "move me early", stream_tokens)
    assert_moved_early_once(gateway)
    streams = draining.runtime.metrics.streams
    assert streams.labels(outcome="cancelled")._value.get() == 1
    assert streams.labels(outcome="interrupted")._value.get() == 0


async def test_a_next_agent_still_in_its_prefill_at_the_break_takes_the_stream_over(
    gateway: Gateway, gateway_agent: GatewayAgentFactory, api_key: CreatedApiKey, imds: Imds
) -> None:
    # 20 s to the deadline, 15 s margin: the stream (30 s of tokens) breaks 5 s after
    # `moving`, while its continuation on the other agent is held in its prefill until then.
    stream_tokens = 1200
    draining = await gateway_agent(tokens_per_second=40.0)
    async with connect(gateway.ws_url, api_key.api_key) as ws:
        await send(ws, generate("s", MODEL, content="move me early", max_tokens=stream_tokens))
        frames = [await receive(ws)]
        next_engine = HeldEngine(MODEL, tokens_per_second=4000.0)
        await gateway_agent(engine=next_engine, imds_url="http://127.0.0.1:9")
        next_engine.hold()
        await spot_notice(imds, in_seconds=20)
        await next_engine.held.wait()  # the continuation is open, prefilling
        streams = draining.runtime.metrics.streams

        async def broken() -> bool:
            return bool(streams.labels(outcome="interrupted")._value.get())

        await wait_for(broken, within=60)
        next_engine.released.set()
        await receive_to_end(ws, frames)

    assert_moved_once_exactly(frames, "move me early", stream_tokens)
    assert_moved_early_once(gateway)
    assert streams.labels(outcome="interrupted")._value.get() == 1
    assert streams.labels(outcome="cancelled")._value.get() == 0


class SlowOnceEngine(SyntheticEngine):
    """A fast synthetic engine whose next reply, once `slow_down` is called, comes at `slow`'s
    pace: a next agent whose first continuation is slow, and the ones after it fast."""

    def __init__(self, slow: SyntheticEngine) -> None:
        pace = SyntheticSettings(ttft_seconds=0.01, tokens_per_second=4000.0)
        super().__init__(
            AgentSettings(engine="synthetic", served_model_name=slow.model, synthetic=pace)
        )
        self.slow = slow
        self.slow_next = False  # off while the agent warms up

    def slow_down(self) -> None:
        """The next reply comes at the slow pace (the ones after it at the fast one)."""
        self.slow_next = True

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[EngineStep, None]:
        """The synthetic reply, at the slow pace if it is the one slowed down."""
        steps = self.slow.generate(request) if self.slow_next else super().generate(request)
        self.slow_next = False
        async for step in steps:
            yield step


async def test_a_next_agent_slow_to_its_first_token_is_warmed_again_and_switched_to_early(
    gateway: Gateway, gateway_agent: GatewayAgentFactory, api_key: CreatedApiKey, imds: Imds
) -> None:
    stream_tokens = 600
    draining = await gateway_agent(tokens_per_second=40.0)
    async with connect(gateway.ws_url, api_key.api_key) as ws:
        await send(ws, generate("s", MODEL, content="outrun me", max_tokens=stream_tokens))
        frames = [await receive(ws)]
        # Its only successor comes to its first token 0.5 s after the continuation opened, 20
        # of the client's tokens behind it; opened afresh from the client's tokens it answers
        # at once, and the stream switches there long before the break (5 s on).
        successor = SlowOnceEngine(synthetic(10.0, model=MODEL, ttft_seconds=0.5))
        await gateway_agent(engine=successor, imds_url="http://127.0.0.1:9")
        successor.slow_down()
        await spot_notice(imds, in_seconds=20)
        await receive_to_end(ws, frames)

    assert frames[-1]["type"] == "done", frames[-1]
    assert text_of(frames) == expected_text("outrun me", stream_tokens)
    metrics = gateway.state.metrics
    assert metrics.early_moves._value.get() == 1
    assert metrics.resumes._value.get() == 1
    streams = draining.runtime.metrics.streams
    assert streams.labels(outcome="interrupted")._value.get() == 0  # not left to the break


async def in_view(gateway: Gateway, agent_id: str) -> None:
    """Wait until the gateway routes to the agent."""

    async def seen() -> bool:
        record = gateway.state.dispatcher.view.record(agent_id)
        return record is not None and record.state is AgentState.READY

    await wait_for(seen)


async def out_of_service(gateway: Gateway, agent_id: str) -> None:
    """Wait until the gateway has no stream open on the agent."""

    async def gone() -> bool:
        return agent_id not in serving(gateway)

    await wait_for(gone)


async def streaming_on(gateway: Gateway, agent_id: str) -> None:
    """Wait until the gateway has a stream open on the agent."""

    async def open_there() -> bool:
        return agent_id in serving(gateway)

    await wait_for(open_there)


async def test_a_next_agent_killed_while_it_catches_up_leaves_the_stream_to_move_at_the_break(
    gateway: Gateway,
    gateway_agent: GatewayAgentFactory,
    agent_processes: AgentProcesses,
    api_key: CreatedApiKey,
    imds: Imds,
) -> None:
    stream_tokens = 1200  # 30 s at 40 tokens/s: still streaming at the break
    draining = await gateway_agent(tokens_per_second=40.0)
    async with connect(gateway.ws_url, api_key.api_key) as ws:
        await send(ws, generate("s", MODEL, content="lose the next", max_tokens=stream_tokens))
        frames = [await receive(ws)]
        # The only agent to move to, in a 3 s prefill: killed while it catches up.
        (following,) = await agent_processes(1, 400.0, ttft_seconds=3.0)
        await in_view(gateway, following.agent_id)
        await spot_notice(imds, in_seconds=20)  # `moving` at once: 20 s left, 15 s margin
        await streaming_on(gateway, following.agent_id)
        following.process.send_signal(signal.SIGKILL)
        following.process.wait()
        # Somewhere to go at the break (and no notice of its own).
        await gateway_agent(tokens_per_second=4000.0, imds_url="http://127.0.0.1:9")
        await receive_to_end(ws, frames)

    assert_moved_once_exactly(frames, "lose the next", stream_tokens)  # not on the killed one
    metrics = gateway.state.metrics
    assert metrics.early_moves._value.get() == 0  # its move was given up: it moved at the break
    assert metrics.resumes._value.get() == 1
    streams = draining.runtime.metrics.streams
    assert streams.labels(outcome="interrupted")._value.get() == 1  # it streamed to the end


async def test_a_draining_agent_killed_while_its_next_agent_catches_up_is_taken_over_there(
    gateway: Gateway,
    gateway_agent: GatewayAgentFactory,
    agent_processes: AgentProcesses,
    api_key: CreatedApiKey,
    imds: Imds,
) -> None:
    stream_tokens = 1200
    (draining,) = await agent_processes(1, 40.0, imds_url=imds.url)
    await in_view(gateway, draining.agent_id)
    async with connect(gateway.ws_url, api_key.api_key) as ws:
        await send(ws, generate("s", MODEL, content="lose the old", max_tokens=stream_tokens))
        frames = [await receive(ws)]
        next_engine = HeldEngine(MODEL, tokens_per_second=4000.0)
        await gateway_agent(engine=next_engine, imds_url="http://127.0.0.1:9")
        next_engine.hold()  # its continuation stays in its prefill until the kill is seen
        await spot_notice(imds, in_seconds=25)
        await next_engine.held.wait()  # the continuation is open there
        draining.process.send_signal(signal.SIGKILL)  # long before its deadline
        await out_of_service(gateway, draining.agent_id)
        next_engine.released.set()
        await receive_to_end(ws, frames)

    assert_moved_once_exactly(frames, "lose the old", stream_tokens)
    assert_moved_early_once(gateway)  # the continuation already open took over


async def test_scale_from_zero_queues_then_serves(
    aws: AwsEmulator, gateway_key: SigningKey, start_agent: AgentFactory, api_key: CreatedApiKey
) -> None:
    queue = QueueSettings(deadline_seconds=60.0)  # however slowly the agent below comes up
    async with (
        running_gateway(aws, gateway_key, queue=queue) as gateway,
        connect(gateway.ws_url, api_key.api_key) as ws,
    ):
        gateway_agent = agents_of(gateway, start_agent)
        await send(ws, generate("q", "scalable", content="wait", max_tokens=5))
        assert await receive(ws) == {"type": "queued", "id": "q", "position": 0}

        async def demand_published() -> bool:
            async with Registry.open(gateway.state.settings.shared) as registry:
                demand = await registry.read_demand()
            return demand.get("scalable") is not None and demand["scalable"].pending == 1

        await wait_for(demand_published)
        await gateway_agent(model="scalable")
        frames = [await receive(ws)]
        await receive_to_end(ws, frames)
    assert frames[0]["type"] == "start"
    assert frames[-1]["type"] == "done"
    assert frames[-1]["timings"]["queue_ms"] > 0


async def test_no_capacity_unknown_models_and_full_queues_are_clear_errors(
    gateway: Gateway, api_key: CreatedApiKey
) -> None:
    async with connect(gateway.ws_url, api_key.api_key) as ws:
        unknown = (await run_streams(ws, generate("u", "no-such-model")))["u"][-1]
        assert (unknown["code"], unknown["param"]) == ("model_not_found", "model")
        frames = (await run_streams(ws, generate("n", "scalable")))["n"]
        assert frames[0]["type"] == "queued"
        assert frames[-1]["code"] == "no_capacity"  # nothing came within the 5 s deadline
        assert frames[-1]["retry_after"] > 0
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{gateway.url}/v1/chat/completions",
            headers={"Authorization": f"Bearer {api_key.api_key}"},
            json={"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]},
        ) as response,
    ):
        assert response.status == 404  # OpenAI's answer, with its code and the field at fault
        error = (await response.json())["error"]
        assert (error["code"], error["param"], error["type"]) == (
            "model_not_found",
            "model",
            "invalid_request_error",
        )


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/responses"])
async def test_an_sse_client_that_hangs_up_mid_stream_stops_its_agent_quietly(
    gateway: Gateway,
    gateway_agent: GatewayAgentFactory,
    api_key: CreatedApiKey,
    caplog: pytest.LogCaptureFixture,
    path: str,
) -> None:
    """A client gone is no server error: its agent's stream is cancelled, nothing is logged."""
    agent = await gateway_agent(tokens_per_second=200.0)
    fields = {
        "/v1/chat/completions": {
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 5000,
        },
        "/v1/completions": {"prompt": "x", "max_tokens": 5000},
        "/v1/responses": {"input": "x", "max_output_tokens": 5000},
    }[path]
    async with aiohttp.ClientSession() as http:
        response = await http.post(
            f"{gateway.url}{path}",
            headers={"Authorization": f"Bearer {api_key.api_key}"},
            json={"model": MODEL, "stream": True, **fields},
        )
        assert response.status == 200
        await response.content.readuntil(b"\n\n")  # the first event
        serving = [handle.task for handle in agent.runtime.streams.values()]
        response.close()  # the connection is dropped mid-stream

        await asyncio.wait_for(asyncio.gather(*serving, return_exceptions=True), 10)

    assert agent.runtime.metrics.streams.labels(outcome="cancelled")._value.get() == 1
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


async def test_rate_limits_answer_429_with_retry_after(
    gateway: Gateway, gateway_agent: GatewayAgentFactory, aws: AwsEmulator
) -> None:
    await gateway_agent()
    async with Registry.open(aws.settings()) as registry:
        limited = await registry.create_key("limited", rpm=1)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    headers = {"Authorization": f"Bearer {limited.api_key}"}
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"{gateway.url}/v1/chat/completions", json=body, headers=headers
        ) as response:
            assert response.status == 200
        async with http.post(
            f"{gateway.url}/v1/chat/completions", json=body, headers=headers
        ) as response:
            assert response.status == 429
            assert int(response.headers["Retry-After"]) >= 1
            assert (await response.json())["error"]["code"] == "rate_limited"
    async with connect(gateway.ws_url, limited.api_key) as ws:
        error = (await run_streams(ws, generate("r", MODEL)))["r"][-1]
    assert error["code"] == "rate_limited"
    assert error["retry_after"] > 0


async def test_registry_outage_keeps_streams_flowing_on_the_cached_view(
    gateway: Gateway,
    gateway_agent: GatewayAgentFactory,
    api_key: CreatedApiKey,
    aws: AwsEmulator,
) -> None:
    await gateway_agent()
    async with connect(gateway.ws_url, api_key.api_key) as ws:
        assert (await run_streams(ws, generate("a", MODEL, max_tokens=3)))["a"][-1][
            "type"
        ] == "done"
        aws.stop()
        try:

            async def noticed() -> bool:
                return gateway.state.dispatcher.view.last_error is not None

            await wait_for(noticed)
            frames = (await run_streams(ws, generate("b", MODEL, content="hi", max_tokens=8)))["b"]
            async with aiohttp.ClientSession() as http, http.get(f"{gateway.ops_url}/readyz") as r:
                ready = await r.json()
        finally:
            aws.start()
    assert text_of(frames) == expected_text("hi", 8)
    assert ready["registry"] == "unreachable"
    # Which failure, not its message: that names the endpoint (in AWS: accounts and hosts).
    assert ready["registry_error"] == "EndpointConnectionError"
    await asyncio.sleep(0)


async def test_bad_input_gets_its_documented_error_and_the_socket_lives_on(
    gateway: Gateway, gateway_agent: GatewayAgentFactory, aws: AwsEmulator
) -> None:
    await gateway_agent()
    async with Registry.open(aws.settings()) as registry:
        narrow = await registry.create_key("narrow", models=["other"], max_tokens=8)
    now = time.time()
    forged = issue(
        KeyRing([SigningKey.generate()]), subject=narrow.record.key_id, issuer=gateway.url, now=now
    ).token
    expired = issue(
        KeyRing([gateway.signing_key]),
        subject=narrow.record.key_id,
        issuer=gateway.url,
        now=now - 3600,
        ttl_seconds=60,
    ).token
    async with aiohttp.ClientSession() as http:
        for credential in (forged, expired, "sg-short", "x" * 8000):
            async with http.get(
                gateway.ws_url.replace("ws://", "http://"),
                headers={
                    "Authorization": f"Bearer {credential}",
                    "Upgrade": "websocket",
                    "Connection": "Upgrade",
                    "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
                    "Sec-WebSocket-Version": "13",
                },
            ) as response:
                assert response.status == 401
                assert (await response.json())["error"]["code"] == "unauthorized"

    async with connect(gateway.ws_url, narrow.api_key) as ws:
        await ws.send("{oops")
        assert (await receive(ws))["code"] == "invalid_request"
        await send(ws, {"type": "subscribe", "id": "z"})
        assert (await receive(ws))["code"] == "invalid_request"
        forbidden = (await run_streams(ws, generate("f", MODEL)))["f"][-1]
        assert forbidden["code"] == "forbidden"
        too_long = (await run_streams(ws, generate("m", "other", max_tokens=9)))["m"][-1]
        assert too_long["code"] == "invalid_request"
        resume = generate(  # a resume that does not add up
            "r",
            "other",
            max_tokens=4,
            resume={"token_ids": [1], "text": "x", "completion_tokens": 2},
        )
        assert (await run_streams(ws, resume))["r"][-1]["code"] == "invalid_request"
        await send(ws, {"type": "ping"})
        assert await receive(ws) == {"type": "pong"}
        # Over the frame cap: an error, and the socket lives on; far over it, it closes (1009).
        await ws.send('{"type":"auth","token":"' + "a" * 70_000 + '"}')
        assert "65536-byte limit" in (await receive(ws))["message"]
        await send(ws, {"type": "ping"})
        assert await receive(ws) == {"type": "pong"}
        await ws.send('{"type":"auth","token":"' + "a" * receive_limit(65536) + '"}')
        with pytest.raises(Exception) as closed:
            await receive(ws)
        assert "1009" in str(closed.value)  # the frame cap closed the socket


async def test_many_clients_share_one_agent_link(
    gateway: Gateway, gateway_agent: GatewayAgentFactory, api_key: CreatedApiKey
) -> None:
    await gateway_agent()
    limit = gateway.state.settings.limits.max_streams_per_connection

    async def one_client(n: int) -> str:
        async with connect(gateway.ws_url, api_key.api_key) as ws:
            frames = await run_streams(ws, generate(f"c{n}", MODEL, content=str(n), max_tokens=40))
        return text_of(frames[f"c{n}"])

    texts = await asyncio.gather(*(one_client(n) for n in range(3 * limit)))

    assert texts == [expected_text(str(n), 40) for n in range(3 * limit)]
    assert len(gateway.state.links) == 1


async def test_metrics_count_what_happened(
    gateway: Gateway, gateway_agent: GatewayAgentFactory, api_key: CreatedApiKey
) -> None:
    await gateway_agent()
    async with connect(gateway.ws_url, api_key.api_key) as ws:
        await run_streams(
            ws, generate("a", MODEL, max_tokens=7), generate("b", MODEL, max_tokens=5)
        )
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{gateway.url}/v1/token", headers={"Authorization": "Bearer no"}),
    ):
        pass
    text = await scrape(f"{gateway.ops_url}/metrics")

    def value(sample: str, **labels: str) -> float:
        return metric_value(text, sample, **labels)

    assert value("spotgate_gateway_relayed_tokens_total") == 12
    assert value("spotgate_gateway_rejections_total", reason="unauthorized") == 1
    assert value("spotgate_gateway_agents", state="ready") == 1
    assert value("spotgate_gateway_ttft_seconds_count") == 2
    # The agent's 10 ms to its first token is its own, not the gateway's.
    assert value("spotgate_gateway_added_ttft_seconds_count") == 2
    added = value("spotgate_gateway_added_ttft_seconds_sum")
    assert 0 < added < value("spotgate_gateway_ttft_seconds_sum") - 2 * 0.01
    assert value("spotgate_gateway_active_streams") == 0
    assert value("spotgate_gateway_registry_up") == 1


async def test_shutdown_lets_streams_in_flight_finish_then_says_going_away(
    gateway: Gateway, gateway_agent: GatewayAgentFactory, api_key: CreatedApiKey
) -> None:
    await gateway_agent(tokens_per_second=40.0)
    async with connect(gateway.ws_url, api_key.api_key) as ws:
        await send(ws, generate("s", MODEL, content="finish me", max_tokens=40))
        frames = [await receive(ws), await receive(ws)]
        shutdown = asyncio.create_task(gateway.app.shutdown())  # what SIGTERM starts
        await asyncio.sleep(0)  # its first step refuses new streams at once
        assert gateway.state.shutting_down
        await send(ws, generate("late", MODEL))
        close_code = None
        try:
            while True:
                frames.append(await receive(ws))
        except websockets.ConnectionClosed as err:
            close_code = err.rcvd.code if err.rcvd else None
        await shutdown
    late = [f for f in frames if f.get("id") == "late"]

    assert text_of([f for f in frames if f.get("id") == "s"]) == expected_text("finish me", 40)
    assert [f["code"] for f in late] == ["going_away"]  # send it through another gateway
    assert close_code == 1001  # GOING_AWAY, after the stream in flight finished


async def test_streams_still_open_when_the_grace_ends_hear_going_away_and_their_agents_stop(
    aws: AwsEmulator,
    gateway_key: SigningKey,
    start_agent: AgentFactory,
    api_key: CreatedApiKey,
    limit_store: LimitStoreSettings,
    openai_client: Callable[..., openai.AsyncOpenAI],
) -> None:
    """SSE and websocket streams longer than the grace: an error each, then the exit."""
    async with running_gateway(
        aws, gateway_key, limit_store=limit_store, shutdown_grace_seconds=0.5
    ) as gw:
        agent = await agents_of(gw, start_agent)(tokens_per_second=20.0)
        client = openai_client(base_url=f"{gw.url}/v1", api_key=api_key.api_key, max_retries=0)
        async with connect(gw.ws_url, api_key.api_key) as ws:
            await send(ws, generate("w", MODEL, max_tokens=1_000, want_ids=True))
            frames = [await receive(ws), await receive(ws)]  # started, with a token
            stream = await client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "go on"}],
                max_tokens=1_000,
                stream=True,
            )
            chunks = aiter(stream)
            await anext(chunks)  # the response has begun: its status is 200
            shutdown = asyncio.create_task(gw.app.shutdown())  # what SIGTERM starts
            with pytest.raises(openai.APIError) as raised:
                async for _chunk in chunks:
                    pass
            await receive_to_end(ws, frames)
            await shutdown

            async def agent_stopped() -> bool:
                return not agent.runtime.streams  # type: ignore[union-attr]

            # Told to stop, not left to finish: its 1,000 tokens would take 50 s at this pace
            # (the margin is for a busy machine: `make test` runs vLLM beside this).
            await wait_for(agent_stopped)
    assert raised.value.code == "going_away"
    assert "retry it through another gateway" in raised.value.message
    assert frames[-1]["code"] == "going_away"
    assert "resume it through another gateway" in frames[-1]["message"]


@pytest.mark.parametrize(
    ("origin", "host", "allowed"),
    [
        ("http://127.0.0.1:8080", "127.0.0.1:8080", True),  # the page the gateway served
        ("https://gw.example", "10.0.0.5:8080", True),  # its public URL, behind a proxy
        ("https://chat.example", "gw.example", True),  # configured
        ("https://evil.example", "gw.example", False),
        ("null", "gw.example", False),  # sandboxed frames, file:// pages
        ("http://gw.example.evil.example", "gw.example", False),
        ("ftp://gw.example", "gw.example", False),
        ("https://gw.example", None, True),
        ("https://other.example", None, False),
        # DNS rebinding: a foreign name pointed at the gateway is its own page's origin.
        ("http://rebound.evil.example:8080", "rebound.evil.example:8080", False),
    ],
)
def test_browser_origins_allowed_are_its_own_and_the_configured_ones(
    origin: str, host: str | None, allowed: bool
) -> None:
    settings = GatewaySettings(
        public_url="https://gw.example", allowed_origins=("https://chat.example",)
    )
    own_url = public_url(settings)
    assert origin_allowed(origin, host, allowed_origins(settings), own_url) is allowed


async def upgrade(url: str, headers: dict[str, str]) -> aiohttp.ClientResponse:
    """A websocket handshake as a plain request, so a refusal's body can be read."""
    async with aiohttp.ClientSession() as http:
        response = await http.get(
            url.replace("ws://", "http://"),
            headers={
                "Upgrade": "websocket",
                "Connection": "Upgrade",
                "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
                "Sec-WebSocket-Version": "13",
                **headers,
            },
        )
        if response.status != 101:
            await response.read()
        response.release()
        return response


async def test_a_foreign_page_cannot_open_the_websocket(
    gateway: Gateway, api_key: CreatedApiKey
) -> None:
    auth = {"Authorization": f"Bearer {api_key.api_key}"}
    foreign = await upgrade(gateway.ws_url, {**auth, "Origin": "https://evil.example"})
    assert foreign.status == 403
    own = await upgrade(gateway.ws_url, {**auth, "Origin": gateway.url})
    assert own.status == 101
    async with connect(gateway.ws_url, api_key.api_key) as ws:  # API clients send no Origin
        await send(ws, {"type": "ping"})
        assert await receive(ws) == {"type": "pong"}
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(gateway.ws_url, origin="https://evil.example")
    assert refused.value.status == 403


async def test_failed_authentications_are_limited_per_client_behind_a_proxy(
    aws: AwsEmulator, gateway_key: SigningKey
) -> None:
    async with (
        running_gateway(
            aws, gateway_key, trusted_proxy_hops=1, failed_auth_per_client_per_minute=3
        ) as gw,
        aiohttp.ClientSession() as http,
    ):
        api_key = await gw.state.registry.create_key("guessed")

        async def token(key: str, client: str) -> aiohttp.ClientResponse:
            headers = {"Authorization": f"Bearer {key}", "X-Forwarded-For": f"6.6.6.6, {client}"}
            async with http.post(f"{gw.url}/v1/token", headers=headers) as response:
                await response.read()
                return response

        wrong = api_key.api_key[:-4] + "AAAA"
        assert [(await token(wrong, "10.0.0.1")).status for _ in range(3)] == [401] * 3
        limited = await token(api_key.api_key, "10.0.0.1")
        assert limited.status == 429
        assert int(limited.headers["Retry-After"]) >= 1
        assert (await token(api_key.api_key, "10.0.0.2")).status == 200  # another client
        # Now found valid moments ago, the key is no guess, even from the throttled address...
        assert (await token(api_key.api_key, "10.0.0.1")).status == 200
        async with aiohttp.ClientSession() as other:  # ... where guesses stay refused
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await other.ws_connect(
                    gw.ws_url,
                    headers={"Authorization": f"Bearer {wrong}", "X-Forwarded-For": "10.0.0.1"},
                )
        assert refused.value.status == 429


async def test_slow_and_oversized_bodies_get_json_errors(
    aws: AwsEmulator, gateway_key: SigningKey
) -> None:
    async with running_gateway(aws, gateway_key, http_body_timeout_seconds=0.5) as gw:
        api_key = await gw.state.registry.create_key("slow")
        host, port = gw.url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: Bearer {api_key.api_key}\r\nContent-Length: 100\r\n\r\n{{".encode()
        )
        async with asyncio.timeout(30):
            answer = await reader.read(4096)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 408")
        assert b'"code": "timeout"' in answer or b'"code":"timeout"' in answer

        async with aiohttp.ClientSession() as http:
            headers = {"Authorization": f"Bearer {api_key.api_key}"}
            body = b"x" * (MAX_REQUEST_BYTES + 1)
            async with http.post(
                f"{gw.url}/v1/chat/completions", data=body, headers=headers
            ) as response:
                assert response.status == 413
                assert (await response.json())["error"]["code"] == "invalid_request"


async def test_a_client_continues_a_stream_it_holds_part_of_through_another_replica(
    aws: AwsEmulator,
    gateway_key: SigningKey,
    start_agent: AgentFactory,
    api_key: CreatedApiKey,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its first gateway went away: the ids, text and receipt it holds go on through another.

    What the deployment delivered is not charged again; the same ids without their receipt,
    or under another prompt, are charged as prompt.
    """
    monkeypatch.setattr("gateway.server.USAGE_FLUSH_SECONDS", 3600)  # its counts stay here
    content, max_tokens = "carry on", 30
    async with replicas(aws, gateway_key, 2, start_agent, models=(MODEL,)) as (first, second):
        request = generate("s", MODEL, content=content, max_tokens=max_tokens, want_ids=True)
        held_ids: list[int] = []
        held_text = ""
        receipt = None
        async with connect(first.ws_url, api_key.api_key) as ws:
            await send(ws, request)
            while len(held_ids) < 8:
                frame = await receive(ws)
                if frame["type"] == "delta":
                    held_ids += frame["ids"]
                    held_text += frame["text"]
                    receipt = frame["receipt"]
        # The socket is gone mid-stream; what the client holds goes to the other gateway.
        resume = {
            "token_ids": held_ids,
            "text": held_text,
            "completion_tokens": len(held_ids),
            "receipt": receipt,
        }
        usage = second.state.usage.pending
        async with connect(second.ws_url, api_key.api_key) as ws:
            frames = (await run_streams(ws, {**request, "resume": resume}))["s"]
            # The tokens it brought were charged where it got them: here, only the rest.
            assert sum(c.completion_tokens for c in usage.values()) == max_tokens - len(held_ids)
            prompt_only = sum(c.prompt_tokens for c in usage.values())
            usage.clear()
            unproven = {**resume, "receipt": None}
            # Without its receipt, or with one for another prompt, it proves nothing.
            elsewhere = generate("other", MODEL, content="carry in", max_tokens=max_tokens)
            charged = {}
            for sent in (
                {**request, "id": "no-receipt", "resume": unproven},
                {**elsewhere, "resume": resume},
            ):
                charged.update(await run_streams(ws, sent))
                # It paid for the ids it brought, as prompt.
                assert sum(c.prompt_tokens for c in usage.values()) == prompt_only + len(held_ids)
                usage.clear()
            refusals = await run_streams(
                ws,
                {**request, "id": "unknown-id", "resume": {**resume, "token_ids": [10**6] * 8}},
                {**request, "id": "wrong-text", "resume": {**resume, "text": "not what it said"}},
                {**request, "id": "too-many", "max_tokens": 4, "resume": resume},
            )
        for stream in ("no-receipt", "other"):
            assert charged[stream][-1]["type"] == "done", stream
    assert frames[0]["type"] == "start"
    done = frames[-1]
    assert done["type"] == "done"
    assert done["usage"]["completion_tokens"] == max_tokens
    rest = "".join(frame["text"] for frame in frames if frame["type"] == "delta")
    assert held_text + rest == expected_text(content, max_tokens)  # nothing lost or repeated
    for stream, seen in refusals.items():
        error = seen[-1]
        assert (error["type"], error["code"]) == ("error", "invalid_request"), stream
    assert "not a token id of this model" in refusals["unknown-id"][-1]["message"]
    assert "more than the 4 this stream may have" in refusals["too-many"][-1]["message"]


async def test_each_replica_names_itself_in_ws_url_and_accepts_the_others_tokens(
    aws: AwsEmulator,
    gateway_key: SigningKey,
    start_agent: AgentFactory,
    api_key: CreatedApiKey,
) -> None:
    """No shared public URL (`spotgate up`): a token from B sends its client to B."""
    async with (
        replicas(aws, gateway_key, 2, start_agent, models=(MODEL,)) as (first, second),
        aiohttp.ClientSession() as http,
    ):
        headers = {"Authorization": f"Bearer {api_key.api_key}"}
        issued = []
        for gateway in (first, second):
            async with http.post(f"{gateway.url}/v1/token", headers=headers) as response:
                issued.append(await response.json())
        assert [body["ws_url"] for body in issued] == [first.ws_url, second.ws_url]
        # One issuer: a token from either replica opens a socket on the other.
        async with connect(first.ws_url, issued[1]["token"]) as ws:
            frames = (await run_streams(ws, generate("s", MODEL, max_tokens=3)))["s"]
    assert frames[-1]["type"] == "done"


async def test_an_invented_resume_is_charged_as_prompt_against_the_keys_tpm(
    aws: AwsEmulator,
    gateway_key: SigningKey,
    start_agent: AgentFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Valid ids and their exact text, never delivered: the key pays for them (tpm, usage)."""
    monkeypatch.setattr("gateway.server.USAGE_FLUSH_SECONDS", 3600)
    tpm, invented = 2_000, 2_500
    async with Registry.open(aws.settings()) as registry:
        key = await registry.create_key("resumer", tpm=tpm)
    ids = [index % 30 for index in range(invented)]
    text = synthetic(20.0, model=MODEL).decode(ids)
    resume = {"token_ids": ids, "text": text, "completion_tokens": invented}
    async with replicas(aws, gateway_key, 1, start_agent, models=(MODEL,)) as (gateway,):
        async with connect(gateway.ws_url, key.api_key) as ws:
            seen = await run_streams(
                ws,
                *(
                    generate(f"r{n}", MODEL, content="hi", max_tokens=invented + 1, resume=resume)
                    for n in range(3)
                ),
            )
        usage = gateway.state.usage.pending
        prompt_charged = sum(c.prompt_tokens for c in usage.values())
    served = [stream for stream, frames in seen.items() if frames[-1]["type"] == "done"]
    refused = [frames[-1] for frames in seen.values() if frames[-1]["type"] == "error"]
    assert len(served) == 1  # the first overdraws the budget; the rest wait for it to refill
    assert {error["code"] for error in refused} == {"rate_limited"}
    assert prompt_charged >= invented
    # The client is told what its key paid: the invented ids as prompt, only the new as reply.
    done = seen[served[0]][-1]
    relayed = sum(frame["n"] for frame in seen[served[0]] if frame["type"] == "delta")
    assert done["usage"]["completion_tokens"] == relayed == 1
    assert done["usage"]["prompt_tokens"] >= invented


async def test_a_client_cannot_name_its_tenant_the_gateway_names_it_from_the_key(
    gateway: Gateway, gateway_agent: GatewayAgentFactory, api_key: CreatedApiKey
) -> None:
    engine = synthetic(200.0, model=MODEL, ttft_seconds=0.01)
    salts: list[str | None] = []
    generate_on_engine = engine.generate

    def recording(request: GenerationRequest) -> AsyncGenerator[EngineStep, None]:
        salts.append(request.cache_salt)
        return generate_on_engine(request)

    engine.generate = recording
    await gateway_agent(engine=engine)
    async with connect(gateway.ws_url, api_key.api_key) as ws:
        forged = generate("forged", MODEL, max_tokens=2) | {"tenant": "key:someone-else"}
        [refused] = (await run_streams(ws, forged))["forged"]
        mine = (await run_streams(ws, generate("mine", MODEL, max_tokens=2)))["mine"]
    assert (refused["type"], refused["code"], refused["param"]) == (
        "error",
        "invalid_request",
        "tenant",
    )
    assert mine[-1]["type"] == "done"
    # The agent was told the key's own tenant, and salted its prefix cache with it (its own
    # engine probes go unsalted).
    assert [salt for salt in salts if salt is not None] == [
        cache_salt(tenant_of(api_key.record.key_id, None))
    ]


async def test_a_stopping_gateway_closes_its_agent_links_together(
    aws: AwsEmulator, gateway_key: SigningKey
) -> None:
    """A link slow to close (its agent gone silent) holds up no other link's close."""
    closing: list[str] = []
    all_closing = asyncio.Event()
    overlapped: list[str] = []

    class SlowToClose:
        def __init__(self, agent_id: str) -> None:
            self.agent_id = agent_id

        async def close(self) -> None:
            closing.append(self.agent_id)
            if len(closing) == 2:
                all_closing.set()
            # One after another, the first would wait here for a close that has not begun.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5):
                    await all_closing.wait()
                    overlapped.append(self.agent_id)

    async with running_gateway(aws, gateway_key) as gateway:
        links = {agent_id: SlowToClose(agent_id) for agent_id in ("a", "b")}
        gateway.state.links.update(cast(dict[str, AgentLink], links))

    assert sorted(overlapped) == ["a", "b"]
