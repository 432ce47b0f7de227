"""The client's longest wait across a move: today's move, make-before-break, and a kill -9.

    python -m loadtest.bench.move_gap [--runs 3] [--prompt-tokens 1000 4000 8000]
                                      [--reply-tokens 1200] [--modes today early kill]
                                      [--burner]
                                      [--cache .cache/tokenizers] [--write docs/benchmarks.md]

Two agents running vLLM's CPU engine, each pinned to a CPU and polling an IMDS emulator of
its own, serve a tiny model on Qwen3's tokenizer behind two gateways: one with
`queue.move_before_break=false` (*today's move*: the draining agent ends the stream with
`interrupted`, and the next agent prefills the whole conversation before the client's next
token) and one with the default (*make-before-break*: the draining agent says `moving` and
streams on at its own pace while the stream's continuation warms the next agent in rounds;
the stream switches at the last round's first token). Each run streams one greedy reply to a
fresh conversation of each context length, and once the reply is going, the serving agent
gets a spot notice whose deadline it cannot make; the gateways take turns run by run. A
third mode gives no notice: the serving agent and its engine are SIGKILLed (a machine gone),
and the stream resumes through the make-before-break gateway on the other agent, which
prefills the whole conversation. The client records each delta's arrival: the largest gap
across the move over the stream's median gap before the notice (or kill) is the figure.
Each moved reply is checked against the same conversation's unmoved reply, which gives the
time the move added to the reply too, and the gateway's early-move counters are read.
`--burner` runs it all beside a process per CPU that keeps that CPU busy.

A drained agent exits, as on EC2 (a killed one is gone at once): after each run a fresh one
(its own IMDS emulator, a new agent id) takes its CPU before the unmoved reference streams.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp

from gpu_agent.drain import HANDBACK_MARGIN_SECONDS
from loadtest.bench.conversations import WORDS
from loadtest.bench.harness import (
    BENCH_KEY,
    Server,
    bench_spec,
    cpu_burners,
    metric_value,
    metrics_text,
    wait_ready,
)
from loadtest.bench.move_gap_figures import (
    ACTIVE_STREAMS,
    AGENT_TTFT,
    CONTEXT_TOKENS,
    CONVERSATION_TURN_WORDS,
    EARLY,
    GATEWAY_COUNTERS,
    IMDS_POLL_SECONDS,
    KILLED,
    LATE_FACTOR,
    LONG_PROMPT_LIMITS,
    MAX_MODEL_LEN,
    MODE_FLAGS,
    MODEL_POSITIONS,
    MODES,
    NOTICE_AFTER_TOKENS,
    REPLY_TOKENS,
    TODAY,
    TOKENIZER,
    MoveRun,
    StreamRecord,
    first_difference,
    imds_poll_seconds,
    move_figures,
    move_window_seconds,
    notice_deadline_seconds,
    stream_timeout_seconds,
    window_seconds,
)
from loadtest.bench.move_gap_report import render, summary
from loadtest.bench.move_pool import Pool, Slot
from loadtest.bench.report import publish
from loadtest.bench.routing_modes import HIT_COUNTER, QUERIED_COUNTER, progress
from loadtest.bench.routing_stack import (
    MODEL_HIDDEN_SIZE,
    MODEL_LAYERS,
    SERVED_NAME,
    gateway_replica,
    gateway_server,
    placement,
    wait_for_agents,
)
from loadtest.bench.workdir import add_logs_option, logs_dir, print_log_tails, scratch_dir
from spotgate.settings import RoutingSettings
from spotgate.tokens import SigningKey
from stack.builder import LocalStack
from stack.children import GatewaySockets

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


Interrupt = Callable[[StreamRecord], Coroutine[Any, Any, None]]
"""What befalls the serving agent once the reply runs at its pace: a spot notice, or SIGKILL."""


async def stream(
    http: aiohttp.ClientSession,
    gateway: Server,
    messages: list[dict[str, str]],
    reply_tokens: int,
    interrupt: Interrupt | None = None,
) -> StreamRecord:
    """One greedy stream, its deltas timed; `interrupt` befalls its serving agent mid-reply."""
    record = StreamRecord()
    notice: asyncio.Task[None] | None = None
    url = gateway.url.replace("http://", "ws://") + "/v1/ws"
    async with (
        asyncio.timeout(stream_timeout_seconds(reply_tokens)),
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
                if interrupt and notice is None and len(record.ids) >= NOTICE_AFTER_TOKENS:
                    record.notice_at = now
                    notice = asyncio.create_task(interrupt(record))
            elif kind == "done":
                record.done_at = now
                record.prompt_tokens = int(frame["usage"]["prompt_tokens"])
                break
            elif kind == "error":
                record.error = f"{frame.get('code')}: {frame.get('message')}"
                break
    if notice is not None:
        await notice
    return record


async def _serving(http: aiohttp.ClientSession, pool: Pool, record: StreamRecord) -> Slot:
    """The stream's serving agent: the one streaming (the client's `start` names a handle)."""
    streaming = [
        slot
        for slot in pool.slots
        if metric_value(await metrics_text(http, slot.agent.url), ACTIVE_STREAMS) > 0
    ]
    if len(streaming) != 1:
        raise RuntimeError(f"{len(streaming)} agents are streaming; one was expected")
    record.served_by = streaming[0].agent_id
    return streaming[0]


async def _kill(http: aiohttp.ClientSession, pool: Pool, record: StreamRecord) -> None:
    """The serving agent and its engine are SIGKILLed: no notice, no drain."""
    pool.kill(await _serving(http, pool, record))


async def _notify(
    http: aiohttp.ClientSession,
    pool: Pool,
    reply_tokens: int,
    window: float,
    record: StreamRecord,
) -> None:
    """The serving agent's IMDS announces an interruption it cannot stream past."""
    slot = await _serving(http, pool, record)
    decoding = record.delta_times[-1] - record.delta_times[0]
    rate = (len(record.ids) - record.delta_tokens[0]) / decoding
    remaining_seconds = (reply_tokens - len(record.ids)) / rate
    if remaining_seconds < LATE_FACTOR * window:
        raise RuntimeError(
            f"the reply's rest takes {remaining_seconds:.1f} s at {rate:.0f} tokens/s: too "
            f"close to the move's {window:g} s window; raise --reply-tokens"
        )
    record.notice_in_seconds = notice_deadline_seconds(window, HANDBACK_MARGIN_SECONDS)
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
    notice_seconds: float | None = None,
) -> MoveRun:
    """A stream moved (on a notice, or its agent killed); then its unmoved reference."""
    gateway = gateways[EARLY if mode == KILLED else mode]
    messages = conversation(seed, prompt_tokens, tokenizer)
    before = await _counters(http, gateway)
    agents_before = {slot.agent_id: await _agent_counters(http, slot.agent) for slot in pool.slots}
    interrupt = (
        partial(_kill, http, pool)
        if mode == KILLED
        else partial(
            _notify,
            http,
            pool,
            reply_tokens,
            move_window_seconds(prompt_tokens, notice_seconds, HANDBACK_MARGIN_SECONDS),
        )
    )
    moved = await stream(http, gateway, messages, reply_tokens, interrupt)
    if moved.error is not None:
        raise RuntimeError(f"{mode}: the moved stream failed: {moved.error}")
    if len({agent for _, agent, _ in moved.starts}) < 2:
        raise RuntimeError(f"{mode}: the stream did not move: {moved.starts}")
    after = await _counters(http, gateway)
    if moved.served_by is None:
        raise RuntimeError(f"{mode}: the serving agent was not interrupted")
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
    # The reference streams once the drained agent's CPU has a fresh agent: no agent's start
    # shares the machine with it, as none did with the moved stream.
    fresh = await pool.replace(drained)
    for each in gateways.values():
        await wait_for_agents(http, each, len(pool.slots))
    reference = await stream(http, gateway, messages, reply_tokens)
    if reference.error is not None:
        raise RuntimeError(f"{mode}: the reference stream failed: {reference.error}")
    progress(f"{mode}: moved from {drained.agent_id} to {next_agent.agent_id}; {fresh.agent_id} up")
    figures = move_figures(moved)
    return MoveRun(
        mode=mode,
        context=prompt_tokens,
        figures=figures,
        differs_at=first_difference(moved.ids, reference.ids),
        reply_tokens=len(moved.ids),
        prompt_tokens=moved.prompt_tokens,
        counters={name: after[name] - before[name] for name in GATEWAY_COUNTERS},
        next_agent_queried=queried,
        next_agent_hit=hit,
        next_agent_streams=streams,
        next_agent_ttft_sum=ttft_sum,
        reference_seconds=reference.reply_seconds,
        reference_window_seconds=window_seconds(reference, figures.window),
    )


async def measure(
    gateways: dict[str, Server],
    pool: Pool,
    runs: int,
    contexts: Sequence[int],
    reply_tokens: int,
    tokenizer: Any,
    modes: Sequence[str] = MODES,
    notice_seconds: float | None = None,
) -> list[MoveRun]:
    """Per context length, `runs` rounds of one run per mode, the order alternating."""
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
        for round_, prompt_tokens in itertools.product(range(runs), contexts):
            for mode in modes if round_ % 2 == 0 else reversed(modes):
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
                    notice_seconds,
                )
                progress(f"{summary(run)} ({time.perf_counter() - run_started:.0f} s)")
                results.append(run)
        return results


@contextlib.asynccontextmanager
async def move_stack(
    model: Path, logs: Path, cpus: Sequence[int], imds_poll_seconds: float = IMDS_POLL_SECONDS
) -> AsyncIterator[tuple[dict[str, Server], Pool]]:
    """The AWS emulator, the two gateways, and an agent (and IMDS emulator) per CPU."""
    key = SigningKey.generate()
    sockets = {name: GatewaySockets.bind() for name in (TODAY, EARLY)}
    issuer = sockets[EARLY].url  # replicas behind one load balancer
    skew = RoutingSettings().prefix_load_skew
    gateways = {
        name: gateway_replica(
            key,
            issuer,
            name,
            each,
            skew,
            move_before_break=name == EARLY,
            limits=LONG_PROMPT_LIMITS,
        )
        for name, each in sockets.items()
    }
    async with LocalStack(bench_spec(logs, gateways.values())) as running:
        pool = Pool(running, model, key, issuer, imds_poll_seconds)
        try:
            for cpu in cpus:
                await pool.start(cpu)
            api_key = running.keys[BENCH_KEY].api_key
            yield (
                {name: gateway_server(running, name, r, api_key) for name, r in gateways.items()},
                pool,
            )
        finally:
            pool.close()


async def measure_on_stack(
    model: Path, logs: Path, cpus: Sequence[int], args: argparse.Namespace, tokenizer: Any
) -> list[MoveRun]:
    """Start the stack, run both gateways' moves on it, stop it."""
    poll = imds_poll_seconds(args.notice_seconds)
    async with move_stack(model, logs, cpus, poll) as (gateways, pool):
        return await measure(
            gateways,
            pool,
            args.runs,
            args.prompt_tokens,
            args.reply_tokens,
            tokenizer,
            [MODE_FLAGS[flag] for flag in args.modes],
            args.notice_seconds,
        )


def write_model(scratch: Path, cache: Path) -> Path:
    """The benchmark's tiny model under `scratch`, its positions raised for the longest context."""
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
    """Run each mode's moves in alternating rounds and print (and optionally write) them."""
    from transformers import AutoTokenizer

    from gpu_agent.tiny_model import DEFAULT_TOKENIZER_CACHE

    parser = argparse.ArgumentParser(description="the client's gap across a move")
    parser.add_argument("--runs", type=int, default=3, help="runs per mode and context")
    parser.add_argument("--prompt-tokens", type=int, nargs="+", default=list(CONTEXT_TOKENS))
    parser.add_argument("--reply-tokens", type=int, default=REPLY_TOKENS)
    parser.add_argument("--modes", nargs="+", choices=MODE_FLAGS, default=list(MODE_FLAGS))
    parser.add_argument("--burner", action="store_true", help="beside a busy process per CPU")
    parser.add_argument(
        "--notice-seconds",
        type=float,
        help="the notice this far ahead (AWS: 120), polled as deployed",
    )
    parser.add_argument("--cache", type=Path, default=DEFAULT_TOKENIZER_CACHE)
    parser.add_argument("--write", type=Path)
    parser.add_argument("--section", help="its section's name (default: by --burner)")
    add_logs_option(parser)
    args = parser.parse_args()
    if max(args.prompt_tokens) + args.reply_tokens > MAX_MODEL_LEN:
        parser.error(f"prompt and reply must fit in {MAX_MODEL_LEN} tokens")
    if args.notice_seconds is not None and args.notice_seconds <= HANDBACK_MARGIN_SECONDS:
        parser.error(
            f"a notice must come more than the drain's {HANDBACK_MARGIN_SECONDS:g} s ahead"
        )
    started = time.perf_counter()
    cpus, where = placement(2, sorted(os.sched_getaffinity(0)))
    with scratch_dir() as scratch, logs_dir(args.logs) as logs:
        model = write_model(scratch, args.cache)
        tokenizer = AutoTokenizer.from_pretrained(model)
        try:
            with cpu_burners(len(cpus) if args.burner else 0):
                results = asyncio.run(measure_on_stack(model, logs, cpus, args, tokenizer))
        except (RuntimeError, TimeoutError, aiohttp.ClientError):
            print_log_tails(logs)
            raise
    default = "move-gap-aws-notice" if args.notice_seconds is not None else "move-gap"
    name = args.section or (f"{default}-burner" if args.burner else default)
    publish(render(results, args, where), name, args.write, started)


if __name__ == "__main__":
    main()
