"""Fault scenarios on a local stack under steady traffic: nothing lost, recovery timed.

    python -m loadtest.chaos [--agents 3] [--streams 12] [--write docs/reliability.md]

    python -m loadtest.chaos --engine vllm [--write docs/reliability.md]

The stack is real processes: an AWS emulator (moto server, in this process so it can be
stopped and started), the gateway, and the pool manager with the `local` provider running
agents of the synthetic engine or of vLLM (the CPU build, with the generated tiny model),
the pool held at `--agents` (its minimum and its maximum). Websocket clients keep
`--streams` streams going, each a one-message chat in a session of its client, whose whole
reply is known in advance (the synthetic engine is deterministic; vLLM decodes greedily, and
each prompt's reply is first taken from an uninterrupted run), so every stream is
classified: exact (the full reply, byte for byte), resumed (exact, and served by more than
one agent), failed with a clear error code, or lost (it ended wrong or not at all); streams
that waited in the gateway's queue are counted too. Where a gateway stops under streams that
outlive its grace, OpenAI clients stream over SSE as well: each must end with `[DONE]`,
exact or after an error event. Each fault is injected into the
running stack; recovery is the time until the pool has its target of ready agents again,
none of them a faulted one (for a gateway restart: until the new gateway is ready and has
finished a stream; for a full pool: until the last stream of the surplus ended).
"""

from loadtest.chaos.faults import scenarios_for
from loadtest.chaos.run import run_all

__all__ = ["run_all", "scenarios_for"]
