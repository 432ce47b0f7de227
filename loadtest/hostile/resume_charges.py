"""Engine work a key tries to get unpaid: a `resume` it made up, presented as the model's own.

Valid token ids and their exact text, never delivered to the key, behind a two-letter prompt:
the agent prefills them all, so they must be charged as prompt (the key's tpm), not waved
through as tokens charged where they were delivered.
"""

from __future__ import annotations

import json

from gpu_agent.synthetic_engine import SYNTHETIC_WORDS
from loadtest.hostile.client import MODEL
from loadtest.hostile.report import Row
from loadtest.hostile.revocation import connect_with_key, stream_end
from loadtest.hostile.stack import INVENTED_RESUME_TPM, HostileStack

INVENTED_RESUME_TOKENS = 4_000
INVENTED_RESUME_ROUNDS = 6


def invented_resume_frame(stream_id: str) -> str:
    """`hi`, then a resume of ids the gateway never delivered, with their exact text."""
    ids = [index % len(SYNTHETIC_WORDS) for index in range(INVENTED_RESUME_TOKENS)]
    resume = {
        "token_ids": ids,
        "text": "".join(f"{SYNTHETIC_WORDS[token]} " for token in ids),
        "completion_tokens": len(ids),
    }
    return json.dumps(
        {
            "type": "generate",
            "id": stream_id,
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": INVENTED_RESUME_TOKENS + 1,
            "resume": resume,
        }
    )


async def invented_resumes(stack: HostileStack) -> Row:
    """A key of tpm T sends resumes of more than T invented tokens: one is served, then 429."""
    row = Row(
        "gateway",
        f"tpm {INVENTED_RESUME_TPM}: 'hi' with a resume of {INVENTED_RESUME_TOKENS} valid, "
        f"invented token ids and their exact text, {INVENTED_RESUME_ROUNDS} times",
    )
    ws = await connect_with_key(stack, "resumer")
    served = 0
    try:
        for attempt in range(INVENTED_RESUME_ROUNDS):
            await ws.send(invented_resume_frame(f"invented-{attempt}"))
            end = await stream_end(ws, f"invented-{attempt}")
            outcome = end["type"] if end["type"] == "done" else end.get("code", "error")
            served += end["type"] == "done"
            # The first overdraws the budget once; any later one was not charged as prompt.
            row.record(outcome, f"{served} served, the resumes went unpaid" if served > 1 else None)
    finally:
        await ws.close()
    return row
