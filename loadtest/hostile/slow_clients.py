"""Slow senders (slowloris) and a client that never reads, while a normal client is timed."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections import Counter
from contextlib import suppress

import aiohttp
import psutil
import websockets

from loadtest.hostile.client import (
    REQUEST_TIMEOUT_SECONDS,
    chat_body,
    fresh_address,
    generate_frame,
    ws_url,
)
from loadtest.hostile.report import Row
from loadtest.hostile.stack import FLOOD_MAX_TOKENS, SLOW_SENDER_TIMEOUT_SECONDS, TOKENS_PER_SECOND

TIMEOUT_SLACK_SECONDS = 3.0
FLOOD_STREAMS = 16
FLOOD_SECONDS = 8.0
FLOOD_ENDINGS = frozenset({"timeout", "length"})
"""How an unread stream may end: stopped for its unread backlog, or finished."""
MAX_RSS_GROWTH_MB = 150.0
MAX_OTHER_CLIENT_SECONDS = 5.0
RSS_SAMPLE_SECONDS = 0.25


async def slow_headers(host: str, port: int) -> float | None:
    """Send a request's headers one byte a second; seconds until the server hangs up."""
    reader, writer = await asyncio.open_connection(host, port, local_addr=(fresh_address(), 0))
    started = time.monotonic()
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    closed = asyncio.ensure_future(reader.read())
    try:
        while time.monotonic() - started < SLOW_SENDER_TIMEOUT_SECONDS + TIMEOUT_SLACK_SECONDS:
            done, _ = await asyncio.wait({closed}, timeout=1.0)
            if done:
                return time.monotonic() - started
            writer.write(b"a")
    except ConnectionError:
        return time.monotonic() - started
    else:
        return None
    finally:
        closed.cancel()
        writer.close()


async def slow_body(host: str, port: int, path: str, credential: str) -> tuple[float, bytes]:
    """Send headers promising 1000 bytes and one byte a second; seconds and the answer."""
    reader, writer = await asyncio.open_connection(host, port, local_addr=(fresh_address(), 0))
    started = time.monotonic()
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {credential}\r\n"
        "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{".encode()
    )
    answer = asyncio.ensure_future(reader.read(4096))
    try:
        while time.monotonic() - started < SLOW_SENDER_TIMEOUT_SECONDS + TIMEOUT_SLACK_SECONDS:
            done, _ = await asyncio.wait({answer}, timeout=1.0)
            if done:
                return time.monotonic() - started, answer.result()
            writer.write(b" ")
        return time.monotonic() - started, b""
    except ConnectionError:
        return time.monotonic() - started, b""
    finally:
        answer.cancel()
        writer.close()


def held_up(served: list[float], seconds_max: float | None) -> bool:
    """Whether a normal chat took longer than `seconds_max` (None: any time will do)."""
    return seconds_max is not None and max(served) > seconds_max


async def normal_latencies(url: str, headers: dict[str, str], stop: asyncio.Event) -> list[float]:
    """Short chats one after another until `stop`; each one's seconds (inf if it failed)."""
    latencies = []
    async with aiohttp.ClientSession() as session:
        while not stop.is_set():
            started = time.monotonic()
            try:
                async with session.post(
                    f"{url}/v1/chat/completions", data=chat_body(), headers=headers
                ) as reply:
                    await reply.read()
                    ok = reply.status == 200
            except aiohttp.ClientError:
                ok = False
            latencies.append(time.monotonic() - started if ok else float("inf"))
            await asyncio.sleep(0.1)
    return latencies


async def slowloris(
    target: str,
    url: str,
    credential: str,
    connections: int,
    other_client_seconds_max: float | None = MAX_OTHER_CLIENT_SECONDS,
) -> Row:
    """Many header-dripping and body-stalling connections while a normal client is timed."""
    row = Row(
        target,
        f"slow senders: {connections} connections sending headers at 1 byte/s, "
        f"{connections} sending a body at 1 byte/s",
    )
    host, port = url.removeprefix("http://").split(":")
    stop = asyncio.Event()
    normal = asyncio.ensure_future(
        normal_latencies(url, {"Authorization": f"Bearer {credential}"}, stop)
    )
    path = "/v1/chat/completions"
    # Both kinds at once: the server holds every slow connection together, and the attack
    # takes one timeout, not one per kind.
    header_times, body_results = await asyncio.gather(
        asyncio.gather(*(slow_headers(host, int(port)) for _ in range(connections))),
        asyncio.gather(*(slow_body(host, int(port), path, credential) for _ in range(connections))),
    )
    stop.set()
    latencies = await normal
    limit = SLOW_SENDER_TIMEOUT_SECONDS + TIMEOUT_SLACK_SECONDS
    for seconds in header_times:
        if seconds is None:
            row.record("headers: still open", f"a header dripper outlived {limit:.0f} s")
        else:
            row.record(f"headers: closed by the server after {round(seconds)} s")
    for seconds, answer in body_results:
        status = answer.split(b"\r\n", 1)[0].decode(errors="replace")
        json_error = b'"error"' in answer
        label = f"body: {status or 'no answer'}{' (JSON error)' if json_error else ''}"
        ok = status.endswith("408 Request Timeout") and json_error and seconds < limit
        row.record(f"{label} after {round(seconds)} s", None if ok else f"body: {label}")
    served = [seconds for seconds in latencies if seconds != float("inf")]
    failed = len(latencies) - len(served)
    if served:
        row.notes.append(
            f"meanwhile {len(served)} normal chats: median "
            f"{statistics.median(served) * 1000:.0f} ms, max {max(served) * 1000:.0f} ms"
        )
    if failed or not served or held_up(served, other_client_seconds_max):
        row.problems.append(f"normal chats during the attack: {failed} failed, {served[-3:]}")
    return row


async def never_reads(
    target: str,
    url: str,
    credential: str,
    pid: int,
    other_client_seconds_max: float | None = MAX_OTHER_CLIENT_SECONDS,
) -> Row:
    """Long streams on a socket nobody reads: the server's memory stays bounded."""
    row = Row(
        target,
        f"a client that never reads: {FLOOD_STREAMS} streams of up to "
        f"{FLOOD_MAX_TOKENS:,} tokens at {TOKENS_PER_SECOND:,.0f} tokens/s each",
    )
    process = psutil.Process(pid)
    baseline = process.memory_info().rss
    peak = baseline
    stop = asyncio.Event()
    headers = {"Authorization": f"Bearer {credential}"}
    async with websockets.connect(
        ws_url(url),
        additional_headers=headers,
        max_queue=1,
        proxy=None,
        compression=None,
        close_timeout=1,
        ping_interval=None,
    ) as ws:
        for n in range(FLOOD_STREAMS):
            await ws.send(generate_frame(f"flood-{n}", FLOOD_MAX_TOKENS))
        normal = asyncio.ensure_future(normal_latencies(url, headers, stop))
        started = time.monotonic()
        while time.monotonic() - started < FLOOD_SECONDS:
            peak = max(peak, process.memory_info().rss)
            await asyncio.sleep(RSS_SAMPLE_SECONDS)  # sampling memory, not synchronising
        stop.set()
        latencies = await normal
        growth_mb = (peak - baseline) / 1e6
        ends: Counter[str] = Counter()
        with suppress(TimeoutError, websockets.ConnectionClosed):
            async with asyncio.timeout(REQUEST_TIMEOUT_SECONDS):
                while sum(ends.values()) < FLOOD_STREAMS:
                    frame = json.loads(await ws.recv())
                    if frame["type"] in ("done", "error"):
                        ends[frame.get("code") or frame.get("finish_reason") or "?"] += 1
    row.record(
        f"peak RSS growth {growth_mb:.0f} MB",
        None if growth_mb < MAX_RSS_GROWTH_MB else f"RSS grew {growth_mb:.0f} MB",
    )
    row.notes.append(
        f"reading afterwards for up to {REQUEST_TIMEOUT_SECONDS:.0f} s: "
        + (
            ", ".join(f"{n}× ended {why}" for why, n in ends.items())
            or "streams still going (paused while unread)"
        )
    )
    served = [seconds for seconds in latencies if seconds != float("inf")]
    if served:
        row.notes.append(
            f"another client meanwhile: {len(served)} chats, max {max(served) * 1000:.0f} ms"
        )
    if len(served) != len(latencies) or not served or held_up(served, other_client_seconds_max):
        row.problems.append(f"another client was held up: {latencies[-3:]}")
    refused = sorted(why for why in ends if why not in FLOOD_ENDINGS)
    if refused:
        row.problems.append(f"flood streams were refused, not streamed: {', '.join(refused)}")
    return row
