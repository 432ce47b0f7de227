"""The seeded sampler's cost per engine step: one pass over the batch beside a draw per row.

    python -m loadtest.bench.seeded_draw [--runs 5] [--steps 10] [--write docs/benchmarks.md]

A seeded, sampled stream's token is drawn by the agent's logits processor, not by vLLM
(gpu_agent/vllm_logits.py): every engine step pays it for each such stream in the batch. For
batches of 1, 8 and 32 seeded top-p streams (temperature 0.8, top-p 0.9) over Qwen3's
151,936-token vocabulary, each step's draw is timed two ways, alternately, `--runs` times of
`--steps` steps: *per row*, the draw the agent made before (each row alone: top-p with a
sort for top-p, and a generator seeded for its place drawing an exponential race over the
whole vocabulary), and *batched*, `seeded_draws` (one pass over the batch's rows: one sort,
one cumulative sum, one uniform number per row). One core; on a GPU the same code runs on
the logits' device.
"""

from __future__ import annotations

import argparse
import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch

from gpu_agent.seeded_sampling import SeededSampling, seeded_draws
from loadtest.bench.report import machine_facts, median, percentile, write_section

COMMAND = "python -m loadtest.bench.seeded_draw --write docs/benchmarks.md"
VOCABULARY = 151_936  # Qwen3's
BATCHES = (1, 8, 32)
SAMPLING = SeededSampling(
    seed=7, temperature=0.8, top_p=0.9, top_k=0, min_p=0.0, repetition_penalty=1.0
)
GOAL_MILLISECONDS = 1.0  # for 32 streams


def per_row_draw(logits: torch.Tensor, sampling: SeededSampling, place: int) -> int:
    """The baseline: the agent's draw before, for one row (an exponential race, own generator)."""
    scaled = logits / sampling["temperature"]
    if sampling["top_p"] < 1.0:
        ordered, order = torch.sort(scaled, descending=True)
        probs = torch.softmax(ordered, dim=-1)
        beyond = probs.cumsum(dim=-1) - probs >= sampling["top_p"]
        scaled = scaled.index_fill(0, order[beyond], float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    digest = hashlib.blake2b(f"{sampling['seed']}:{place}".encode(), digest_size=8).digest()
    generator = torch.Generator(device=probs.device).manual_seed(int.from_bytes(digest, "big") >> 1)
    race = torch.empty_like(probs).exponential_(generator=generator)
    return int((probs / race).argmax())


@dataclass
class Measured:
    """One batch size, every step of every run, both ways."""

    streams: int
    per_row_seconds: list[float] = field(default_factory=list)
    batched_seconds: list[float] = field(default_factory=list)


def _per_row(logits: torch.Tensor, place: int) -> list[int]:
    return [per_row_draw(row, SAMPLING, place) for row in logits]


def _timed(draw: Callable[[], object]) -> float:
    started = time.perf_counter()
    draw()
    return time.perf_counter() - started


def measure(streams: int, runs: int, steps: int, vocabulary: int) -> Measured:
    """Time each step's draw for `streams` rows, per row and batched, alternately."""
    generator = torch.Generator().manual_seed(streams)
    samplings = [SAMPLING] * streams
    measured = Measured(streams)
    for run in range(runs):
        for step in range(steps):
            logits = torch.randn(streams, vocabulary, generator=generator) * 4
            place = run * steps + step
            measured.per_row_seconds.append(_timed(partial(_per_row, logits, place)))
            batched = partial(seeded_draws, logits, samplings, [place] * streams)
            measured.batched_seconds.append(_timed(batched))
    return measured


def check_batch_invariance(vocabulary: int) -> None:
    """A row's batched draw is its draw alone: what makes a moved stream draw as unmoved."""
    logits = torch.randn(8, vocabulary, generator=torch.Generator().manual_seed(1)) * 4
    places = list(range(8))
    batched = seeded_draws(logits, [SAMPLING] * 8, places).tolist()
    alone = [
        int(seeded_draws(row.unsqueeze(0), [SAMPLING], [p])[0])
        for row, p in zip(logits, places, strict=True)
    ]
    if batched != alone:
        raise AssertionError(f"batched draws {batched} differ from each row's alone {alone}")


def render(results: Sequence[Measured], runs: int, steps: int, vocabulary: int) -> str:
    """The Markdown section for `docs/benchmarks.md`."""
    lines = [
        "## Seeded sampling: one pass over the batch beside a draw per row",
        "",
        f"Command: `{COMMAND}` ({runs} runs × {steps} steps per batch size, alternating, one "
        f"core; {vocabulary:,}-token vocabulary, every stream seeded with temperature "
        f"{SAMPLING['temperature']} and top-p {SAMPLING['top_p']}; each batched row checked "
        "equal to its draw alone).",
        f"Machine: {machine_facts(['torch'])}.",
        "",
        "| seeded streams in the step | per row ms (median) | per row p99 ms "
        "| batched ms (median) | batched p99 ms | per row / batched | µs per stream, batched |",
        "|---|---|---|---|---|---|---|",
    ]
    for result in results:
        per_row = median(result.per_row_seconds)
        batched = median(result.batched_seconds)
        lines.append(
            f"| {result.streams} | {per_row * 1e3:.2f} "
            f"| {percentile(result.per_row_seconds, 0.99) * 1e3:.2f} | {batched * 1e3:.2f} "
            f"| {percentile(result.batched_seconds, 0.99) * 1e3:.2f} | {per_row / batched:.1f}× "
            f"| {batched / result.streams * 1e6:.0f} |"
        )
    lines += [
        "",
        f"Goal: ≤ {GOAL_MILLISECONDS:g} ms a step for 32 seeded streams on a GPU. On one CPU "
        "core the step reads and writes the batch's logits a few times over (32 × 151,936 "
        "floats, 19 MB), which alone takes milliseconds: the CPU rows give the ratio, not "
        "the goal.",
    ]
    return "\n".join(lines)


def main() -> None:
    """Run the benchmark, print the table, and write it into the report if asked."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--vocabulary", type=int, default=VOCABULARY)
    parser.add_argument("--write", type=Path, help="report file to update")
    args = parser.parse_args()
    torch.set_num_threads(1)
    check_batch_invariance(args.vocabulary)
    results = [measure(streams, args.runs, args.steps, args.vocabulary) for streams in BATCHES]
    section = render(results, args.runs, args.steps, args.vocabulary)
    print(section)
    if args.write:
        write_section(args.write, "seeded-draw", section)


if __name__ == "__main__":
    main()
