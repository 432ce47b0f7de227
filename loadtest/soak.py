"""A long run of mixed traffic with periodic spot interruptions: nothing lost, nothing leaks.

    python -m loadtest.soak [--minutes 30] [--write docs/reliability.md]

On the fault scenarios' local stack (`loadtest.chaos`), websocket clients and OpenAI SSE
clients (`/v1/chat/completions` with `stream: true`) stream known replies, one after
another, while a token client trades the API key for a token (`POST /v1/token`) every
second, and every `--interrupt-every-seconds` the busiest agent gets a spot notice (the
pool replaces it, so agents rotate). Every stream is classified as in the fault scenarios.

RSS and open file descriptors of every process (the gateway, the pool manager, each agent
while it lives, and this process, which hosts the AWS emulator and the clients) are sampled
every few seconds. A growth trend is judged on processes that lived through the whole
judged window: the first third of the run is warm-up; the median of the last third must
stay within `RSS_GROWTH_LIMIT` and `FD_GROWTH_LIMIT` of the middle third's. The least-squares
slope over the judged window is reported alongside.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shlex
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

import aiohttp
import psutil

from loadtest.bench.report import machine_facts, write_section
from loadtest.chaos.faults import NOTICE_SECONDS, spot_notice
from loadtest.chaos.report import REPORT_TITLE
from loadtest.chaos.stack import (
    MODEL,
    READY_TIMEOUT_SECONDS,
    STREAM_TOKENS,
    TOKENS_PER_SECOND,
    ChaosStack,
    chaos_stack,
)
from loadtest.chaos.traffic import STREAM_TIMEOUT_SECONDS, Clients, Tally, Traffic

DEFAULT_MINUTES = 30.0
SAMPLE_SECONDS = 5.0
INTERRUPT_EVERY_SECONDS = 60.0
TOKEN_EVERY_SECONDS = 1.0
FAILED_REQUEST_PAUSE_SECONDS = 1.0
RSS_GROWTH_LIMIT = 0.10  # of the middle third's median RSS
FD_GROWTH_LIMIT = 16  # open descriptors more than the middle third's median
BYTES_PER_MB = 1024 * 1024
SELF_NAME = "this process (clients, AWS emulator)"
STEADY = "steady"
NOT_JUDGED = "not judged"


class SseTraffic(Clients):
    """`streams` OpenAI SSE clients, each streaming one known reply after another."""

    async def _client(self, number: int) -> None:
        headers = {
            "Authorization": f"Bearer {self._stack.api_key}",
            "X-Session-Id": f"sse-{number}",
        }
        timeout = aiohttp.ClientTimeout(total=STREAM_TIMEOUT_SECONDS)
        async with aiohttp.ClientSession(headers=headers, timeout=timeout) as http:
            count = 0
            while not self._stop.is_set():
                count += 1
                await self._one_stream(http, f"sse {number} stream {count}")

    async def _one_stream(self, http: aiohttp.ClientSession, content: str) -> None:
        body = {
            "model": MODEL,
            "max_tokens": STREAM_TOKENS,
            "stream": True,
            "messages": [{"role": "user", "content": content}],
        }
        self.tally.started += 1
        text: list[str] = []
        try:
            async with http.post(
                f"{self._stack.gateway_urls[0]}/v1/chat/completions", json=body
            ) as response:
                if response.status != 200:
                    error = (await response.json())["error"]
                    self.tally.failed[error["code"]] += 1
                    retry_after = float(response.headers.get("Retry-After", 0))
                    await asyncio.sleep(retry_after or FAILED_REQUEST_PAUSE_SECONDS)
                    return
                async for line in response.content:
                    data = line.decode().removeprefix("data: ").strip()
                    if not data or data == "[DONE]":
                        continue
                    chunk = json.loads(data)
                    if "error" in chunk:
                        self.tally.failed[chunk["error"]["code"]] += 1
                        return
                    for choice in chunk.get("choices", ()):
                        text.append(choice.get("delta", {}).get("content") or "")
        except (aiohttp.ClientError, TimeoutError, ValueError):
            self.tally.lost += 1  # cut off, unreadable or never ended
            await asyncio.sleep(FAILED_REQUEST_PAUSE_SECONDS)
            return
        # SSE does not say which agents served a stream: resumed ones count as exact only.
        self.tally.reply_ended(self._stack.expected_reply(content), "".join(text), moved=False)


@dataclass
class TokenTally:
    """Token requests by outcome."""

    issued: int = 0
    failed: Counter[str] = field(default_factory=Counter)


async def issue_tokens(stack: ChaosStack, tally: TokenTally, stop: asyncio.Event) -> None:
    """Trade the API key for a token every second until `stop`."""
    headers = {"Authorization": f"Bearer {stack.api_key}"}
    async with aiohttp.ClientSession(headers=headers) as http:
        while not stop.is_set():
            try:
                async with http.post(f"{stack.gateway_url}/v1/token") as response:
                    body = await response.json()
                    if response.status == 200 and body.get("token"):
                        tally.issued += 1
                    else:
                        tally.failed[str(response.status)] += 1
            except (aiohttp.ClientError, ValueError) as err:
                tally.failed[type(err).__name__] += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), TOKEN_EVERY_SECONDS)


async def interrupt_periodically(
    stack: ChaosStack, traffic: Traffic, every_seconds: float, stop: asyncio.Event
) -> int:
    """A spot notice to the busiest serving agent every `every_seconds`; how many were sent."""
    sent = 0
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every_seconds)
        if stop.is_set():
            return sent
        with contextlib.suppress(LookupError):  # no agent serving right now: skip this one
            await spot_notice(
                stack, traffic, await traffic.busiest_first(await stack.ready_agents())
            )
            sent += 1


@dataclass
class Samples:
    """One process's samples: seconds since the soak started, RSS bytes, open descriptors."""

    seconds: list[float] = field(default_factory=list)
    rss: list[int] = field(default_factory=list)
    fds: list[int] = field(default_factory=list)


def stack_processes(stack: ChaosStack) -> dict[str, psutil.Process]:
    """Name → process of everything the soak watches."""
    named = {SELF_NAME: psutil.Process()}
    for child in (*stack.gateways, stack.pool_manager):
        if child is not None:
            named[child.name] = psutil.Process(child.process.pid)
    named.update({f"agent {a}": p for a, p in stack.agent_processes().items()})
    return named


async def sample_periodically(
    stack: ChaosStack,
    samples: dict[str, Samples],
    started: float,
    every_seconds: float,
    stop: asyncio.Event,
) -> None:
    """Record every watched process's RSS and descriptors every `every_seconds` until `stop`."""
    while not stop.is_set():
        now = time.monotonic() - started
        for name, process in stack_processes(stack).items():
            with contextlib.suppress(psutil.Error):  # it exited between listing and reading
                rss, fds = process.memory_info().rss, process.num_fds()
                series = samples.setdefault(name, Samples())
                series.seconds.append(now)
                series.rss.append(rss)
                series.fds.append(fds)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every_seconds)


@dataclass(frozen=True)
class Verdict:
    """One process's memory and descriptors over the soak."""

    name: str
    rss_start_mb: float
    rss_end_mb: float
    fds_start: int
    fds_end: int
    judged: bool  # it lived through the judged window
    verdict: str = NOT_JUDGED  # STEADY or what grew, when judged
    slope_mb_per_minute: float = 0.0  # over the judged window, when judged


def judge(name: str, series: Samples, duration_seconds: float, every_seconds: float) -> Verdict:
    """Whether a process's RSS and descriptors grew over the last two thirds of the soak."""
    unjudged = Verdict(
        name=name,
        rss_start_mb=series.rss[0] / BYTES_PER_MB,
        rss_end_mb=series.rss[-1] / BYTES_PER_MB,
        fds_start=series.fds[0],
        fds_end=series.fds[-1],
        judged=False,
    )
    warm_up, last_third = duration_seconds / 3, 2 * duration_seconds / 3
    window = [i for i, t in enumerate(series.seconds) if t >= warm_up]
    middle = [i for i in window if series.seconds[i] < last_third]
    last = [i for i in window if series.seconds[i] >= last_third]
    lived_through = series.seconds[0] <= warm_up and series.seconds[-1] >= (
        duration_seconds - 2 * every_seconds
    )
    if not lived_through or not middle or not last:
        return unjudged
    rss_growth = (
        statistics.median(series.rss[i] for i in last)
        / statistics.median(series.rss[i] for i in middle)
        - 1
    )
    fd_growth = statistics.median(series.fds[i] for i in last) - statistics.median(
        series.fds[i] for i in middle
    )
    grew = []
    if rss_growth >= RSS_GROWTH_LIMIT:
        grew.append(f"RSS +{rss_growth:.0%}")
    if fd_growth >= FD_GROWTH_LIMIT:
        grew.append(f"FDs +{fd_growth:.0f}")
    slope = statistics.linear_regression(
        [series.seconds[i] / 60 for i in window], [series.rss[i] / BYTES_PER_MB for i in window]
    ).slope
    return replace(
        unjudged,
        judged=True,
        verdict=("grew: " + ", ".join(grew)) if grew else STEADY,
        slope_mb_per_minute=slope,
    )


@dataclass(frozen=True)
class SoakResult:
    """What a soak run saw."""

    minutes: float
    agents: int
    websocket: Tally
    sse: Tally
    tokens: TokenTally
    interruptions: int
    verdicts: list[Verdict]

    def verdict(self, name: str) -> str:
        """The verdict on one process by name."""
        return next(v.verdict for v in self.verdicts if v.name == name)


async def soak(
    minutes: float,
    agents: int,
    ws_streams: int,
    sse_streams: int,
    interrupt_every_seconds: float,
    sample_seconds: float,
) -> SoakResult:
    """Run mixed traffic with interruptions for `minutes`, sampling every process."""
    duration = minutes * 60
    async with chaos_stack(agents, agent_capacity=ws_streams + sse_streams) as stack:
        if await stack.wait_ready(set(), READY_TIMEOUT_SECONDS) is None:
            raise RuntimeError("the pool did not reach its target")
        websocket, sse, tokens = (
            Traffic(stack, ws_streams),
            SseTraffic(stack, sse_streams),
            TokenTally(),
        )
        samples: dict[str, Samples] = {}
        stop = asyncio.Event()
        started = time.monotonic()
        websocket.start()
        sse.start()
        background = [
            asyncio.create_task(issue_tokens(stack, tokens, stop)),
            asyncio.create_task(sample_periodically(stack, samples, started, sample_seconds, stop)),
        ]
        interrupting = asyncio.create_task(
            interrupt_periodically(stack, websocket, interrupt_every_seconds, stop)
        )
        await asyncio.sleep(duration)  # the soak's length: traffic runs meanwhile
        stop.set()
        interruptions = await interrupting
        await asyncio.gather(*background, websocket.stop(), sse.stop())
    verdicts = [judge(name, series, duration, sample_seconds) for name, series in samples.items()]
    return SoakResult(minutes, agents, websocket.tally, sse.tally, tokens, interruptions, verdicts)


def render(result: SoakResult, ws_streams: int, sse_streams: int, arguments: list[str]) -> str:
    """The soak section for `docs/reliability.md`; `arguments` as given on the command line."""
    command = shlex.join(["python", "-m", "loadtest.soak", *arguments])
    lines = [
        "## Soak: mixed traffic with spot interruptions (local stack, synthetic engine)",
        "",
        f"Command: `{command}` ({result.minutes:g} minutes).",
        f"The fault scenarios' stack with {result.agents} agents; {ws_streams} websocket "
        f"clients and {sse_streams} OpenAI SSE clients (`/v1/chat/completions`, "
        f"`stream: true`) each stream one {STREAM_TOKENS}-token reply after another "
        f"({STREAM_TOKENS / TOKENS_PER_SECOND:.0f} s each); a token request every "
        f"{TOKEN_EVERY_SECONDS:g} s; {result.interruptions} spot notices "
        f"({NOTICE_SECONDS:.0f} s deadline), each to the busiest agent, which the pool "
        "replaces. Outcomes as in the fault scenarios (SSE does not say which agents served "
        "a stream, so resumed SSE streams count as exact only).",
        f"Machine: {machine_facts()}.",
        "",
        "| traffic | streams | exact | resumed | queued | failed | lost |",
        "|---|---|---|---|---|---|---|",
        f"| websocket | {result.websocket.row()} |",
        f"| SSE | {result.sse.row()} |",
        "",
        f"Tokens issued: {result.tokens.issued}; failed: "
        + (", ".join(f"{n} {why}" for why, n in sorted(result.tokens.failed.items())) or "0")
        + ".",
        "",
        "RSS and open file descriptors, sampled every few seconds. The first third of the run "
        "is warm-up; a process is *steady* when the median of the last third is within "
        f"{RSS_GROWTH_LIMIT:.0%} (RSS) and {FD_GROWTH_LIMIT} descriptors of the middle "
        "third's. The slope is the least-squares fit of RSS over the last two thirds. Agents "
        "replaced during the window are not judged.",
        "",
        "| process | RSS start | RSS end | slope | FDs start | FDs end | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for v in (v for v in result.verdicts if v.judged):
        lines.append(
            f"| {v.name} | {v.rss_start_mb:.0f} MB | {v.rss_end_mb:.0f} MB | "
            f"{v.slope_mb_per_minute:+.2f} MB/min | {v.fds_start} | {v.fds_end} | {v.verdict} |"
        )
    if replaced := [v for v in result.verdicts if not v.judged]:
        ends = [v.rss_end_mb for v in replaced]
        fds = [v.fds_end for v in replaced]
        lines.append(
            f"| {len(replaced)} short-lived processes (replaced agents) | — | "
            f"{min(ends):.0f}–{max(ends):.0f} MB | — | — | {min(fds)}–{max(fds)} | {NOT_JUDGED} |"
        )
    return "\n".join(lines)


def main() -> None:
    """Run the soak and print (and optionally write) its section."""
    parser = argparse.ArgumentParser(description="spotgate soak test")
    parser.add_argument("--minutes", type=float, default=DEFAULT_MINUTES)
    parser.add_argument("--agents", type=int, default=3)
    parser.add_argument("--ws-streams", type=int, default=8)
    parser.add_argument("--sse-streams", type=int, default=4)
    parser.add_argument("--interrupt-every-seconds", type=float, default=INTERRUPT_EVERY_SECONDS)
    parser.add_argument("--sample-seconds", type=float, default=SAMPLE_SECONDS)
    parser.add_argument("--write", type=Path)
    args = parser.parse_args()
    result = asyncio.run(
        soak(
            args.minutes,
            args.agents,
            args.ws_streams,
            args.sse_streams,
            args.interrupt_every_seconds,
            args.sample_seconds,
        )
    )
    section = render(result, args.ws_streams, args.sse_streams, sys.argv[1:])
    print(section)
    if args.write:
        if not args.write.exists():
            args.write.write_text(REPORT_TITLE)
        write_section(args.write, "soak", section)
    if result.websocket.lost or result.sse.lost:
        raise SystemExit("streams were lost")


if __name__ == "__main__":
    main()
