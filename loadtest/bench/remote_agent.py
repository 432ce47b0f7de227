"""The time to first token an agent in another region adds: one agent, near and far.

One gateway and one agent on the synthetic engine (a fixed 50 ms TTFT: a capacity stand-in,
not a model). The gateway reaches the agent through a loopback TCP proxy that holds every
chunk for half a round trip each way: none (the agent in the gateway's region) or 32.5 ms
(us-east-1 to us-west-2, about 65 ms round trip). Runs alternate between the two on one warm
link; each run sends streams one after another on one client socket, TTFT taken at the client.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
from pydantic import SecretStr

from loadtest.bench.harness import BENCH_KEY, StreamSocket, bench_spec
from loadtest.bench.report import machine_facts, median, percentile, write_section
from loadtest.bench.workdir import logs_dir
from spotgate.process import loopback_socket, socket_port
from spotgate.settings import AgentSettings, GatewaySettings, SyntheticSettings, TokenSettings
from spotgate.tokens import SigningKey
from stack.builder import AgentProcess, GatewayReplica, LocalStack
from stack.children import GatewaySockets

MODEL = "synthetic"
AGENT_TTFT_SECONDS = 0.05
ROUND_TRIP_SECONDS = {"same region": 0.0, "another region (65 ms round trip)": 0.065}
READ_BYTES = 65536


class DelayProxy:
    """A loopback TCP proxy to `target_port` that holds each chunk half a round trip."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.one_way_seconds = 0.0
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[object]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def port(self) -> int:
        """Where it listens."""
        if self._server is None:
            raise RuntimeError("the proxy is not serving")
        return int(self._server.sockets[0].getsockname()[1])

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[DelayProxy]:
        """Listen for the life of the block."""
        self._server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        try:
            async with self._server:
                yield self
        finally:  # every connection ended and closed, both ways, before the block is left
            for writer in self._writers:
                writer.close()
            await asyncio.gather(*self._connections, return_exceptions=True)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._connections.add(task)
        self._writers.add(writer)
        upstream_reader, upstream_writer = await asyncio.open_connection(
            "127.0.0.1", self.target_port
        )
        self._writers.add(upstream_writer)
        await asyncio.gather(
            self._pump(reader, upstream_writer),
            self._pump(upstream_reader, writer),
            return_exceptions=True,
        )
        for each in (writer, upstream_writer):
            each.close()
            with contextlib.suppress(OSError):
                await each.wait_closed()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copy one direction, each chunk sent `one_way_seconds` after it arrived, in order."""
        held: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def send() -> None:
            while True:
                due, chunk = await held.get()
                if not chunk:
                    writer.close()
                    return
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                writer.write(chunk)
                await writer.drain()

        sender = asyncio.create_task(send())
        while chunk := await reader.read(READ_BYTES):
            held.put_nowait((time.monotonic() + self.one_way_seconds, chunk))
        held.put_nowait((time.monotonic(), b""))
        await sender


async def measure(runs: int, streams: int) -> dict[str, list[float]]:
    """TTFT of every stream, by where the agent is, over `runs` alternating runs each."""
    key = SigningKey.generate()
    sockets = GatewaySockets.bind()
    agent_socket = loopback_socket()
    proxy = DelayProxy(socket_port(agent_socket))
    ttfts: dict[str, list[float]] = {where: [] for where in ROUND_TRIP_SECONDS}
    async with proxy.serving():
        agent = AgentProcess(
            "agent-1",
            AgentSettings(
                agent_id="bench-agent-1",
                engine="synthetic",
                served_model_name=MODEL,
                synthetic=SyntheticSettings(ttft_seconds=AGENT_TTFT_SECONDS),
                pinned_public_key=key.verify_key.to_pem(),
                token_issuer=sockets.url,
                # The gateway reaches it only through the proxy.
                advertise_url=f"http://127.0.0.1:{proxy.port}",
                imds_url="http://127.0.0.1:9",
            ),
            agent_socket,
        )
        gateway = GatewayReplica(
            "gateway",
            GatewaySettings(
                public_url=sockets.url,
                token=TokenSettings(signing_key_pem=SecretStr(key.to_pem())),
                models=(MODEL,),
            ),
            sockets,
        )
        with logs_dir(None) as logs:
            spec = bench_spec(logs, [gateway], [agent])
            async with LocalStack(spec) as running, aiohttp.ClientSession() as http:
                api_key = running.keys[BENCH_KEY].api_key
                ws = await http.ws_connect(
                    f"{sockets.url.replace('http', 'ws', 1)}/v1/ws",
                    headers={"Authorization": f"Bearer {api_key}"},
                )
                client = StreamSocket(ws)
                await client.one_request(MODEL, "warm up", 2)  # the gateway's link is open
                for _ in range(runs):
                    for where, round_trip in ROUND_TRIP_SECONDS.items():
                        proxy.one_way_seconds = round_trip / 2
                        for n in range(streams):
                            ttft, _tokens, _chunks = await client.one_request(
                                MODEL, f"hello {n}", 4
                            )
                            ttfts[where].append(ttft)
                await client.close()
    return ttfts


def render(ttfts: dict[str, list[float]], args: argparse.Namespace) -> str:
    """The report section."""
    near = median(ttfts[next(iter(ROUND_TRIP_SECONDS))])
    rows = [
        f"| {where} | {median(values) * 1000:.1f} | {percentile(values, 0.99) * 1000:.1f} "
        f"| {(median(values) - near) * 1000:+.1f} |"
        for where, values in ttfts.items()
    ]
    return "\n".join(
        [
            "## Time to first token of an agent in another region (synthetic engine)",
            "",
            f"Command: `python -m loadtest.bench.remote_agent --runs {args.runs} --streams "
            f"{args.streams} --write docs/benchmarks.md` ({args.runs} alternating runs of "
            f"{args.streams} streams one after another per row; one gateway, one agent on the "
            f"synthetic engine with a fixed {AGENT_TTFT_SECONDS * 1000:.0f} ms TTFT, reached "
            "through a loopback proxy that holds each chunk half the round trip each way; TTFT "
            "at the client, over the gateway's already open link).",
            f"Machine: {machine_facts()}.",
            "",
            "| agent | TTFT median ms | TTFT p99 ms | added over the same region, ms |",
            "|---|---|---|---|",
            *rows,
            "",
            "A stream on an agent in another region waits one network round trip more for its "
            "first token: the request goes out, the token comes back, on the link the gateway "
            "keeps open to each agent. The tokens after it come at the same pace, each as late "
            "as the first. Hence routing's preference for the gateway's own region at equal load "
            "([Routing](gateway.md#routing)).",
        ]
    )


def main() -> None:
    """Run the benchmark; print the section, or write it into the report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--streams", type=int, default=40)
    parser.add_argument("--write", type=Path, help="the report to write the section into")
    args = parser.parse_args()
    section = render(asyncio.run(measure(args.runs, args.streams)), args)
    print(section)
    if args.write:
        write_section(args.write, "remote-agent", section)


if __name__ == "__main__":
    main()
