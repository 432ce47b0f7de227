"""Token issue and verify rates, beside the raw Ed25519 sign/verify they are built on.

    python -m loadtest.bench.tokens [--runs 7] [--ops 3000] [--write docs/benchmarks.md]

Each run times `--ops` operations of each kind, one after another in this process; the table
gives operations per second (median and p1, the slow tail, over runs) and per-operation
latency (median and p99 over every operation), and the ratio of spotgate's rate to the raw
signature rate: what JWT encoding and claim checks cost on top of the cryptography.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from loadtest.bench.report import machine_facts, median, percentile, write_section
from spotgate.tokens import KeyRing, SigningKey, issue, verify

ISSUER = "https://gateway.bench"
COMMAND = "python -m loadtest.bench.tokens --write docs/benchmarks.md"


@dataclass(frozen=True)
class Result:
    """Rates and latencies of one operation over all runs."""

    name: str
    rates_per_second: list[float]
    latencies_seconds: list[float]

    @property
    def median_rate(self) -> float:
        """Median operations per second over runs."""
        return median(self.rates_per_second)


def measure(name: str, operation: Callable[[int], object], runs: int, ops: int) -> Result:
    """Time `ops` calls of `operation` per run, `runs` times."""
    rates, latencies = [], []
    for _ in range(runs):
        started = time.perf_counter()
        for index in range(ops):
            before = time.perf_counter()
            operation(index)
            latencies.append(time.perf_counter() - before)
        rates.append(ops / (time.perf_counter() - started))
    return Result(name, rates, latencies)


def run(runs: int, ops: int) -> list[Result]:
    """Measure raw Ed25519, token issue and token verify, interleaved per run."""
    ring = KeyRing([SigningKey.generate()])
    raw_key = Ed25519PrivateKey.generate()
    raw_public = raw_key.public_key()
    message = b"x" * 200  # about a token's signing input
    signature = raw_key.sign(message)
    now = time.time()
    tokens = [issue(ring, subject=f"k{i}", issuer=ISSUER, now=now).token for i in range(ops)]

    def raw_sign(_: int) -> object:
        return raw_key.sign(message)

    def raw_verify(_: int) -> object:
        raw_public.verify(signature, message)
        return None

    def issue_token(index: int) -> object:
        return issue(ring, subject=f"k{index}", issuer=ISSUER, now=now, models=["m"])

    def verify_token(index: int) -> object:
        return verify(ring, tokens[index], issuer=ISSUER, now=now)

    results: dict[str, Result] = {}
    for _ in range(runs):  # interleave, so drift on a noisy machine hits every column alike
        for name, operation in (
            ("Ed25519 sign (raw)", raw_sign),
            ("token issue", issue_token),
            ("Ed25519 verify (raw)", raw_verify),
            ("token verify", verify_token),
        ):
            one = measure(name, operation, 1, ops)
            seen = results.setdefault(name, Result(name, [], []))
            seen.rates_per_second.extend(one.rates_per_second)
            seen.latencies_seconds.extend(one.latencies_seconds)
    return list(results.values())


def render(results: list[Result], runs: int, ops: int) -> str:
    """The Markdown section for `docs/benchmarks.md`."""
    by_name = {result.name: result for result in results}
    baseline = {"token issue": "Ed25519 sign (raw)", "token verify": "Ed25519 verify (raw)"}
    lines = [
        "## Tokens: issue and verify (Ed25519 JWT)",
        "",
        f"Command: `{COMMAND}` ({runs} runs × {ops} operations, one core).",
        f"Machine: {machine_facts(['pyjwt', 'cryptography'])}.",
        "",
        "| operation | ops/s median | ops/s p1 (slowest runs) | latency p50 µs | latency p99 µs "
        "| vs raw signature |",
        "|---|---|---|---|---|---|",
    ]
    for result in results:
        base = baseline.get(result.name)
        ratio = f"{result.median_rate / by_name[base].median_rate:.2f}×" if base else "baseline"
        lines.append(
            f"| {result.name} | {result.median_rate:,.0f} "
            f"| {percentile(result.rates_per_second, 0.01):,.0f} "
            f"| {percentile(result.latencies_seconds, 0.5) * 1e6:.1f} "
            f"| {percentile(result.latencies_seconds, 0.99) * 1e6:.1f} | {ratio} |"
        )
    return "\n".join(lines)


def main() -> None:
    """Run the benchmark, print the table, and write it into the report if asked."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--ops", type=int, default=3000)
    parser.add_argument("--write", type=Path, help="report file to update")
    args = parser.parse_args()
    section = render(run(args.runs, args.ops), args.runs, args.ops)
    print(section)
    if args.write:
        write_section(args.write, "tokens", section)


if __name__ == "__main__":
    main()
