"""`spotgate up` as a user runs it: its children supervised, none outliving it."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import aiohttp
import openai
import psutil
import pytest
from pydantic import BaseModel

from cli.args import EXIT_INTERRUPTED
from gpu_agent.synthetic_engine import synthetic_reply
from loadtest.chaos.stack import SYNTHETIC, StackEngine
from loadtest.chaos.traffic import SseClients, Tally, Traffic
from spotgate.registry import Registry
from spotgate.settings import emulator_settings
from stack.local import (
    TINY_ANSWER,
    TINY_MODEL_CACHE_ENV,
    TINY_THINKING,
    TOKENIZER_CACHE_ENV,
    UP_FILE,
)
from tests.support.agents import TINY_MODEL_CACHE, wait_for
from tests.support.tokenizers import CACHE as TOKENIZER_CACHE
from tests.support.up import UP_COMMAND, running_up

UP = ["--engine", "synthetic", "--agents", "2", "--port", "0"]
GRACE_SECONDS = 2.0
TOKENS_PER_SECOND = 20.0
LONG_STREAM_TOKENS = 240  # 12 s: outlasts the grace by 10 s, on a machine slow to signal too
SHORT_STREAM_TOKENS = 10
UP_ENV = {
    # a test's drain: streams outlive it, and it ends soon
    "SPOTGATE_GATEWAY_SHUTDOWN_GRACE_SECONDS": str(GRACE_SECONDS),
    "SPOTGATE_AGENT_SYNTHETIC__TOKENS_PER_SECOND": str(TOKENS_PER_SECOND),
}
EXIT_TIMEOUT_SECONDS = 60.0


@dataclass
class UpStack:
    """The stack a `spotgate up` runs, as its clients see it (`up.json`)."""

    process: subprocess.Popen[str]
    info: dict[str, Any]
    engine: StackEngine = SYNTHETIC
    gateway_urls: list[str] = field(init=False)
    api_key: str = field(init=False)

    def __post_init__(self) -> None:
        self.gateway_urls = self.info["gateways"]
        self.api_key = self.info["api_key"]

    def generate_frame(
        self, stream_id: str, prompt: str, session: str, max_tokens: int | None = None
    ) -> dict[str, Any]:
        return self.engine.generate_frame(stream_id, prompt, session, max_tokens)

    def expected_reply(self, prompt: str, max_tokens: int | None = None) -> str:
        return synthetic_reply(prompt, max_tokens or self.engine.stream_tokens)

    def descendants(self) -> list[psutil.Process]:
        """Every process `up` runs now, its children's children too."""
        return psutil.Process(self.process.pid).children(recursive=True)

    def gateway(self, index: int) -> psutil.Process:
        """The process serving gateway `index` now."""
        port = self.gateway_urls[index].rsplit(":", 1)[1]
        for child in psutil.Process(self.process.pid).children():
            if child.environ().get("SPOTGATE_GATEWAY_PORT") == port:
                return child
        raise LookupError(f"no gateway on port {port}")

    async def serving(self, index: int, old_pid: int) -> bool:
        """Whether gateway `index` runs as a new process and says it is ready."""
        try:
            if self.gateway(index).pid == old_pid:
                return False
        except (LookupError, psutil.Error):
            return False
        url = f"{self.info['ops_urls'][index]}/readyz"
        try:
            async with aiohttp.ClientSession() as http, http.get(url) as response:
                return response.status == 200
        except aiohttp.ClientError:
            return False


@pytest.fixture
def up(tmp_path: Path) -> Iterator[UpStack]:
    with running_up(tmp_path, [*UP, "--gateways", "2"], UP_ENV) as running:
        yield UpStack(running.process, running.info)


def wait_all_exited(pids: dict[int, int], within_seconds: float) -> set[int]:
    """Wait on pidfds until every process has exited; the pids still running at the end."""
    deadline = time.monotonic() + within_seconds
    running = dict(pids)  # pidfd → pid
    while running and (left := deadline - time.monotonic()) > 0:
        readable, _, _ = select.select(list(running), [], [], left)
        for descriptor in readable:
            del running[descriptor]
    return set(running.values())


def test_no_process_up_started_outlives_it_killed_with_sigkill(up: UpStack) -> None:
    started = up.descendants()
    names = " ".join(" ".join(process.cmdline()) for process in started)
    # two gateways, the pool manager, two agents and their IMDS emulators, the limit store
    assert len(started) >= 8, names
    for part in ("-m gateway", "-m pool_manager", "-m gpu_agent", "imds_emulator", "redis-server"):
        assert part in names
    # pidfds, opened while they run: a pid the kernel hands out again is no false alarm
    pidfds = {os.pidfd_open(process.pid): process.pid for process in started}
    try:
        up.process.kill()
        up.process.wait()
        left = wait_all_exited(pidfds, EXIT_TIMEOUT_SECONDS)
    finally:
        for descriptor in pidfds:
            os.close(descriptor)
    assert not left, [" ".join(psutil.Process(pid).cmdline()) for pid in left]


def agent_started(processes: list[psutil.Process]) -> bool:
    """Whether an agent is among the processes."""
    return any("gpu_agent" in " ".join(process.cmdline()) for process in processes)


@pytest.mark.parametrize("moment", ["while it loads", "while its agents start"])
def test_ctrl_c_at_any_moment_of_up_ends_it_quietly_and_everything_it_started(
    tmp_path: Path, moment: str
) -> None:
    process = subprocess.Popen(
        [*UP_COMMAND, *UP],
        cwd=tmp_path,
        # Agents that take ten minutes to load: `up` is still waiting for them at the signal.
        env={**os.environ, "SPOTGATE_AGENT_SYNTHETIC__LOAD_SECONDS": "600"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # As `up &` in a script starts it: SIGINT ignored by its parent, which it inherits.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    started: list[psutil.Process] = []
    pidfds: dict[int, int] = {}
    deadline = time.monotonic() + EXIT_TIMEOUT_SECONDS
    try:
        if moment == "while it loads":  # its commands' modules, pydantic's among the first
            maps = Path(f"/proc/{process.pid}/maps")
            while "pydantic_core" not in maps.read_text() and time.monotonic() < deadline:
                time.sleep(0.005)  # polling: an import has no event
        else:
            while not agent_started(started) and time.monotonic() < deadline:
                time.sleep(0.05)  # polling: a child's start has no event
                started = psutil.Process(process.pid).children(recursive=True)
            assert agent_started(started), "up started no agent"
            pidfds = {os.pidfd_open(child.pid): child.pid for child in started}
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=EXIT_TIMEOUT_SECONDS)
        left = wait_all_exited(pidfds, EXIT_TIMEOUT_SECONDS)
    finally:
        if process.poll() is None:
            process.kill()
        for descriptor in pidfds:
            os.close(descriptor)

    # 130 as it returns it; -SIGINT where the signal ended it before Python could
    assert process.returncode in (EXIT_INTERRUPTED, -signal.SIGINT), err
    assert (out, err) == ("", "")
    assert not left, [" ".join(psutil.Process(pid).cmdline()) for pid in left]
    assert not (tmp_path / UP_FILE).exists()


async def test_a_gateway_that_exits_is_restarted_and_its_clients_resume_elsewhere(
    up: UpStack,
) -> None:
    for stop, signum in (("killed", signal.SIGKILL), ("stopped", signal.SIGTERM)):
        # Streams longer than the grace, all on the second gateway, which then goes.
        streams = Traffic(up, 4, name=stop, rounds=1, max_tokens=LONG_STREAM_TOKENS, gateway=1)
        # OpenAI clients beside them while it drains: an SSE stream cannot move, it is told.
        drained = signum == signal.SIGTERM
        sse = SseClients(
            up, 2 if drained else 0, max_tokens=LONG_STREAM_TOKENS, gateway=1, tally=Tally()
        )
        streams.start()
        sse.start()
        async with asyncio.timeout(30):
            await streams.replying.wait()
            if drained:
                await sse.replying.wait()
        victim = up.gateway(1)
        victim.send_signal(signum)
        async with asyncio.timeout(60):
            await streams.finished()
            await sse.finished()
        # Every websocket stream went on through the other gateway, exact.
        assert (streams.tally.exact, streams.tally.resumed) == (4, 4), streams.tally
        assert (streams.tally.lost, streams.tally.failed.total()) == (0, 0), streams.tally
        if drained:  # each SSE stream heard `going_away` when the grace was over, then [DONE]
            assert (sse.tally.failed, sse.tally.lost) == ({"going_away": 2}, 0), sse.tally

        # The gateway runs again on its port, and serves.
        await wait_for(functools.partial(up.serving, 1, victim.pid), within=60)
        again = Traffic(
            up, 2, name=f"{stop}-again", rounds=1, max_tokens=SHORT_STREAM_TOKENS, gateway=1
        )
        again.start()
        async with asyncio.timeout(30):
            await again.finished()
        assert (again.tally.exact, again.tally.resumed) == (2, 0), again.tally

    up.process.send_signal(signal.SIGINT)
    assert up.process.wait(timeout=EXIT_TIMEOUT_SECONDS) == 0
    assert up.process.stderr is not None
    restarts = [
        event
        for line in up.process.stderr.read().splitlines()
        if line.startswith("{")
        and (event := json.loads(line))["event"] == "child exited; restarting it"
    ]
    # A SIGTERM is a drain: the gateway ends it, exit 0, and is restarted all the same.
    assert [(event["child"], event["exit"]) for event in restarts] == [
        ("gateway-2", "SIGKILL"),
        ("gateway-2", "exit 0"),
    ]


async def test_a_gateway_that_keeps_failing_stops_the_stack_saying_which(up: UpStack) -> None:
    started = up.descendants()
    pidfds = {os.pidfd_open(process.pid): process.pid for process in started}
    try:
        for kills in range(1, 6):  # the fifth exit in five minutes is one too many
            victim = up.gateway(1)
            victim.kill()
            if kills < 5:
                await wait_for(functools.partial(up.serving, 1, victim.pid), within=60)
        assert up.process.wait(timeout=EXIT_TIMEOUT_SECONDS) == 2
        # It stopped everything it started, the gateway that kept serving too.
        left = wait_all_exited(pidfds, EXIT_TIMEOUT_SECONDS)
    finally:
        for descriptor in pidfds:
            os.close(descriptor)
    assert not left
    assert up.process.stderr is not None
    said = up.process.stderr.read()
    assert "gateway-2 exited 5 times in 300 s, the last with SIGKILL; see " in said
    events = [json.loads(line) for line in said.splitlines() if line.startswith("{")]
    failing = next(
        event for event in events if event["event"] == "child keeps failing; stopping the stack"
    )
    assert failing["child"] == "gateway-2"
    assert "gateway listening" in failing["log_tail"]  # what it said before it went


async def test_a_pool_manager_that_exits_is_restarted_and_launches_agents_anew(
    up: UpStack,
) -> None:
    pool_manager = next(
        child
        for child in psutil.Process(up.process.pid).children()
        if "pool_manager" in " ".join(child.cmdline())
    )
    first_agents = pool_manager.children()  # its agents and their IMDS emulators
    pidfds = {os.pidfd_open(process.pid): process.pid for process in (pool_manager, *first_agents)}
    try:
        pool_manager.kill()
        # what it ran went with it
        left = wait_all_exited(pidfds, EXIT_TIMEOUT_SECONDS)
    finally:
        for descriptor in pidfds:
            os.close(descriptor)
    assert not left

    settings = emulator_settings(up.info["aws_endpoint_url"], up.info["region"])

    async def fresh_agents_ready() -> bool:
        async with Registry.open(settings) as registry:
            ready = {agent.agent_id for agent in await registry.list_ready(up.info["model"])}
        return {"local-3", "local-4"} <= ready  # the registry would refuse a name used before

    await wait_for(fresh_agents_ready, within=60)
    streams = Traffic(up, 2, name="after", rounds=1, max_tokens=SHORT_STREAM_TOKENS)
    streams.start()
    async with asyncio.timeout(60):
        await streams.finished()
    assert streams.tally.exact == 2, streams.tally


async def test_a_limit_store_that_exits_is_started_again_and_limits_are_shared_anew(
    up: UpStack, tmp_path: Path
) -> None:
    def store_process() -> psutil.Process | None:
        return next(
            (child for child in up.descendants() if "redis-server" in " ".join(child.cmdline())),
            None,
        )

    first = store_process()
    assert first is not None
    first.kill()
    await asyncio.to_thread(first.wait)

    async def shared_again() -> bool:
        restarted = store_process()
        if restarted is None or restarted.pid == first.pid:
            return False
        async with aiohttp.ClientSession() as http:
            for ops in up.info["ops_urls"]:
                async with http.get(f"{ops}/readyz") as ready:
                    if (await ready.json())["limits"] != "shared":
                        return False
        return True

    await wait_for(shared_again, within=60)
    assert up.process.poll() is None  # the stack served on meanwhile
    created = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "cli", "keys", "create", "--name", "one", "--rpm", "1"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    key = next(word for word in created.stdout.split() if word.startswith("sg-"))
    body = {"model": up.info["model"], "messages": [{"role": "user", "content": "x"}]}
    statuses = []
    async with aiohttp.ClientSession() as http:
        for url in up.gateway_urls:  # the key's one request a minute, over both replicas
            async with http.post(
                f"{url}/v1/chat/completions",
                headers={"Authorization": f"Bearer {key}"},
                json={**body, "max_tokens": 1},
            ) as response:
                statuses.append(response.status)
    assert statuses == [200, 429]


class Verdict(BaseModel):
    """A structured reply: the schema the default model's grammar keeps it to."""

    city: Literal["Paris", "Oslo", "Lima"]
    sunny: bool


WEATHER_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


async def test_two_models_each_run_by_agents_of_their_own(
    tmp_path: Path, openai_client: Callable[..., openai.AsyncOpenAI]
) -> None:
    arguments = ["--engine", "synthetic", "--agents", "1", "--port", "0"]
    with running_up(tmp_path, [*arguments, "--model", "chat", "--model", "code"]) as running:
        info = running.info
        client = openai_client(
            base_url=f"{info['gateway_url']}/v1", api_key=info["api_key"], max_retries=0
        )
        listed = {model.id for model in (await client.models.list()).data}
        replies = {
            model: await client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=3
            )
            for model in ("chat", "code")
        }
        async with Registry.open(emulator_settings(info["aws_endpoint_url"], info["region"])) as r:
            serving = {model: {a.agent_id for a in await r.list_ready(model)} for model in replies}

    assert info["models"] == ["chat", "code"]
    assert info["model"] == "chat"
    assert listed == {"chat", "code"}
    assert {model: reply.model for model, reply in replies.items()} == {
        "chat": "chat",
        "code": "code",
    }
    assert all(len(agents) == 1 for agents in serving.values())
    assert not serving["chat"] & serving["code"]  # one agent per model, none shared
    assert len(info["agents"]) == 2


@pytest.fixture
def default_up(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """`make up` as a new user first runs it: vLLM, the tiny model on Qwen3's template.

    The model comes from the suite's cache once taught (a new user's `up` teaches it: see
    the test of a kill while it does).
    """
    arguments = ["--agents", "1", "--port", "0"]
    caches = {
        TOKENIZER_CACHE_ENV: str(TOKENIZER_CACHE),
        TINY_MODEL_CACHE_ENV: str(TINY_MODEL_CACHE),
    }
    with running_up(tmp_path, arguments, caches) as running:
        yield running.info


async def test_the_default_model_answers_tools_structured_output_and_reasoning(
    default_up: dict[str, Any],
    openai_client: Callable[..., openai.AsyncOpenAI],
) -> None:
    client = openai_client(
        base_url=f"{default_up['gateway_url']}/v1", api_key=default_up["api_key"]
    )
    model = default_up["model"]
    hi: Any = [{"role": "user", "content": "Weather in Oslo?"}]
    # The SDK's everyday tools request: tool_choice is `auto` when not given.
    with_tools = await client.chat.completions.create(
        model=model, messages=hi, tools=[WEATHER_TOOL], max_tokens=16
    )
    structured = await client.chat.completions.parse(
        model=model, messages=hi, response_format=Verdict, max_completion_tokens=64
    )
    thought = await client.chat.completions.create(model=model, messages=hi, max_tokens=64)
    # The legacy endpoint has no field for thinking: its text is the model's whole output.
    completion = await client.completions.create(
        model=model, prompt="Once upon", max_tokens=24, temperature=0
    )
    chunks = [
        chunk
        async for chunk in await client.completions.create(
            model=model, prompt="Once upon", max_tokens=24, temperature=0, stream=True
        )
    ]

    assert model == "tiny"
    assert with_tools.choices[0].finish_reason in ("length", "stop", "tool_calls")
    assert isinstance(structured.choices[0].message.parsed, Verdict)
    # It thinks, then answers: the thinking apart, as `reasoning_content`.
    message = thought.choices[0].message
    assert (message.model_extra or {}).get("reasoning_content") == TINY_THINKING
    assert message.content == TINY_ANSWER
    texts = [chunk.choices[0].text for chunk in chunks if chunk.choices]
    assert all(isinstance(text, str) for text in texts), texts
    assert not any((chunk.choices[0].model_extra or {}) for chunk in chunks if chunk.choices)
    assert completion.choices[0].text == "".join(texts) != ""  # thinking and all, each time


def test_no_model_writer_outlives_an_up_killed_while_it_writes_the_default_model(
    tmp_path: Path,
) -> None:
    # No model cache, as a new user has none: `up` starts teaching the model at once.
    env = {name: value for name, value in os.environ.items() if name != TINY_MODEL_CACHE_ENV}
    process = subprocess.Popen(
        [*UP_COMMAND, "--agents", "1", "--port", "0"],
        cwd=tmp_path,
        env={**env, TOKENIZER_CACHE_ENV: str(TOKENIZER_CACHE)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + EXIT_TIMEOUT_SECONDS
        writers: list[psutil.Process] = []
        while not writers and time.monotonic() < deadline:  # it starts before anything else
            time.sleep(0.05)  # polling: a child's start has no event
            writers = [
                child
                for child in psutil.Process(process.pid).children()
                if "spawn_main" in " ".join(child.cmdline())
            ]
        assert writers, "no model writer started"
        pidfds = {os.pidfd_open(writer.pid): writer.pid for writer in writers}
    finally:
        process.kill()
        process.wait()
    try:
        left = wait_all_exited(pidfds, EXIT_TIMEOUT_SECONDS)
    finally:
        for descriptor in pidfds:
            os.close(descriptor)
    assert not left, [" ".join(psutil.Process(pid).cmdline()) for pid in left]


BATCH_LINES = 40
BATCH_LINE_TOKENS = 40  # 2 s each: the batch outlasts the first stack's kill


async def started_batch(
    client: openai.AsyncOpenAI, count: int = BATCH_LINES, tokens: int = BATCH_LINE_TOKENS
) -> openai.types.Batch:
    """A batch of `count` chat requests of `tokens` each, created."""
    lines = [
        {
            "custom_id": f"req-{n}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": SYNTHETIC.model,
                "messages": [{"role": "user", "content": f"hello {n}"}],
                "max_tokens": tokens,
            },
        }
        for n in range(count)
    ]
    content = "".join(json.dumps(line) + "\n" for line in lines).encode()
    uploaded = await client.files.create(file=("in.jsonl", content), purpose="batch")
    return await client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )


async def completed_so_far(client: openai.AsyncOpenAI, batch_id: str) -> int:
    """The batch's requests completed, as last saved."""
    counts = (await client.batches.retrieve(batch_id)).request_counts
    return counts.completed if counts is not None else 0


async def ended_batch(client: openai.AsyncOpenAI, batch_id: str) -> tuple[str, list[str]]:
    """The batch's end: its status and its output's lines."""

    async def ended() -> bool:
        status = (await client.batches.retrieve(batch_id)).status
        return status in {"completed", "failed", "cancelled", "expired"}

    await wait_for(ended, within=120)
    finished = await client.batches.retrieve(batch_id)
    assert finished.error_file_id is None
    assert finished.output_file_id is not None
    return finished.status, (await client.files.content(finished.output_file_id)).text.splitlines()


def assert_each_request_once_and_exact(
    output: list[str], count: int = BATCH_LINES, tokens: int = BATCH_LINE_TOKENS
) -> None:
    replies = [json.loads(line) for line in output]
    assert [reply["custom_id"] for reply in replies] == [f"req-{n}" for n in range(count)]
    for n, reply in enumerate(replies):
        message = reply["response"]["body"]["choices"][0]["message"]["content"]
        assert message == synthetic_reply(f"hello {n}", tokens)


async def test_a_batch_completes_each_request_once_after_up_is_killed_with_sigkill_mid_batch(
    tmp_path: Path, openai_client: Callable[..., openai.AsyncOpenAI]
) -> None:
    arguments = ["--engine", "synthetic", "--agents", "1", "--port", "0"]
    env = {**UP_ENV, "SPOTGATE_GATEWAY_BATCH__LEASE_SECONDS": "3"}
    with running_up(tmp_path, arguments, env) as first:
        info = first.info
        client = openai_client(base_url=f"{info['gateway_url']}/v1", api_key=info["api_key"])
        batch = await started_batch(client)
        completed: list[int] = []

        async def some_finished() -> bool:
            completed[:] = [await completed_so_far(client, batch.id)]
            return completed[0] >= 5

        await wait_for(some_finished, within=60)
        first.process.kill()
        first.process.wait()

    with running_up(tmp_path, arguments, env) as second:
        # The first stack's key, and its batch, outlived it.
        url = f"{second.info['gateway_url']}/v1"
        client = openai_client(base_url=url, api_key=info["api_key"])
        status, output = await ended_batch(client, batch.id)

    assert completed[0] < BATCH_LINES  # the second stack ran the rest
    assert status == "completed"
    assert_each_request_once_and_exact(output)


async def test_a_batch_completes_each_request_once_across_a_spot_notice(
    tmp_path: Path, openai_client: Callable[..., openai.AsyncOpenAI]
) -> None:
    arguments = ["--engine", "synthetic", "--agents", "2", "--port", "0"]
    env = {**UP_ENV, "SPOTGATE_GATEWAY_BATCH__LEASE_SECONDS": "3"}
    count, tokens = 24, 200  # 10 s each: running on the agent when its notice comes
    with running_up(tmp_path, arguments, env) as up:
        info = up.info
        client = openai_client(base_url=f"{info['gateway_url']}/v1", api_key=info["api_key"])
        batch = await started_batch(client, count, tokens)

        async def some_finished() -> bool:
            return await completed_so_far(client, batch.id) >= 1

        await wait_for(some_finished, within=60)
        noticed = info["agents"][0]["agent_id"]  # both serve the batch's requests
        interrupt = [*UP_COMMAND[:-1], "pool", "interrupt", noticed, "--in", "10"]
        sent = await asyncio.to_thread(
            subprocess.run, interrupt, cwd=tmp_path, capture_output=True, text=True
        )
        assert sent.returncode == 0, sent.stderr
        left = count - await completed_so_far(client, batch.id)
        status, output = await ended_batch(client, batch.id)

    assert left > 0  # requests ran after the notice
    assert status == "completed"
    assert_each_request_once_and_exact(output, count, tokens)
