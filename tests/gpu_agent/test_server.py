"""The agent's surfaces against the synthetic engine: protocol, auth, registration, drain."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncGenerator
from urllib.parse import urlsplit

import aiohttp
import pytest
import websockets

from gpu_agent.engine import Engine, EngineConfigError, EngineStep, GenerationRequest
from gpu_agent.synthetic_engine import ECHO_ID_BASE, SyntheticEngine
from spotgate.protocol import max_gateway_frame_bytes
from spotgate.registry import AgentState, Registry
from spotgate.settings import MAX_REQUEST_BYTES, AgentSettings, SocketLimits
from spotgate.tokens import GATEWAY_SUBJECT_PREFIX, KeyRing, SigningKey, issue
from spotgate.wsserver import receive_limit
from stack.emulator import AwsEmulator
from tests.support.agents import (
    IMDS_LAUNCHED_AT,
    ISSUER,
    AgentFactory,
    Imds,
    WedgingEngine,
    reset_emulator,
    spot_notice,
    synthetic,
    wait_for,
    wait_ready,
)
from tests.support.metrics import metric_value, scrape
from tests.support.wsclient import (
    connect,
    generate,
    ids_of,
    receive,
    receive_to_end,
    run_streams,
    send,
    text_of,
)

STOP_GUARD_SECONDS = 30.0
"""A guard against an agent that never stops, not a speed check."""


async def test_stream_over_ws_is_labelled_synthetic_everywhere(
    start_agent: AgentFactory, synthetic_engine: SyntheticEngine, token: str, aws: AwsEmulator
) -> None:
    agent = await wait_ready(await start_agent(synthetic_engine))

    async with connect(agent.ws_url, token) as ws:
        frames = (await run_streams(ws, generate("s1", "synth", max_tokens=12)))["s1"]

    assert frames[0] == {
        "type": "start",
        "id": "s1",
        "agent": agent.runtime.identity.agent_id,
        "engine": "synthetic",
        "prompt_tokens": frames[-1]["usage"]["prompt_tokens"],  # known before the first token
    }
    done = frames[-1]
    assert done["type"] == "done"
    assert done["usage"]["prompt_tokens"] > 0
    assert done["finish_reason"] == "length"
    assert done["usage"]["completion_tokens"] == 12 == sum(f["n"] for f in frames[1:-1])
    assert len(text_of(frames).split()) == 12
    async with aiohttp.ClientSession() as http, http.get(f"{agent.url}/readyz") as response:
        assert response.status == 200
        assert (await response.json())["engine"] == "synthetic"
    async with Registry.open(aws.settings()) as registry:
        [record] = await registry.list_ready("synth")
    assert record.engine == "synthetic"
    assert record.url == agent.url
    assert (record.lifecycle, record.instance_type, record.region, record.zone) == (
        "spot",
        "g6.xlarge",
        "us-east-1",  # the identity document's own
        "us-east-1a",  # from the IMDS emulator
    )


async def test_a_request_the_engine_refuses_is_refused_before_its_stream_starts(
    start_agent: AgentFactory, synthetic_engine: SyntheticEngine, token: str
) -> None:
    """`start` follows the engine's acceptance: a gateway may still answer with an HTTP error."""
    agent = await wait_ready(await start_agent(synthetic_engine))
    async with connect(agent.ws_url, token) as ws:
        frames = (await run_streams(ws, generate("s1", "synth", max_tokens=4, logprobs=0)))["s1"]

    [refused] = frames
    assert (refused["type"], refused["code"], refused["param"]) == (
        "error",
        "invalid_request",
        "logprobs",
    )


async def test_synthetic_text_is_deterministic_and_resumes_exactly(
    start_agent: AgentFactory, synthetic_engine: SyntheticEngine, token: str
) -> None:
    agent = await wait_ready(await start_agent(synthetic_engine))
    async with connect(agent.ws_url, token) as ws:
        whole = (await run_streams(ws, generate("a", "synth", max_tokens=30, want_ids=True)))["a"]
        again = (await run_streams(ws, generate("b", "synth", max_tokens=30, want_ids=True)))["b"]
        ids = ids_of(whole)
        head = synthetic_engine.decode(ids[:11])
        rest = (
            await run_streams(
                ws,
                generate(
                    "c",
                    "synth",
                    max_tokens=30,
                    want_ids=True,
                    resume={"token_ids": ids[:11], "text": head, "completion_tokens": 11},
                ),
            )
        )["c"]

    assert text_of(whole) == text_of(again)
    assert ids_of(rest) == ids[11:]
    assert head + text_of(rest) == text_of(whole)
    assert rest[-1]["usage"]["completion_tokens"] == 30


async def test_bad_frames_get_errors_and_the_socket_lives_on(
    start_agent: AgentFactory, synthetic_engine: SyntheticEngine, token: str
) -> None:
    agent = await wait_ready(await start_agent(synthetic_engine))
    async with connect(agent.ws_url, token) as ws:
        await ws.send("{not json")
        assert (await receive(ws))["code"] == "invalid_request"
        await send(ws, {"type": "launch", "id": "x"})
        error = await receive(ws)
        assert (error["code"], error["id"]) == ("invalid_request", "x")
        await send(ws, generate("m", "no-such-model"))
        error = await receive(ws)
        assert error["code"] == "invalid_request"
        assert "synth" in error["message"]
        await ws.send(b"\x00binary")
        assert (await receive(ws))["code"] == "invalid_request"
        # Over the frame cap: an error for that stream, and the socket's other streams go on.
        await ws.send(json.dumps(generate("big", "synth", content="x" * 70_000)))
        error = await receive(ws)
        assert (error["code"], error["id"]) == ("invalid_request", "big")
        assert "65536-byte limit" in error["message"]
        frames = await run_streams(ws, generate("after", "synth", max_tokens=3))
        assert frames["after"][-1]["type"] == "done"
        # Far over it (past what is read to answer): the socket closes, 1009, as the cap holds.
        await ws.send(json.dumps(generate("huge", "synth", content="x" * (receive_limit(65536)))))
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await receive(ws)
        assert closed.value.rcvd is not None
        assert closed.value.rcvd.code == 1009
    async with connect(agent.ws_url, token) as ws:
        await send(ws, {"type": "ping"})
        assert await receive(ws) == {"type": "pong"}
        frames = await run_streams(ws, generate("ok", "synth", max_tokens=3))
        assert frames["ok"][-1]["type"] == "done"


async def test_a_gateway_link_carries_the_largest_frame_a_legal_request_and_resume_make(
    start_agent: AgentFactory, ring: KeyRing
) -> None:
    max_model_len = 20_000
    engine = synthetic(1000.0, echo=True, max_model_len=max_model_len)
    agent = await wait_ready(await start_agent(engine))
    gateway_token = issue(
        ring, subject=f"{GATEWAY_SUBJECT_PREFIX}gw-test", issuer=ISSUER, now=time.time()
    ).token
    # A request as large as a gateway reads: the most prompt characters, all control characters
    # (6 JSON bytes each), and empty turns up to the size limit; moved after a whole context
    # of tokens whose text is control characters too.
    echoed_control = ECHO_ID_BASE + 1
    prompt = {"role": "user", "content": "\x01" * SocketLimits().max_prompt_chars}
    empty_turn = {"role": "assistant", "content": ""}
    turns = (MAX_REQUEST_BYTES - len(json.dumps(prompt))) // len(json.dumps(empty_turn) + ",")
    largest = {
        "type": "generate",
        "id": "largest",
        "model": "synth",
        "messages": [prompt, *[empty_turn] * (turns - 1)],
        "want_ids": True,
        "resume": {
            "token_ids": [echoed_control] * max_model_len,
            "text": "\x01" * max_model_len,
            "completion_tokens": max_model_len,
        },
    }
    encoded = json.dumps(largest)
    limit = max_gateway_frame_bytes(max_model_len, engine.max_token_chars)
    assert MAX_REQUEST_BYTES < len(encoded.encode()) <= limit

    async with connect(agent.ws_url, gateway_token) as ws:
        await ws.send(encoded)
        answer = await receive(ws)  # the link took it: the stream gets its own answer
        after = await run_streams(ws, generate("after", "synth", content="still here"))

    assert (answer["id"], answer["code"]) == ("largest", "context_length_exceeded"), answer
    assert text_of(after["after"]) == "still here"


async def test_an_agent_that_cannot_register_at_boot_keeps_trying(
    start_agent: AgentFactory, synthetic_engine: SyntheticEngine, aws: AwsEmulator
) -> None:
    reset_emulator(aws)  # no tables: DynamoDB refuses every write, as in an outage
    agent = await start_agent(synthetic_engine, vouched=False)  # no launch record either
    metrics = agent.runtime.metrics.registry

    async def failed_once() -> bool:
        failures = metrics.get_sample_value("spotgate_agent_registration_failures_total")
        return (failures or 0) >= 1

    await wait_for(failed_once)
    assert not agent.runtime.became_ready.is_set()
    async with Registry.open(aws.settings()) as registry:
        await registry.create_tables()
        await wait_ready(agent)
        record = await registry.get_agent(agent.runtime.settings.agent_id or "")

    assert record is not None
    assert record.state is AgentState.READY


async def test_missing_expired_and_foreign_tokens_are_refused(
    start_agent: AgentFactory, synthetic_engine: SyntheticEngine, ring: KeyRing
) -> None:
    agent = await wait_ready(await start_agent(synthetic_engine))
    now = time.time()
    expired = issue(ring, subject="k", issuer=ISSUER, now=now - 600, ttl_seconds=60).token
    wrong_audience = issue(ring, subject="k", issuer=ISSUER, now=now, audience="other").token
    foreign = issue(KeyRing([SigningKey.generate()]), subject="k", issuer=ISSUER, now=now).token
    body = {"model": "synth", "messages": [{"role": "user", "content": "hi"}]}
    url = f"{agent.url}/v1/chat/completions"

    async with aiohttp.ClientSession() as http:
        for headers, reason in (
            ({}, "missing"),
            ({"Authorization": f"Bearer {expired}"}, "expired"),
            ({"Authorization": f"Bearer {wrong_audience}"}, "bad_audience"),
            ({"Authorization": f"Bearer {foreign}"}, "unknown_kid"),
            ({"Authorization": "Basic dXNlcjpwYXNz"}, "missing"),
        ):
            async with http.post(url, json=body, headers=headers) as response:
                assert response.status == 401
                error = (await response.json())["error"]
                assert error["code"] == "unauthorized"
                assert reason in error["message"]
    with pytest.raises(websockets.InvalidStatus) as refused:
        async with connect(agent.ws_url, expired):
            pass
    assert refused.value.response.status_code == 401


async def test_browser_first_frame_auth(
    start_agent: AgentFactory, synthetic_engine: SyntheticEngine, token: str
) -> None:
    agent = await wait_ready(await start_agent(synthetic_engine))
    async with connect(agent.ws_url, None) as ws:
        await send(ws, {"type": "auth", "token": token})
        frames = await run_streams(ws, generate("s", "synth", max_tokens=2))
        assert frames["s"][-1]["type"] == "done"
    async with connect(agent.ws_url, None) as ws:
        await send(ws, {"type": "auth", "token": "eyJhbGciOiJub25lIn0.e30."})
        error = await receive(ws)
        assert error["code"] == "unauthorized"
        with pytest.raises(websockets.ConnectionClosed):
            await receive(ws)
    async with connect(agent.ws_url, None) as ws:
        await send(ws, generate("s", "synth"))  # generate before auth
        assert (await receive(ws))["code"] == "unauthorized"


async def test_registration_waits_for_the_engine_and_warm_up(
    start_agent: AgentFactory, synthetic_engine: SyntheticEngine, aws: AwsEmulator, token: str
) -> None:
    release = asyncio.Event()
    loading = asyncio.Event()

    async def slow_loader(_settings: AgentSettings) -> Engine:
        loading.set()
        await release.wait()
        return synthetic_engine

    agent = await start_agent(loader=slow_loader)
    await loading.wait()
    async with Registry.open(aws.settings()) as registry:
        assert await registry.list_agents() == []
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{agent.url}/readyz") as response:
                assert response.status == 503
                assert (await response.json())["status"] == "loading"
            async with connect(agent.ws_url, token) as ws:
                error = (await run_streams(ws, generate("early", "synth")))["early"][-1]
                assert error["code"] == "no_capacity"

        released_at = time.time()
        release.set()
        await wait_ready(agent)

        [record] = await registry.list_ready("synth")
        assert record.ready_at is not None
    # Its boot timeline: the load ended once released, the warm-up after it, ready last.
    boot = record.boot
    assert boot.instance_start == IMDS_LAUNCHED_AT  # EC2's `pendingTime`, through IMDS
    assert boot.agent_start < released_at <= boot.engine_loaded <= boot.warmed_up
    assert boot.warmed_up <= boot.ready == record.ready_at
    exposition = await scrape(f"{agent.url}/metrics")
    loaded = metric_value(exposition, "spotgate_agent_boot_seconds", phase="engine_loaded")
    assert loaded == pytest.approx(boot.engine_loaded - IMDS_LAUNCHED_AT)


@pytest.mark.parametrize(
    ("failure", "shown"),
    [
        (RuntimeError("CUDA error: no kernel image"), "RuntimeError: CUDA error: no kernel image"),
        # The operator's to fix: the line that names the argument, as it is.
        (
            EngineConfigError("SPOTGATE_AGENT_VLLM__ENGINE_ARGS: --x 1: not an engine argument"),
            "SPOTGATE_AGENT_VLLM__ENGINE_ARGS: --x 1: not an engine argument",
        ),
        # One line however many the error has, and no credential in it.
        (
            OSError("cannot fetch the model:\n  Authorization: Bearer abc.def-123\n  (403)"),
            "OSError: cannot fetch the model: Authorization: Bearer [redacted] (403)",
        ),
    ],
)
async def test_an_engine_that_cannot_start_says_why_and_is_never_routed_to(
    start_agent: AgentFactory, aws: AwsEmulator, failure: Exception, shown: str
) -> None:
    async def broken(_settings: AgentSettings) -> Engine:
        raise failure

    agent = await start_agent(loader=broken)
    async with Registry.open(aws.settings()) as registry:

        async def recorded() -> bool:  # its entry is written once `/healthz` says why
            return bool(await registry.list_agents())

        await wait_for(recorded)
        [record] = await registry.list_agents()
        ready = await registry.list_ready(record.model)
    async with aiohttp.ClientSession() as http, http.get(f"{agent.url}/healthz") as response:
        health = (response.status, (await response.json())["failure"])

    assert health == (503, shown)

    assert record.state is AgentState.GONE  # the pool manager reaps it
    assert (record.shown_state, record.failure) == ("failed", shown)
    assert ready == []


async def test_spot_notice_drains_hands_back_long_streams_and_leaves_gone(
    start_agent: AgentFactory, imds: Imds, aws: AwsEmulator, token: str
) -> None:
    slow = synthetic(tokens_per_second=20.0, max_model_len=200_000)  # streams that outlive it
    agent = await wait_ready(await start_agent(slow, agent_id=None))  # named by IMDS
    agent_id = agent.runtime.identity.agent_id
    assert agent_id == "arn:aws:ec2:us-east-1:123456789012:instance/i-0test"  # its ARN, as IAM's
    async with connect(agent.ws_url, token) as ws:
        await send(ws, generate("long", "synth", max_tokens=100_000))
        await send(ws, generate("short", "synth", max_tokens=30))
        assert (await receive(ws))["type"] == "start"
        deadline = await spot_notice(imds, in_seconds=30)

        frames: dict[str, list[dict]] = {"long": [], "short": []}
        async with Registry.open(aws.settings()) as registry:

            async def draining() -> bool:
                record = await registry.get_agent(agent_id)
                return record is not None and record.state is AgentState.DRAINING

            await wait_for(draining, within=30.0)
            record = await registry.get_agent(agent_id)
            assert record is not None
            assert record.drain_deadline is not None
            # Marked from the notice IMDS gave (its deadline, to the second), not by a timeout.
            assert abs(record.drain_deadline - deadline) < 1.0
            await send(ws, generate("new", "synth"))
            while (
                not all(f and f[-1]["type"] in ("done", "error") for f in frames.values())
                or "new" not in frames
            ):
                frame = await receive(ws)
                frames.setdefault(frame.get("id"), []).append(frame)

            assert frames["new"] == [frames["new"][0]]
            assert frames["new"][0]["code"] == "no_capacity"
            assert frames["short"][-1]["type"] == "done", frames["short"][-1]
            assert frames["short"][-1]["usage"]["completion_tokens"] == 30
            assert frames["long"][-1]["code"] == "interrupted"

            async def gone() -> bool:
                record = await registry.get_agent(agent_id)
                return record is not None and record.state is AgentState.GONE

            await wait_for(gone)
        assert agent.runtime.stopped.is_set()


async def test_an_agent_whose_last_boot_is_gone_stops_saying_so(
    start_agent: AgentFactory, aws: AwsEmulator, synthetic_engine: SyntheticEngine
) -> None:
    """An instance started again by hand, its last boot's entry still `gone` (the pool manager
    removes it before a warm start): the new boot cannot register, and stops, not hangs."""
    first = await wait_ready(await start_agent(synthetic_engine, agent_id="i-restarted"))
    async with Registry.open(aws.settings()) as registry:
        await registry.set_gone("i-restarted")
    await asyncio.wait_for(first.runtime.stopped.wait(), STOP_GUARD_SECONDS)  # its heartbeat

    again = await start_agent(synthetic_engine, agent_id="i-restarted", vouched=False)
    await asyncio.wait_for(again.runtime.stopped.wait(), STOP_GUARD_SECONDS)

    assert again.runtime.phase == "stopped"
    assert not again.runtime.became_ready.is_set()


async def test_heartbeats_report_load_and_rebalance_is_only_recorded(
    start_agent: AgentFactory, imds: Imds, aws: AwsEmulator, token: str
) -> None:
    slow = synthetic(tokens_per_second=20.0, max_model_len=200_000)  # streams that outlive it
    agent = await wait_ready(await start_agent(slow))
    agent_id = agent.runtime.identity.agent_id
    async with (
        Registry.open(aws.settings()) as registry,
        aiohttp.ClientSession() as http,
        connect(agent.ws_url, token) as ws,
    ):
        await send(ws, generate("s", "synth", max_tokens=100_000))
        assert (await receive(ws))["type"] == "start"

        async def busy() -> bool:
            record = await registry.get_agent(agent_id)
            return record is not None and record.active == 1

        await wait_for(busy)
        async with http.post(f"{imds.url}/_emulator/rebalance"):
            pass

        async def rebalance_recorded() -> bool:
            record = await registry.get_agent(agent_id)
            return record is not None and record.rebalance_at is not None

        await wait_for(rebalance_recorded)
        record = await registry.get_agent(agent_id)
        assert record is not None
        assert record.state is AgentState.READY
        assert agent.runtime.accepting


class SteppedFlood(SyntheticEngine):
    """A synthetic engine that hands out at most `STEP_TOKENS` ids per step, as a model does.

    The synthetic engine keeps to a wall-clock schedule: a step late on it hands out every
    token due since the last one, up to the whole rest of the reply at once, which a loaded
    machine would leave in the agent's hands before any socket buffer filled. Step by step,
    the agent takes the next only when it sent the last.
    """

    STEP_TOKENS = 1000

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[EngineStep, None]:
        """The synthetic engine's steps, cut into steps of at most `STEP_TOKENS` ids."""
        async for step in super().generate(request):
            ids = list(step.token_ids)
            for start in range(0, len(ids), self.STEP_TOKENS):
                last = start + self.STEP_TOKENS >= len(ids)
                yield EngineStep(
                    ids[start : start + self.STEP_TOKENS], step.finish_reason if last else None
                )


async def test_a_client_that_never_reads_pauses_its_stream(
    start_agent: AgentFactory, token: str
) -> None:
    flood = synthetic(tokens_per_second=250_000.0, max_model_len=2_000_000, kind=SteppedFlood)
    agent = await wait_ready(await start_agent(flood))
    max_tokens = 1_000_000  # about 6 MB of text
    headers = {"Authorization": f"Bearer {token}"}
    # Fixed kernel buffers at both ends, and no compression: Linux autotunes a receive buffer
    # up to tcp_rmem's maximum (32 MB on some hosts) and a send buffer up to tcp_wmem's
    # (4 MB or more), and deflate shrinks this repetitive text; any of them can leave room
    # for the whole reply, which would hide a missing pause. Both ends then hold a few
    # hundred kB, some 50k tokens.
    reader = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    reader.setblocking(False)
    parts = urlsplit(agent.ws_url)
    await asyncio.get_running_loop().sock_connect(reader, (parts.hostname, parts.port))
    async with websockets.connect(
        agent.ws_url,
        sock=reader,
        additional_headers=headers,
        compression=None,
        max_queue=1,
        close_timeout=1,
    ) as ws:

        async def registered() -> bool:
            return bool(agent.runtime.websockets)

        await wait_for(registered)
        [link] = agent.runtime.websockets
        link.ws.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
        await send(ws, generate("flood", "synth", max_tokens=max_tokens))
        assert (await receive(ws))["type"] == "start"  # then it reads nothing more
        [handle] = agent.runtime.streams.values()
        produced: list[int] = []
        async with asyncio.timeout(60):
            while len(produced) < 3 or produced[-1] != produced[-3]:
                await asyncio.sleep(0.25)  # sampling a rate, not synchronising
                produced.append(handle.progress.completion_tokens)
        # Stalled once the sockets' buffers filled, short of the end: the agent waits for the
        # reader instead of buffering the reply.
        assert 0 < produced[-1] < max_tokens // 2, produced
        assert not handle.task.done()


async def test_agent_metrics_count_streams_and_tokens(
    start_agent: AgentFactory, synthetic_engine: SyntheticEngine, token: str
) -> None:
    agent = await wait_ready(await start_agent(synthetic_engine))
    async with connect(agent.ws_url, token) as ws:
        await run_streams(ws, generate("a", "synth", max_tokens=9))
        await run_streams(ws, generate("b", "nope"))
    text = await scrape(f"{agent.url}/metrics")

    def value(sample: str, **labels: str) -> float:
        return metric_value(text, sample, **labels)

    assert value("spotgate_agent_generated_tokens_total") == 9
    assert value("spotgate_agent_streams_total", outcome="completed") == 1
    assert value("spotgate_agent_streams_total", outcome="invalid_request") == 1
    assert value("spotgate_agent_ttft_seconds_count") == 1
    assert value("spotgate_agent_ready") == 1


PREFIX_CACHE_QUERIED = "spotgate_agent_prefix_cache_queried_tokens_total"
PREFIX_CACHE_HIT = "spotgate_agent_prefix_cache_hit_tokens_total"


async def test_agent_metrics_follow_the_engines_prefix_cache_counts(
    start_agent: AgentFactory, synthetic_engine: SyntheticEngine
) -> None:
    release = asyncio.Event()

    async def slow_loader(_settings: AgentSettings) -> Engine:
        await release.wait()
        return synthetic_engine

    agent = await start_agent(loader=slow_loader)
    loading = await scrape(f"{agent.url}/metrics")
    release.set()
    await wait_ready(agent)
    loaded = await scrape(f"{agent.url}/metrics")
    # What vLLM's stat logger adds after a step; the synthetic engine itself has no cache.
    synthetic_engine.prefix_cache.queried_tokens += 300
    synthetic_engine.prefix_cache.hit_tokens += 256
    counted = await scrape(f"{agent.url}/metrics")

    for exposition in (loading, loaded):
        assert metric_value(exposition, PREFIX_CACHE_QUERIED) == 0
        assert metric_value(exposition, PREFIX_CACHE_HIT) == 0
    assert metric_value(counted, PREFIX_CACHE_QUERIED) == 300
    assert metric_value(counted, PREFIX_CACHE_HIT) == 256


class _EngineThatDies(SyntheticEngine):
    """A synthetic engine whose process "dies" when the test says so (vLLM: the core exits)."""

    death: str | None = None

    def failure(self) -> str | None:
        return self.death


async def test_an_engine_that_dies_while_idle_takes_the_agent_out_of_the_pool(
    start_agent: AgentFactory, aws: AwsEmulator
) -> None:
    engine = _EngineThatDies(AgentSettings(engine="synthetic", served_model_name="synth"))
    agent = await wait_ready(await start_agent(engine))
    agent_id = agent.runtime.identity.agent_id

    engine.death = "the engine process exited"

    async with Registry.open(aws.settings()) as registry:

        async def gone() -> bool:  # found by the heartbeat, with no stream to notice it
            record = await registry.get_agent(agent_id)
            return record is not None and record.state is AgentState.GONE

        await wait_for(gone)
    async with aiohttp.ClientSession() as http, http.get(f"{agent.url}/healthz") as health:
        assert health.status == 503
        assert (await health.json())["failure"] == "the engine process exited"
    assert agent.runtime.phase == "failed"


@pytest.mark.parametrize("busy", [False, True], ids=["idle: the probe hangs", "mid-stream"])
async def test_a_wedged_engine_takes_the_agent_out_of_the_pool(
    start_agent: AgentFactory, aws: AwsEmulator, token: str, busy: bool
) -> None:
    engine = WedgingEngine()
    agent = await wait_ready(
        await start_agent(engine, engine_check_seconds=0.2, engine_stall_seconds=1.0)
    )
    agent_id = agent.runtime.identity.agent_id
    async with connect(agent.ws_url, token) as ws:
        if busy:  # a stream hangs after 5 tokens: its agent hands it back, to move elsewhere
            engine.hang_after(5)
            await send(ws, generate("s", "synth", max_tokens=50))
        else:  # nothing runs: only the probe can tell
            engine.wedge()
        async with Registry.open(aws.settings()) as registry:

            async def gone() -> bool:
                record = await registry.get_agent(agent_id)
                return record is not None and record.state is AgentState.GONE

            await wait_for(gone)
        if busy:
            frames = [await receive(ws)]
            await receive_to_end(ws, frames)
            assert (frames[-1]["type"], frames[-1]["code"]) == ("error", "interrupted")
            # the tokens before it hung (a step may carry more than one), not the 50 asked
            assert 5 <= sum(f["n"] for f in frames if f["type"] == "delta") < 50
    async with aiohttp.ClientSession() as http, http.get(f"{agent.url}/healthz") as health:
        assert health.status == 503
        assert "wedged" in (await health.json())["failure"]
    assert (
        metric_value(await scrape(f"{agent.url}/metrics"), "spotgate_agent_engine_stalls_total")
        == 1
    )
