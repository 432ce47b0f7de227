from __future__ import annotations

import argparse
import asyncio
import time

from loadtest.bench.remote_agent import ROUND_TRIP_SECONDS, DelayProxy, measure, render


async def test_the_proxy_holds_each_way_half_a_round_trip_and_keeps_the_order() -> None:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1024):
            writer.write(data)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    async with server, DelayProxy(server.sockets[0].getsockname()[1]).serving() as proxy:
        proxy.one_way_seconds = 0.05
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        started = time.monotonic()
        for part in (b"one ", b"two ", b"three"):
            writer.write(part)
        await writer.drain()
        echoed = b""
        while len(echoed) < len(b"one two three"):
            echoed += await reader.read(1024)
        elapsed = time.monotonic() - started
        writer.close()
        await writer.wait_closed()
    assert echoed == b"one two three"
    assert elapsed >= 2 * proxy.one_way_seconds  # a lower bound: no machine is faster


async def test_the_benchmark_times_streams_near_and_far_and_reports_the_difference() -> None:
    ttfts = await measure(runs=1, streams=2)
    assert {where: len(values) for where, values in ttfts.items()} == {
        where: 2 for where in ROUND_TRIP_SECONDS
    }
    section = render(ttfts, argparse.Namespace(runs=1, streams=2))
    for where in ROUND_TRIP_SECONDS:
        assert f"| {where} |" in section
