from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from cli.main import main
from spotgate.process import loopback_socket, socket_port
from spotgate.registry import (
    AgentRecord,
    AgentState,
    BootTimeline,
    Registry,
    UsageCounts,
    aws_session,
    minute_of,
)
from spotgate.settings import emulator_settings, settings_env
from stack.emulator import AwsEmulator
from stack.local import UP_FILE
from tests.support.agents import expected_text, wait_for
from tests.support.metrics import metric_value, scrape
from tests.support.wsclient import (
    connect,
    generate,
    receive,
    receive_to_end,
    run_streams,
    send,
    text_of,
)

SPOTGATE = [sys.executable, "-m", "cli"]
UP_FAILS_WITHIN_SECONDS = 300


def run(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None):
    return subprocess.run(
        [*SPOTGATE, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


UNSHOWN_WARNINGS = (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning)
"""Warnings Python does not print unless asked: a command's would not reach its stderr."""


def exit_status(args: list[str]) -> int:
    """`spotgate ARGS` run by `main` in this process: what it returns, or argparse's exit."""
    try:
        return main(args)
    except SystemExit as exited:
        assert isinstance(exited.code, int), exited.code
        return exited.code


def process_state() -> tuple[object, ...]:
    """What a command run in this process could leave changed: signal handlers, environment,
    logging."""
    root = logging.getLogger()
    handlers = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    return (*handlers, dict(os.environ), list(root.handlers), root.level)


class Spotgate:
    """`spotgate ARGS` run by `main` in this process, where `run` starts a process of its own
    (1.5 s of CPU each): its status, stdout and stderr, as `run` returns them. The environment
    and the directory are the test's (monkeypatch them)."""

    def __init__(self, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
        self._capfd = capfd
        self._caplog = caplog

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run it; fail on what a process of its own would also have printed on stderr, which
        pytest takes in-process (a warning Python shows by default, a log record at WARNING or
        above), and on anything it leaves changed for the worker's later tests."""
        self._capfd.readouterr()  # what came before is not the command's
        logged_before = len(self._caplog.records)
        before = process_state()
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")
            status = exit_status(list(args))
        out, err = self._capfd.readouterr()
        shown = [str(w.message) for w in warned if not issubclass(w.category, UNSHOWN_WARNINGS)]
        logged = [
            record.getMessage()
            for record in self._caplog.records[logged_before:]
            if record.levelno >= logging.WARNING
        ]
        assert (shown, logged) == ([], [])
        assert process_state() == before
        return subprocess.CompletedProcess([*SPOTGATE, *args], status, out, err)

    async def in_thread(self, *args: str) -> subprocess.CompletedProcess[str]:
        """The same from a test's event loop, which `main`'s own (`asyncio.run`) cannot run in."""
        return await asyncio.to_thread(self, *args)


@pytest.fixture
def spotgate(capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> Spotgate:
    """`spotgate ARGS` run in this process (`Spotgate`)."""
    return Spotgate(capfd, caplog)


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (["bogus"], "invalid choice"),
        (["keys", "create"], "--name"),
        (["keys", "create", "--name", "x", "--rpm", "0"], "must be at least 1"),
        (["keys", "create", "--name", "x", "--weight", "0"], "a number above 0 and at most 1000"),
        (["up", "--agents", "many"], "not a whole number"),
        (["up", "--regions", "us-east-1,"], "an empty region"),
        (["pool", "interrupt", "i-1", "--in", "-3"], "must be zero or more"),
        (["pool", "scale", "m", "-1"], "must be zero or more"),
        (["pool", "interrupt", "i-1"], "no interruption queue"),
        (["loadtest", "--url", "http://127.0.0.1:9"], "--api-key"),
        (["loadtest", "--cancel-share", "2"], "must be between 0 and 1"),
        (["sim"], "--traces"),
        (["sim", "--traces", "/no/such/dir"], "no such directory of spot traces"),
        (["sim", "--traces", ".", "--policy", "magic"], "unknown policy"),
        (["sim", "--traces", ".", "--tick", "0"], "must be more than zero"),
        (["sim", "--traces", ".", "--on-demand-refusal-rate", "2"], "must be between 0 and 1"),
        (["sim", "--traces", ".", "--stream-seconds", "0"], "must be more than zero"),
        (
            ["model", "tiny", "--out", "/no/such/out", "--tokenizer", "llama2", "--reply", "Hi"],
            "no chat template",
        ),
        (["model", "tiny-adapter", "--base", "/no/such/model", "--out", "x"], "holds no model"),
    ],
)
def test_bad_input_exits_2_with_one_line(args: list[str], reason: str, spotgate: Spotgate) -> None:
    # In this process, through the `main` the console script runs (the console script's own
    # way in is the test below).
    result = spotgate(*args)
    assert result.returncode == 2
    assert reason in one_line(result.stderr)


def test_bad_input_to_the_console_command_exits_2_with_one_line() -> None:
    # `python -m cli` runs `cli.run`, as the console script does. In a process of its own:
    # `up` past its checks would start a whole stack, with its signal handlers, its logging and
    # its event loop.
    result = run("up", "--regions", "us-east-1,us-west-9")
    assert result.returncode == 2
    assert "no EC2 region is called us-west-9" in one_line(result.stderr)


def test_sim_prints_one_json_object_per_policy_with_the_documented_fields(
    spotgate: Spotgate,
) -> None:
    traces = Path(__file__).parents[2] / "pool_manager" / "sim" / "traces" / "aws-16node-3zone"
    args = ["sim", "--traces", str(traces), "--windows", "1", "--window-hours", "3", "--json"]
    single = json.loads(spotgate(*args).stdout)
    assert single["policy"] == "spotgate"
    both = json.loads(spotgate(*args, "--policy", "spotgate,on-demand-only").stdout)
    assert [r["policy"] for r in both] == ["spotgate", "on-demand-only"]
    for result in [single, *both]:
        assert 0 <= result["availability"] <= 1
        assert result["cost_vs_on_demand"] > 0
        for field in ("preemptions", "launches", "lost_streams"):
            assert isinstance(result[field], int)
    table = spotgate("sim", "--traces", str(traces), "--windows", "1", "--window-hours", "3")
    assert table.returncode == 0
    assert table.stdout.splitlines()[1].startswith("spotgate")


def test_sim_streams_that_outlive_the_notice_are_resumed_elsewhere(spotgate: Spotgate) -> None:
    traces = Path(__file__).parents[2] / "pool_manager" / "sim" / "traces" / "aws-16node-3zone"
    day = ["sim", "--traces", str(traces), "--windows", "1", "--window-hours", "24", "--json"]
    short = json.loads(spotgate(*day).stdout)  # 60 s streams end within the 2-minute notice
    long = json.loads(spotgate(*day, "--stream-seconds", "1800").stdout)
    assert short["preemptions"] == long["preemptions"] > 0
    assert short["streams_resumed"] == 0
    assert long["streams_resumed"] > 0
    assert long["lost_streams"] == 0  # the margin had room for every one of them


def test_sim_refuses_a_cold_starts_file_it_cannot_read(tmp_path: Path, spotgate: Spotgate) -> None:
    traces = Path(__file__).parents[2] / "pool_manager" / "sim" / "traces" / "aws-16node-3zone"
    bad = tmp_path / "boots.json"
    for content, reason in (("{}", "needs at least one"), ('[{"agent_id": "x"}]', "not a list")):
        bad.write_text(content)
        result = spotgate("sim", "--traces", str(traces), "--cold-starts", str(bad))
        assert result.returncode == 2
        assert reason in one_line(result.stderr)


def test_bad_settings_are_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spotgate: Spotgate
) -> None:
    monkeypatch.setenv("SPOTGATE_REGISTRY__AGENT_TTL_SECONDS", "-5")
    monkeypatch.chdir(tmp_path)
    result = spotgate("keys", "list")
    assert result.returncode == 2
    assert "agent_ttl_seconds" in one_line(result.stderr)


@pytest.fixture
async def tables(aws: AwsEmulator) -> AwsEmulator:
    async with Registry.open(aws.settings()) as registry:
        await registry.create_tables()
    return aws


def use_emulator(aws: AwsEmulator, directory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Commands run in this process from now on act on `aws`, from `directory`."""
    for name, value in settings_env(aws.settings()).items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(directory)


async def test_keys_create_list_disable_from_the_environment(
    tables: AwsEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spotgate: Spotgate
) -> None:
    use_emulator(tables, tmp_path, monkeypatch)

    created = await spotgate.in_thread(
        "keys", "create", "--name", "ci", "--rpm", "60", "--models", "a,b", "--max-streams", "3",
        "--tenant", "acme",
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    api_key = one_line(created.stdout)
    key_id = api_key.split("-")[1]
    async with Registry.open(tables.settings()) as registry:
        record = await registry.verify_key(api_key)
    assert (record.name, record.rpm, record.models) == ("ci", 60, frozenset({"a", "b"}))
    assert (record.max_streams, record.tenant) == (3, "acme")

    listed = await spotgate.in_thread("keys", "list")
    assert listed.returncode == 0
    assert key_id in listed.stdout
    assert "max_streams=3" in listed.stdout
    assert "tenant=acme" in listed.stdout
    assert api_key.split("-", 2)[2] not in listed.stdout + listed.stderr

    assert (await spotgate.in_thread("keys", "disable", key_id)).returncode == 0
    assert "disabled" in (await spotgate.in_thread("keys", "list")).stdout

    bad_tenant = await spotgate.in_thread("keys", "create", "--name", "x", "--tenant", "a b")
    assert bad_tenant.returncode == 2
    assert "--tenant" in one_line(bad_tenant.stderr)

    missing = await spotgate.in_thread("keys", "disable", "000000000000")
    assert missing.returncode == 2
    assert "no API key" in one_line(missing.stderr)


async def test_keys_usage_sums_each_key_and_model_over_the_window(
    tables: AwsEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spotgate: Spotgate
) -> None:
    use_emulator(tables, tmp_path, monkeypatch)
    async with Registry.open(tables.settings()) as registry:
        busy = (await registry.create_key("busy")).record.key_id
        idle = (await registry.create_key("idle")).record.key_id
        now = minute_of(time.time())
        for minute, counts in ((now, UsageCounts(10, 20, 1)), (now - 600, UsageCounts(1, 2, 1))):
            await registry.add_usage(busy, "tiny", minute, counts, f"w{minute}")
        await registry.add_usage(busy, "tiny", now - 2 * 86400, UsageCounts(99, 99, 9), "old")
        await registry.add_usage(idle, "other", now, UsageCounts(5, 0, 1, flex_tokens=5), "idle")

    every = await spotgate.in_thread("keys", "usage")
    assert every.returncode == 0, every.stderr
    header, *rows = every.stdout.splitlines()
    assert header.split() == ["key_id", "name", "model", "streams", "prompt_tokens",
                              "completion_tokens", "flex_tokens"]  # fmt: skip
    assert sorted(row.split() for row in rows) == sorted(
        [[busy, "busy", "tiny", "2", "11", "22", "0"], [idle, "idle", "other", "1", "5", "0", "5"]]
    )
    one = await spotgate.in_thread("keys", "usage", busy, "--since", "7d")
    assert one.stdout.splitlines()[1:] == [f"{busy}  busy  tiny  11  110  121  0"]
    bad = await spotgate.in_thread("keys", "usage", "--since", "yesterday")
    assert bad.returncode == 2
    assert "not a duration like 90m, 24h or 7d" in one_line(bad.stderr)


async def test_pool_boots_tells_cold_boots_from_warm_starts(
    tables: AwsEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spotgate: Spotgate
) -> None:
    booted = BootTimeline(instance_start=1000.0, agent_start=1010.0, engine_loaded=1030.0)
    async with Registry.open(tables.settings(), clock=lambda: 1040.0) as registry:
        for agent_id in ("i-cold", "i-warm"):
            await registry.register(
                AgentRecord(
                    agent_id,
                    "http://10.0.0.1:8000",
                    "m",
                    AgentState.READY,
                    8,
                    region="us-west-2",
                    zone="us-west-2b",
                    boot=booted,
                )
            )
        await registry.record_warm_boot("i-warm")
    use_emulator(tables, tmp_path, monkeypatch)

    listed = {
        boot["agent_id"]: boot
        for boot in json.loads((await spotgate.in_thread("pool", "boots", "--json")).stdout)
    }

    assert (listed["i-cold"]["kind"], listed["i-cold"]["cold_start_seconds"]) == ("cold", 40.0)
    assert (listed["i-warm"]["kind"], listed["i-warm"]["warm_start_seconds"]) == ("warm", 40.0)
    assert "cold_start_seconds" not in listed["i-warm"]  # no reader of cold starts takes it
    assert (listed["i-cold"]["region"], listed["i-cold"]["zone"]) == ("us-west-2", "us-west-2b")
    table = (await spotgate.in_thread("pool", "boots")).stdout.splitlines()
    assert table[0].split()[:5] == ["AGENT", "KIND", "TYPE", "REGION", "ZONE"]
    assert sorted(row.split()[1] for row in table[1:]) == ["cold", "warm"]
    assert {row.split()[3] for row in table[1:]} == {"us-west-2"}


def test_unreachable_aws_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spotgate: Spotgate
) -> None:
    monkeypatch.setenv("SPOTGATE_AWS__ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("SPOTGATE_AWS__ACCESS_KEY_ID", "x")
    monkeypatch.setenv("SPOTGATE_AWS__SECRET_ACCESS_KEY", "x")
    monkeypatch.chdir(tmp_path)
    result = spotgate("keys", "list")
    assert result.returncode == 4
    assert "AWS request failed" in one_line(result.stderr)


def test_up_on_a_taken_port_is_one_line_and_starts_nothing(tmp_path: Path) -> None:
    # In a process of its own: `up` sets up its logging and its SIGINT before it finds the
    # port taken, and on a free one it would start a whole stack.
    with loopback_socket() as taken:
        port = socket_port(taken)
        result = run("up", "--engine", "synthetic", "--port", str(port), cwd=tmp_path)
    assert result.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in one_line(result.stderr)
    assert "--port" in result.stderr
    assert not (tmp_path / UP_FILE).exists()


def test_up_whose_agent_cannot_start_says_why_in_one_line_and_stops(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    # As a new user mistypes a `vllm serve` flag: the agent's engine refuses it. Given for the
    # model (its own serving, through the pool manager to its agent), over the one the
    # environment gives every agent.
    env = {**os.environ, "SPOTGATE_AGENT_VLLM__ENGINE_ARGS": "--seed 1"}
    up = ["up", "--model", str(tiny_model_dir), "--engine-args=--no-such-flag 1"]
    result = subprocess.run(
        [*SPOTGATE, *up, "--agents", "1", "--port", "0"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=UP_FAILS_WITHIN_SECONDS,  # its verdict, not the 600 s start timeout
        check=False,
    )

    assert result.returncode == 2
    line = one_line(result.stderr)
    assert "agent local-1 could not start" in line
    assert "--no-such-flag" in line
    assert not (tmp_path / UP_FILE).exists()


@pytest.fixture
def spotgate_up(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    up = ["up", "--engine", "synthetic", "--agents", "2", "--gateways", "2", "--port", "0"]
    up += ["--regions", "us-east-1,us-west-2"]
    process = subprocess.Popen(
        [*SPOTGATE, *up],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    yield process, line
    if process.poll() is None:  # the test failed before stopping it
        process.terminate()  # `up` stops what it started; a kill would leave its children running
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def serving_agent(info: dict[str, Any]) -> str:
    """The one agent of `spotgate up` generating a stream now, by its own metrics."""
    async with Registry.open(emulator_settings(info["aws_endpoint_url"], info["region"])) as r:
        agents = await r.list_ready(info["model"])
    busy = [
        agent.agent_id
        for agent in agents
        if metric_value(await scrape(f"{agent.url}/metrics"), "spotgate_agent_active_streams")
    ]
    assert len(busy) == 1, busy
    return busy[0]


async def test_up_runs_gateways_and_agents_and_stops_cleanly(
    spotgate_up: tuple[subprocess.Popen[str], str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    spotgate: Spotgate,
    openai_client: Callable[..., openai.AsyncOpenAI],
) -> None:
    process, line = spotgate_up
    monkeypatch.chdir(tmp_path)  # `spotgate …` run in this process act on this stack
    up_file = tmp_path / UP_FILE
    assert line.startswith("spotgate ready: gateway=http://127.0.0.1:"), line + (
        process.stderr.read() if process.stderr and process.poll() is not None else ""
    )
    info = json.loads(up_file.read_text())
    assert up_file.stat().st_mode & 0o777 == 0o600
    assert f"key={info['api_key']}" in line
    assert len(info["agents"]) == 2
    # `--regions`: the pool places in both regions' zones; its agents say which they run in.
    boots = json.loads((await spotgate.in_thread("pool", "boots", "--json")).stdout)
    assert len(boots) == 2
    assert all(boot["zone"] in ("us-east-1a", "us-east-1b") for boot in boots), boots
    assert {boot["region"] for boot in boots} == {"us-east-1"}
    first, second = info["gateways"]
    assert first == info["gateway_url"]
    assert second != first  # `--port 0`: each replica on a port of its own
    assert line.strip().endswith(f"replicas={second}")
    ops_urls = info["ops_urls"]  # readiness is on each replica's operations port
    assert len(set(ops_urls)) == 2
    assert not set(ops_urls) & {first, second}

    client = openai_client(
        base_url=f"{info['gateway_url']}/v1", api_key=info["api_key"], max_retries=0
    )
    reply = await client.chat.completions.create(
        model=info["model"], messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert len((reply.choices[0].message.content or "").split()) == 4

    # `spotgate keys …` run from the same directory act on this stack.
    created = await spotgate.in_thread("keys", "create", "--name", "second", "--rpm", "1")
    assert created.returncode == 0, created.stderr
    # The replicas share one limit store: the key's one request a minute, whichever is asked.
    limited_key = next(word for word in created.stdout.split() if word.startswith("sg-"))
    statuses = []
    async with aiohttp.ClientSession() as http:

        async def both_shared() -> bool:  # a store call slower than 2 s (a loaded machine)
            for ops in ops_urls:  # leaves a replica on its own limits for a moment
                async with http.get(f"{ops}/readyz") as ready:
                    if (await ready.json())["limits"] != "shared":
                        return False
            return True

        await wait_for(both_shared, within=30)
        for url in (first, second):
            async with http.post(
                f"{url}/v1/chat/completions",
                headers={"Authorization": f"Bearer {limited_key}"},
                json={
                    "model": info["model"],
                    "messages": [{"role": "user", "content": "x"}],
                    "max_tokens": 1,
                },
            ) as response:
                statuses.append(response.status)
    assert statuses == [200, 429]
    async with aiohttp.ClientSession() as http:
        for ops in ops_urls:  # decided in the store, not by a replica alone
            async with http.get(f"{ops}/readyz") as ready:
                assert (await ready.json())["limits"] == "shared"
    listed = (await spotgate.in_thread("keys", "list")).stdout
    assert "  dev  " in listed
    assert "  second  " in listed

    # Each replica names itself in `ws_url`: one token issuer, no public URL shared.
    async with aiohttp.ClientSession() as http:
        for url in (first, second):
            headers = {"Authorization": f"Bearer {info['api_key']}"}
            async with http.post(f"{url}/v1/token", headers=headers) as response:
                assert (await response.json())["ws_url"] == f"ws{url[4:]}/v1/ws"
    # A key's own concurrency, set from the command line, holds over both replicas.
    narrow = await spotgate.in_thread("keys", "create", "--name", "narrow", "--max-streams", "1")
    narrow_key = next(word for word in narrow.stdout.split() if word.startswith("sg-"))
    async with connect(f"ws{first[4:]}/v1/ws", narrow_key) as held:
        await send(held, generate("held", info["model"], max_tokens=2_000))
        assert (await receive(held))["type"] == "start"
        async with connect(f"ws{second[4:]}/v1/ws", narrow_key) as other:
            refused = await run_streams(other, generate("more", info["model"], max_tokens=3))
        await send(held, {"type": "cancel", "id": "held"})
    assert (refused["more"][-1]["code"], refused["more"][-1]["message"]) == (
        "rate_limited",
        "at most 1 concurrent streams",
    )

    # The pool manager runs the agents: status lists them, an interruption replaces one.
    status = await spotgate.in_thread("pool", "status")
    assert status.returncode == 0, status.stderr
    rows = [line.split() for line in status.stdout.splitlines()[1:] if line.startswith("local-")]
    assert sorted((r[0], r[2], r[3]) for r in rows) == [
        ("local-1", "ready", "spot"),
        ("local-2", "ready", "spot"),
    ]
    # A spot notice with time to spare moves a stream before its agent breaks it: a stream of
    # 20 s (50 tokens/s), and the agent serving it interrupted with 24 s to the deadline. The
    # agent polls its IMDS every 5 s and the deadline is to the second, so it hears of it with
    # 18–24 s left: past its 15 s margin by too little for the stream's rest, and enough for
    # the move.
    reply_tokens, content = 1000, "go on"
    async with connect(f"ws{first[4:]}/v1/ws", info["api_key"]) as ws:
        await send(ws, generate("moved", info["model"], content=content, max_tokens=reply_tokens))
        frames = [await receive(ws)]
        while frames[-1]["type"] != "delta":
            frames.append(await receive(ws))
        serving = await serving_agent(info)
        interrupted = await spotgate.in_thread("pool", "interrupt", serving, "--in", "24")
        assert interrupted.returncode == 0, interrupted.stderr
        await receive_to_end(ws, frames)
    assert frames[-1]["type"] == "done", frames[-1]
    assert text_of(frames) == expected_text(content, reply_tokens)
    assert len({f["agent"] for f in frames if f["type"] == "start"}) == 2  # moved once
    exposition = await scrape(f"{ops_urls[0]}/metrics")
    assert metric_value(exposition, "spotgate_gateway_early_moves_total") == 1

    async def replaced() -> bool:
        async with Registry.open(emulator_settings(info["aws_endpoint_url"], info["region"])) as r:
            ready = {a.agent_id for a in await r.list_ready(info["model"])}
        return ready == {"local-1", "local-2", "local-3"} - {serving}

    await wait_for(replaced, within=90)  # its deadline, then a fresh agent's boot
    again = await client.chat.completions.create(
        model=info["model"], messages=[{"role": "user", "content": "still"}], max_tokens=3
    )
    assert len((again.choices[0].message.content or "").split()) == 3
    scaled = await spotgate.in_thread("pool", "scale", info["model"], "3")
    assert scaled.stdout.strip() == f"{info['model']}: agent count fixed at 3"
    assert "agent count fixed at 3" in (await spotgate.in_thread("pool", "status")).stdout

    # Every agent's boot, phase by phase, and the simulator replays them as cold starts.
    boots = json.loads((await spotgate.in_thread("pool", "boots", "--json")).stdout)
    assert {boot["agent_id"] for boot in boots} >= {"local-1", "local-2", "local-3"}
    for boot in boots:
        phases = boot["phases_seconds"]
        assert 0 < phases["agent_start"] <= phases["engine_loaded"] <= phases["ready"]
        assert boot["cold_start_seconds"] == phases["ready"]
    assert "ENGINE_LOADED s" in (await spotgate.in_thread("pool", "boots")).stdout
    observed = tmp_path / "boots.json"
    observed.write_text(json.dumps(boots))
    traces = Path(__file__).parents[2] / "pool_manager" / "sim" / "traces" / "aws-16node-3zone"
    replay = ["sim", "--traces", str(traces), "--cold-starts", str(observed), "--json"]
    replayed = await spotgate.in_thread(*replay, "--windows", "1", "--window-hours", "3")
    assert replayed.returncode == 0, replayed.stderr
    assert json.loads(replayed.stdout)["availability"] > 0

    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=120) == 0
    assert not up_file.exists()
    logs = tmp_path / ".spotgate" / "logs"
    for name in ("agent-local-2.log", "agent-local-3.log"):  # the agents stopped with the stack
        assert "drained; leaving" in (logs / name).read_text()


async def test_a_model_is_staged_to_each_regions_bucket_under_one_prefix(
    aws: AwsEmulator,
    tiny_model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    shared = aws.settings()
    buckets = {"models-east": "us-east-1", "models-west": "us-west-2"}
    for bucket, region in buckets.items():
        async with aws_session(shared.in_region(region).aws).client(
            "s3", endpoint_url=aws.url
        ) as s3:
            where = {} if region == "us-east-1" else {"LocationConstraint": region}
            await s3.create_bucket(Bucket=bucket, CreateBucketConfiguration=where)
    for name, value in settings_env(shared).items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    stage = ["model", "stage", str(tiny_model_dir), "--prefix", "tiny"]
    two_buckets = [*stage, "--bucket", "models-east", "--bucket", "models-west"]
    assert await asyncio.to_thread(main, two_buckets) == 0
    out = capsys.readouterr().out
    assert "SPOTGATE_AGENT_MODEL=s3://models-east/tiny " in out
    for bucket, region in buckets.items():
        assert f"s3://{bucket}/tiny: " in out
        async with aws_session(shared.in_region(region).aws).client(
            "s3", endpoint_url=aws.url
        ) as s3:
            listed = await s3.list_objects_v2(Bucket=bucket, Prefix="tiny/")
        assert "tiny/spotgate-model.json" in {o["Key"] for o in listed["Contents"]}
