"""What a key may still get after it should not have it.

Streams served on an open socket once the key is disabled, and tokens spent by ending streams
early (cancelled, or the socket dropped) that are never charged.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import websockets

from gateway.auth import KEY_CACHE_SECONDS
from loadtest.hostile.client import fresh_address, generate_frame, ws_url
from loadtest.hostile.report import Row
from loadtest.hostile.stack import ENDED_EARLY_TPM, HostileStack
from spotgate.registry import Registry

REVOCATION_SLACK_SECONDS = 5.0
ENDED_EARLY_MAX_TOKENS = 2000
ENDED_EARLY_ROUNDS = 60
FRAME_TIMEOUT_SECONDS = 10.0


async def connect_with_key(stack: HostileStack, key: str) -> websockets.ClientConnection:
    """A websocket to the gateway with one of the stack's keys, from an address of its own."""
    return await websockets.connect(
        ws_url(stack.gateway_url),
        additional_headers={"Authorization": f"Bearer {stack.keys[key].api_key}"},
        proxy=None,
        compression=None,
        close_timeout=2,
        local_addr=(fresh_address(), 0),
    )


async def _frame(ws: websockets.ClientConnection) -> dict[str, Any]:
    frame: dict[str, Any] = json.loads(await asyncio.wait_for(ws.recv(), FRAME_TIMEOUT_SECONDS))
    return frame


async def stream_end(ws: websockets.ClientConnection, stream_id: str) -> dict[str, Any]:
    """The frames of one stream, read up to its `done` or `error`; that last frame."""
    while True:
        frame = await _frame(ws)
        if frame.get("id") == stream_id and frame["type"] in ("done", "error"):
            return frame


async def disabled_key_on_an_open_socket(stack: HostileStack) -> Row:
    """A socket opened with a key, the key disabled: its next streams are refused within 10 s."""
    row = Row(
        "gateway",
        "a key disabled while its websocket stays open: streams sent on it every 0.5 s after",
    )
    ws = await connect_with_key(stack, "revoked")
    try:
        await ws.send(generate_frame("before"))
        before = await stream_end(ws, "before")
        row.record(f"before: {before['type']}", None if before["type"] == "done" else str(before))
        async with Registry.open(stack.emulator.settings()) as registry:
            await registry.disable_key(stack.keys["revoked"].record.key_id)
        disabled_at = time.monotonic()
        for attempt in range(int((KEY_CACHE_SECONDS + REVOCATION_SLACK_SECONDS) / 0.5)):
            await ws.send(generate_frame(f"after-{attempt}"))
            ended = await stream_end(ws, f"after-{attempt}")
            if ended["type"] == "error":
                took = time.monotonic() - disabled_at
                late = took > KEY_CACHE_SECONDS + REVOCATION_SLACK_SECONDS
                wrong = ended.get("code") != "unauthorized"
                row.record(
                    f"refused {ended.get('code')} {took:.1f} s after",
                    f"refused as {ended.get('code')}" if wrong else ("late" if late else None),
                )
                break
            row.record("served while cached")
            await asyncio.sleep(0.5)
        else:
            row.record("never refused", "the disabled key was still served")
    finally:
        await ws.close()
    return row


async def _ended_early(stack: HostileStack, stream_id: str, how: str) -> tuple[str, int]:
    """Start one stream, end it after its first tokens (`cancel`, or `drop` the socket)."""
    ws = await connect_with_key(stack, "early")
    try:
        await ws.send(generate_frame(stream_id, max_tokens=ENDED_EARLY_MAX_TOKENS))
        while True:
            frame = await _frame(ws)
            if frame["type"] == "error":
                return frame.get("code", "error"), 0
            if frame["type"] == "delta":
                if how == "cancel":
                    await ws.send(json.dumps({"type": "cancel", "id": stream_id}))
                    end = await stream_end(ws, stream_id)
                    return end["type"], frame.get("n", 0)
                return "dropped", frame.get("n", 0)
    finally:
        await ws.close()


async def streams_ended_early(stack: HostileStack) -> Row:
    """Streams cancelled or dropped after their first tokens still spend the key's tpm.

    What the client got before it was refused is at most its budget (and what refilled
    meanwhile) plus the one stream admitted last.
    """
    row = Row(
        "gateway",
        f"tpm {ENDED_EARLY_TPM}: streams of up to {ENDED_EARLY_MAX_TOKENS} tokens cancelled, or "
        "their socket dropped, after the first tokens",
    )
    received = 0
    started = time.monotonic()
    for attempt in range(ENDED_EARLY_ROUNDS):
        how = "cancel" if attempt % 2 == 0 else "drop"
        outcome, tokens = await _ended_early(stack, f"early-{attempt}", how)
        if outcome == "rate_limited":
            refilled = ENDED_EARLY_TPM * (time.monotonic() - started) / 60
            allowed = ENDED_EARLY_TPM + refilled + ENDED_EARLY_MAX_TOKENS
            row.notes.append(f"{received} tokens received over {attempt} streams, then 429")
            row.record(
                "rate_limited",
                None if received <= allowed else f"{received} tokens received, over {allowed:.0f}",
            )
            return row
        received += tokens
        row.record(f"{how}: {outcome}")
    row.record("never limited", f"{ENDED_EARLY_ROUNDS} streams ended early, none refused")
    return row
