"""Steady traffic: websocket clients streaming known replies, each stream's outcome tallied."""

from __future__ import annotations

import asyncio
import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import websockets

from loadtest.chaos.stack import ChaosStack

STREAM_TIMEOUT_SECONDS = 90.0
RECONNECT_PAUSE_SECONDS = 0.5
FAILED_STREAM_PAUSE_SECONDS = 1.0  # after an error without `retry_after`, as a client would
GOING_AWAY = 1001  # the websocket close code of a server shutting down


@dataclass
class Tally:
    """Streams by outcome."""

    started: int = 0
    exact: int = 0
    resumed: int = 0
    queued: int = 0  # streams that waited in the gateway's queue, whatever their outcome
    failed: Counter[str] = field(default_factory=Counter)
    lost: int = 0

    def reply_ended(self, expected: str, text: str, agents: int) -> bool:
        """Count a reply that ended normally (exact or lost); whether it was exact."""
        if text != expected:
            self.lost += 1
            return False
        self.exact += 1
        self.resumed += agents > 1
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


class Clients:
    """`streams` concurrent clients run as tasks until stopped; subclasses say what each does."""

    def __init__(self, stack: ChaosStack, streams: int, tally: Tally | None = None) -> None:
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
    serves; `rounds` caps the streams each client sends (None: until `stop`).
    """

    def __init__(
        self,
        stack: ChaosStack,
        streams: int,
        *,
        name: str = "client",
        rounds: int | None = None,
        tally: Tally | None = None,
    ) -> None:
        super().__init__(stack, streams, tally)
        self._name = name
        self._rounds = rounds
        self.serving: Counter[str] = Counter()  # agent id → streams it is replying to now
        self.placed: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)  # by agent id
        self.replying = asyncio.Event()
        self.completed = asyncio.Event()  # set by every exact stream; clear it to await one

    def busiest_first(self, ready: dict[str, str]) -> dict[str, str]:
        """`ready`, the agents with the most streams in flight first."""
        return dict(sorted(ready.items(), key=lambda item: -self.serving[item[0]]))

    def _goes_on(self, sent: int) -> bool:
        return not self._stop.is_set() and (self._rounds is None or sent < self._rounds)

    async def _client(self, number: int) -> None:
        url = self._stack.gateway_url.replace("http", "ws", 1) + "/v1/ws"
        headers = {"Authorization": f"Bearer {self._stack.api_key}"}
        session = f"{self._name}-{number}"
        sent = 0
        while self._goes_on(sent):
            try:
                async with websockets.connect(url, additional_headers=headers) as ws:
                    while self._goes_on(sent):
                        sent += 1
                        prompt = self._stack.engine.prompt(self._name, number, sent)
                        await self._one_stream(ws, f"{session}-{sent}", prompt, session)
            except (OSError, websockets.WebSocketException):
                await asyncio.sleep(RECONNECT_PAUSE_SECONDS)  # the gateway went away

    async def _one_stream(self, ws: Any, stream_id: str, prompt: str, session: str) -> None:
        await ws.send(json.dumps(self._stack.generate_frame(stream_id, prompt, session)))
        self.tally.started += 1
        text: list[str] = []
        agents: set[str] = set()
        serving = ""
        queued = False
        try:
            async with asyncio.timeout(STREAM_TIMEOUT_SECONDS):
                while True:
                    frame = json.loads(await ws.recv())
                    if frame.get("id") != stream_id:
                        continue
                    if frame["type"] == "queued":
                        queued = True
                    elif frame["type"] == "start":
                        self.serving.subtract(agents & {serving})
                        serving = frame["agent"]
                        agents.add(serving)
                        self.serving[serving] += 1
                        self.placed[serving].set()
                    elif frame["type"] == "delta":
                        text.append(frame["text"])
                        self.replying.set()
                    elif frame["type"] == "error":
                        self.tally.failed[frame["code"]] += 1
                        await asyncio.sleep(frame.get("retry_after") or FAILED_STREAM_PAUSE_SECONDS)
                        return
                    elif frame["type"] == "done":
                        break
        except websockets.ConnectionClosed as closed:
            if closed.rcvd is None or closed.rcvd.code != GOING_AWAY:
                self.tally.lost += 1
            else:  # the gateway said it is going away: a clear end, the client reconnects
                self.tally.failed["going_away"] += 1
            raise
        except (TimeoutError, websockets.WebSocketException):
            self.tally.lost += 1  # no end at all: the one outcome that must never happen
            raise websockets.ConnectionClosed(None, None) from None
        finally:
            self.serving.subtract(agents & {serving})
            self.tally.queued += queued
        expected = self._stack.expected_reply(prompt)
        if self.tally.reply_ended(expected, "".join(text), len(agents)):
            self.completed.set()
