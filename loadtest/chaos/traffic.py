"""Steady traffic: websocket clients streaming known replies, each stream's outcome tallied.

Each client keeps the ids and text of its stream (`want_ids`), and when its socket drops
(its gateway stopped or was killed), or its gateway refuses a stream as `going_away`, it
sends the stream again through the next gateway, with `resume` once it holds part of it, as a
client of the websocket protocol can: no stream ends with its gateway.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp
import websockets

from loadtest.bench.harness import metric_value
from loadtest.chaos.stack import StackEngine

STREAM_TIMEOUT_SECONDS = 90.0
METRICS_TIMEOUT_SECONDS = 2.0
ACTIVE_STREAMS_SAMPLE = "spotgate_agent_active_streams"
RECONNECT_PAUSE_SECONDS = 0.5
FAILED_STREAM_PAUSE_SECONDS = 1.0  # after an error without `retry_after`, as a client would


async def active_streams(agent_url: str) -> float:
    """Streams an agent is generating now, by its own metrics (0 while it does not answer)."""
    timeout = aiohttp.ClientTimeout(total=METRICS_TIMEOUT_SECONDS)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as http,
            http.get(f"{agent_url}/metrics") as reply,
        ):
            return metric_value(await reply.text(), ACTIVE_STREAMS_SAMPLE)
    except (aiohttp.ClientError, TimeoutError):
        return 0.0


@dataclass
class Tally:
    """Streams by outcome."""

    started: int = 0
    exact: int = 0
    resumed: int = 0
    queued: int = 0  # streams that waited in the gateway's queue, whatever their outcome
    failed: Counter[str] = field(default_factory=Counter)
    lost: int = 0

    def reply_ended(self, expected: str, text: str, moved: bool) -> bool:
        """Count a reply that ended normally (exact or lost); whether it was exact."""
        if text != expected:
            self.lost += 1
            return False
        self.exact += 1
        self.resumed += moved
        return True

    def failed_text(self) -> str:
        """The failed streams by code, e.g. `2 going_away, 1 no_capacity`."""
        return ", ".join(f"{n} {code}" for code, n in sorted(self.failed.items())) or "0"

    def row(self) -> str:
        """`streams | exact | resumed | queued | failed | lost` cells of the report."""
        return (
            f"{self.started} | {self.exact} | {self.resumed} | {self.queued} | "
            f"{self.failed_text()} | {self.lost}"
        )


class TrafficStack(Protocol):
    """What clients need of a stack: its gateways, a key, and the replies its agents give.

    A `ChaosStack` is one; so is a stack `spotgate up` runs, read from its `up.json`.
    """

    @property
    def api_key(self) -> str:
        """A key the clients stream with."""

    @property
    def gateway_urls(self) -> Sequence[str]:
        """Every gateway replica, clients move along them when one goes."""

    @property
    def engine(self) -> StackEngine:
        """What the agents run: the model, a stream's length, the prompts."""

    def generate_frame(
        self, stream_id: str, prompt: str, session: str, max_tokens: int | None = None
    ) -> dict[str, Any]:
        """A `generate` frame for one stream."""

    def expected_reply(self, prompt: str, max_tokens: int | None = None) -> str:
        """The whole reply a stream of `prompt` must deliver."""


class Clients:
    """`streams` concurrent clients run as tasks until stopped; subclasses say what each does."""

    def __init__(self, stack: TrafficStack, streams: int, tally: Tally | None = None) -> None:
        self._stack = stack
        self._streams = streams
        self.tally = tally if tally is not None else Tally()
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        """Start every client."""
        self._tasks = [asyncio.create_task(self._client(n)) for n in range(self._streams)]

    async def stop(self) -> None:
        """Let each client finish its stream in flight, then stop."""
        self._stop.set()
        await self.finished()

    async def finished(self) -> None:
        """Wait for every client to end."""
        await asyncio.gather(*self._tasks)

    async def _client(self, number: int) -> None:
        raise NotImplementedError


class Traffic(Clients):
    """`streams` websocket clients, each streaming one known reply after another.

    Client `n` sends its streams in session `{name}-{n}`, so they stick to one agent while it
    serves; `rounds` caps the streams each client sends (None: until `stop`); `max_tokens`:
    their length (None: the engine's); `gateway`: the one every client starts on (None:
    spread over them, as a load balancer would).
    """

    def __init__(
        self,
        stack: TrafficStack,
        streams: int,
        *,
        name: str = "client",
        rounds: int | None = None,
        tally: Tally | None = None,
        max_tokens: int | None = None,
        gateway: int | None = None,
    ) -> None:
        super().__init__(stack, streams, tally)
        self._name = name
        self._rounds = rounds
        self._max_tokens = max_tokens
        self._gateway = gateway
        self.replying = asyncio.Event()
        self.completed = asyncio.Event()  # set by every exact stream; clear it to await one

    @staticmethod
    async def busiest_first(ready: dict[str, str]) -> dict[str, str]:
        """`ready`, the agents with the most streams in flight first (as each one counts them).

        A client's `start` frame names no agent, only a handle of its own stream.
        """
        counts = await asyncio.gather(*(active_streams(url) for url in ready.values()))
        ranked = sorted(zip(ready.items(), counts, strict=True), key=lambda pair: -pair[1])
        return dict(item for item, _count in ranked)

    def _goes_on(self, sent: int) -> bool:
        return not self._stop.is_set() and (self._rounds is None or sent < self._rounds)

    async def _client(self, number: int) -> None:
        headers = {"Authorization": f"Bearer {self._stack.api_key}"}
        urls = [url.replace("http", "ws", 1) + "/v1/ws" for url in self._stack.gateway_urls]
        session = f"{self._name}-{number}"
        gateway = number % len(urls) if self._gateway is None else self._gateway
        sent = 0
        stream: _Stream | None = None  # one the socket dropped under: resumed on the next
        while stream is not None or self._goes_on(sent):
            try:
                async with websockets.connect(urls[gateway], additional_headers=headers) as ws:
                    while stream is not None or self._goes_on(sent):
                        if stream is None:
                            sent += 1
                            prompt = self._stack.engine.prompt(self._name, number, sent)
                            stream = _Stream(f"{session}-{sent}", prompt, session)
                            self.tally.started += 1
                        await self._one_stream(ws, stream)
                        stream = None
            except (OSError, websockets.WebSocketException):
                # The gateway went away (stopped, killed): the next one continues the stream.
                gateway = (gateway + 1) % len(urls)
                await asyncio.sleep(RECONNECT_PAUSE_SECONDS)
            except _StreamEnded:
                stream = None

    async def _one_stream(self, ws: Any, stream: _Stream) -> None:
        frame = self._stack.generate_frame(
            stream.stream_id, stream.prompt, stream.session, self._max_tokens
        )
        if stream.ids:  # what it holds, for the gateway to continue after
            frame["resume"] = {
                "token_ids": stream.ids,
                "text": "".join(stream.text),
                "completion_tokens": len(stream.ids),
                "receipt": stream.receipt,  # what was delivered is not charged again
            }
        await ws.send(json.dumps(frame))
        try:
            async with asyncio.timeout(STREAM_TIMEOUT_SECONDS):
                while True:
                    received = json.loads(await ws.recv())
                    if received.get("id") != stream.stream_id:
                        continue
                    if received["type"] == "queued":
                        stream.queued = True
                    elif received["type"] == "start":
                        stream.agents.add(received["agent"])  # this stream's handle of it
                    elif received["type"] == "delta":
                        stream.ids.extend(received["ids"])
                        stream.text.append(received["text"])
                        stream.receipt = received.get("receipt")
                        self.replying.set()
                    elif received["type"] == "error":
                        if received["code"] == "going_away":  # its gateway is stopping
                            raise websockets.ConnectionClosed(None, None)
                        self.tally.failed[received["code"]] += 1
                        self.tally.queued += stream.queued
                        await asyncio.sleep(
                            received.get("retry_after") or FAILED_STREAM_PAUSE_SECONDS
                        )
                        return
                    elif received["type"] == "done":
                        break
        except websockets.ConnectionClosed:
            stream.resumes += 1  # the client continues it through another gateway
            raise
        except TimeoutError:
            self.tally.lost += 1  # no end at all: the one outcome that must never happen
            self.tally.queued += stream.queued
            raise _StreamEnded from None
        self.tally.queued += stream.queued
        expected = self._stack.expected_reply(stream.prompt, self._max_tokens)
        moved = len(stream.agents) > 1 or stream.resumes > 0
        if self.tally.reply_ended(expected, "".join(stream.text), moved):
            self.completed.set()


class SseClients(Clients):
    """`streams` OpenAI clients, each streaming one long reply over SSE through one gateway.

    An SSE response is one HTTP exchange: a client cannot resume it. Each must end with
    `data: [DONE]`, exact or after an error event (counted by its code, `going_away` when its
    gateway stopped first); one cut without a word is lost.
    """

    def __init__(
        self, stack: TrafficStack, streams: int, *, max_tokens: int, gateway: int, tally: Tally
    ) -> None:
        super().__init__(stack, streams, tally)
        self._max_tokens = max_tokens
        self._gateway = gateway
        self.replying = asyncio.Event()

    async def _client(self, number: int) -> None:
        prompt = self._stack.engine.prompt("sse", number, 1)
        frame = self._stack.generate_frame(f"sse-{number}", prompt, f"sse-{number}")
        body = {
            "model": frame["model"],
            "messages": frame["messages"],
            "max_tokens": self._max_tokens,
            "temperature": 0,
            "stream": True,
        }
        url = f"{self._stack.gateway_urls[self._gateway]}/v1/chat/completions"
        headers = {"Authorization": f"Bearer {self._stack.api_key}"}
        self.tally.started += 1
        text: list[str] = []
        error: str | None = None
        ended = False
        try:
            async with (
                aiohttp.ClientSession() as http,
                http.post(url, json=body, headers=headers) as response,
            ):
                async for line in response.content:
                    data = line.decode().strip().removeprefix("data: ")
                    if data == "[DONE]":
                        ended = True
                        break
                    if not data:
                        continue
                    event = json.loads(data)
                    if "error" in event:
                        error = event["error"].get("code") or "error"
                        continue
                    for choice in event.get("choices", ()):
                        text.append(choice.get("delta", {}).get("content") or "")
                        self.replying.set()
        except (aiohttp.ClientError, OSError):
            ended = False
        if not ended:
            self.tally.lost += 1  # cut without a word: what a drain must never do
        elif error is not None:
            self.tally.failed[error] += 1
        else:
            self.tally.reply_ended(
                self._stack.expected_reply(prompt, self._max_tokens), "".join(text), False
            )


class _StreamEnded(Exception):
    """A stream that ended without an answer, counted; its socket is no longer trusted."""


@dataclass
class _Stream:
    """One stream of a client, and what it holds: a dropped socket does not end it."""

    stream_id: str
    prompt: str
    session: str
    ids: list[int] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    receipt: str | None = None  # the gateway's, for every id held
    agents: set[str] = field(default_factory=set)
    queued: bool = False
    resumes: int = 0  # times the client sent it again through another gateway
