"""The scenario table for docs/reliability.md, and the command line that writes it."""

from __future__ import annotations

from loadtest.bench.report import machine_facts
from loadtest.chaos.run import DEFAULT_AGENTS, DEFAULT_STREAMS, Outcome
from loadtest.chaos.stack import STREAM_TOKENS, SYNTHETIC, TOKENS_PER_SECOND, StackEngine

COMMAND = "python -m loadtest.chaos --write docs/reliability.md"
REPORT_TITLE = "# Reliability\n\nEach section names the command that produced it.\n"


VLLM_RECOVERY_NOTE = (
    " A replacement's recovery includes its engine's start (importing vLLM, loading the "
    "model, a first generation), here on the cores a busy engine is decoding on: minutes, "
    "where two replacements with no traffic to serve start in about one. Every engine runs "
    "with `VLLM_CPU_OMP_THREADS_BIND=nobind` and one OpenMP thread, so several share the "
    "cores."
)


def render(outcomes: list[Outcome], agents: int, streams: int, engine: StackEngine) -> str:
    """The scenario table for `docs/reliability.md`."""
    if engine.kind == "synthetic":
        title = "synthetic engine"
        replies = (
            f"stream one {STREAM_TOKENS}-token reply after another "
            f"({STREAM_TOKENS / TOKENS_PER_SECOND:.0f} s each)"
        )
    else:
        title = "vLLM CPU engine, tiny model"
        replies = (
            f"stream one greedy reply of up to {engine.stream_tokens} tokens after another, the "
            "same prompt each time (each client number's reply was first taken from an "
            "uninterrupted run)"
        )
    lines = [
        f"## Fault scenarios under steady traffic (local stack, {title})",
        "",
        f"Command: `{command(engine, agents, streams)}`.",
        f"The pool manager (local provider) holds the pool at {agents} agents (its minimum and "
        f"maximum), each taking {streams} streams at once; {streams} websocket clients, each in "
        f"a session of its own, {replies} through one of two gateways (half the clients each), "
        "which share the pool and a limit store. A client whose socket drops, or whose stream "
        "its gateway refuses as `going_away`, sends the stream again through the other gateway "
        "with `resume` (the ids and text it holds). The full pool's "
        f"surge adds {agents * streams} clients sending one stream each. *exact*: the whole "
        "reply, byte for byte; *resumed*: exact and served by two agents or gateways or more; "
        "*queued*: waited in the gateway's queue for an agent with room; *failed*: ended with "
        "an error frame (its code); *lost*: ended wrong or not at all. *Recovery*: fault to "
        "the pool back at its target with no faulted agent; for a gateway restart or kill, "
        "the fault to that gateway ready again after its clients' streams went on elsewhere; "
        "for the full pool, the surge's start to its last stream's end."
        + ("" if engine.kind == "synthetic" else VLLM_RECOVERY_NOTE),
        f"Machine: {machine_facts()}.",
        "",
        "| scenario | streams | exact | resumed | queued | failed | lost | recovery |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for outcome in outcomes:
        recovery = "—" if outcome.recovery_seconds is None else f"{outcome.recovery_seconds:.1f} s"
        lines.append(f"| {outcome.name} | {outcome.tally.row()} | {recovery} |")
    return "\n".join(lines)


def command(engine: StackEngine, agents: int, streams: int) -> str:
    """The command line that writes the table."""
    options = "" if engine is SYNTHETIC else f" --engine {engine.kind}"
    if (agents, streams) != (DEFAULT_AGENTS, DEFAULT_STREAMS):
        options += f" --agents {agents} --streams {streams}"
    return COMMAND.replace(" --write", f"{options} --write")
