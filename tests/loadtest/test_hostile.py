"""The hostile input battery, at a small size: every row passes."""

from __future__ import annotations

from loadtest.hostile import render, run_battery


async def test_hostile_input_finds_no_crash_no_way_in_and_no_secret_in_the_logs() -> None:
    # A normal client's latency beside the attacks is measured at full size (`make chaos`); on
    # a shared machine each of its chats must be served, in whatever time the machine allows.
    rows = await run_battery(
        examples=10, slow_connections=5, guesses=25, other_client_seconds_max=None
    )
    failed = [f"{row.target}: {row.inputs}: {row.problems}" for row in rows if not row.passed]
    assert not failed, "\n".join(failed)
    inputs = " ".join(row.inputs for row in rows)
    for expected in ("ws frames", "HTTP bodies", "HTTP headers", "alg none", "HS256", "kid",
                     "retired", "API key", "Origin", "DNS rebinding", "slow senders", "never reads",
                     "operations port", "secrets in logs",
                     "disabled while its websocket stays open",
                     "cancelled, or their socket dropped", "invented token ids",
                     "past the 200000-character prompt limit",
                     "a 4-digit number in key B's system prompt",
                     "a rogue agent row"):  # fmt: skip
        assert expected in inputs
    assert all(row.tried > 0 for row in rows)
    assert "| pass |" in render(rows, examples=10)
