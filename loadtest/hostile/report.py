"""The battery's report: one row per class of input, and the table for docs/reliability.md."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from loadtest.bench.report import machine_facts
from loadtest.hostile.stack import SLOW_SENDER_TIMEOUT_SECONDS

COMMAND = "python -m loadtest.hostile --write docs/reliability.md"


@dataclass
class Row:
    """One line of the report: what was thrown at which service, and what came back."""

    target: str
    inputs: str
    tried: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def record(self, outcome: str, problem: str | None = None) -> None:
        """Count one input's outcome; a problem fails the row."""
        self.tried += 1
        self.outcomes[outcome] += 1
        if problem is not None:
            self.problems.append(problem)

    @property
    def passed(self) -> bool:
        """No input met a problem."""
        return not self.problems

    def cells(self) -> str:
        """`target | inputs | tried | outcome | result` cells of the report."""
        ranked = sorted(self.outcomes.items(), key=lambda item: (-item[1], item[0]))
        outcome = "; ".join([*(f"{n}× {what}" for what, n in ranked), *self.notes])
        result = "pass" if self.passed else f"**FAIL**: {self.problems[0][:200]}"
        return f"{self.target} | {self.inputs} | {self.tried} | {outcome} | {result}"


def render(rows: list[Row], examples: int) -> str:
    """The results table for `docs/reliability.md`."""
    lines = [
        "## Hostile input (local stack, synthetic engine)",
        "",
        f"Command: `{COMMAND}` ({examples} hypothesis examples per fuzzed class).",
        "The gateway and one synthetic agent run as processes logging JSON at debug level; the "
        "agent verifies tokens against the gateway's JWKS. Every 4xx must carry OpenAI's JSON "
        "error body (aiohttp's own plain 400 for a request beyond its parser limits — a header "
        "line over 8190 bytes, more than 128 headers, a repeated Host or Content-Type — never "
        "reaches spotgate), nothing may be a 5xx, a socket lives on after a bad frame (one "
        "over 64 KiB included: an error for its stream) or closes with 1009 (more than 1 MiB "
        "over) or 1007 (invalid UTF-8), and no log line may hold a secret. Failed "
        "authentications come "
        "from a new loopback address each, except where the row says otherwise. The stack runs "
        f"with {SLOW_SENDER_TIMEOUT_SECONDS:.0f} s keep-alive and body timeouts (defaults: 75 s "
        "and 30 s).",
        f"Machine: {machine_facts()}.",
        "",
        "| target | input | tried | outcome | result |",
        "|---|---|---|---|---|",
        *(f"| {row.cells().replace(chr(10), ' ')} |" for row in rows),
    ]
    return "\n".join(lines)
