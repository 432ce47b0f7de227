"""One persistent, multiplexed websocket per agent, and per-stream channels on it.

The link's reader never waits for a client: frames of each stream go into its own
`StreamChannel`, where consecutive deltas are merged, so a slow client never stalls the other
streams on the same agent. A client that stops reading costs at most
`MAX_STREAM_BACKLOG_TOKENS` tokens of memory per stream: past that, its stream ends with a
`timeout` error (after what it has not read yet) and the agent is told to stop it. When the
socket breaks, every open channel gets `LINK_LOST` and the relay resumes those streams
elsewhere.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import suppress
from dataclasses import dataclass

import aiohttp

from spotgate.logging import get_logger
from spotgate.protocol import (
    FRAME_LINES_SUBPROTOCOL,
    AuthFrame,
    CancelFrame,
    DeltaFrame,
    DoneFrame,
    ErrorCode,
    ErrorFrame,
    FrameError,
    GenerateFrame,
    ServerFrame,
    encode_frame,
    parse_frame,
)
from spotgate.tasks import ended
from spotgate.wsserver import SOCKET_CLOSE_SECONDS

RECONNECT_BACKOFF_SECONDS = (0.2, 0.5, 1.0, 2.0, 5.0)
LINK_HEARTBEAT_SECONDS = 10.0
MAX_AGENT_FRAME_BYTES = 16 * 1024 * 1024
TOKEN_REFRESH_MARGIN_SECONDS = 120.0
MAX_STREAM_BACKLOG_TOKENS = 16_384
"""Tokens a stream may hold for its client: minutes of a real engine's output unread."""
RELAY_FAILED = "the gateway failed to relay this stream"
BAD_AGENT_FRAME = "the agent sent a frame of this stream that is not valid"

log = get_logger(__name__)


class LinkUnavailable(Exception):
    """The agent cannot be reached right now (connecting failed, or backing off)."""


@dataclass(frozen=True, slots=True)
class LinkLost:
    """The agent's socket closed while the stream was open."""

    reason: str


@dataclass(frozen=True, slots=True)
class GatewayGoingAway:
    """The gateway is stopping and its drain's grace is over: the stream ends here."""


@dataclass(frozen=True, slots=True)
class StreamStalled:
    """The agent sent nothing for this stream for `seconds` (its engine may be wedged)."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Wakeup:
    """Not from the agent: the stream's reader has its own event to see (a move prepared)."""


@dataclass(frozen=True, slots=True)
class Preempted:
    """Not from the agent: a waiting interactive stream needs this flex stream's place."""


ChannelItem = ServerFrame | LinkLost | StreamStalled | GatewayGoingAway | Wakeup | Preempted


class _PendingDelta:
    """Consecutive deltas not yet taken by the client, merged only when taken (linear cost).

    A delta taken alone, as most are while the client keeps up, is passed on as it came.
    """

    __slots__ = ("arrived_at", "frames", "n")

    def __init__(self, first: DeltaFrame, arrived_at: float) -> None:
        self.frames = [first]
        self.arrived_at = arrived_at  # monotonic: when its first part came in
        self.n = first.n

    def add(self, frame: DeltaFrame) -> None:
        self.frames.append(frame)
        self.n += frame.n

    def frame(self) -> DeltaFrame:
        frames = self.frames
        return frames[0] if len(frames) == 1 else merged_delta(frames)


def merged_delta(frames: list[DeltaFrame]) -> DeltaFrame:
    """Consecutive deltas of one stream as one: ids, logprobs and text in order.

    Ids and logprobs stay only if every part has them. A stream read for tool calls or
    thinking gives every delta a `content`; any other, none; one whose model reasons, a
    `reasoning` too.
    """
    first = frames[0]
    ids = None if any(f.ids is None for f in frames) else [i for f in frames for i in f.ids or ()]
    logprobs = (
        None
        if any(f.logprobs is None for f in frames)
        else [entry for f in frames for entry in f.logprobs or ()]
    )
    content = None if first.content is None else "".join(f.content for f in frames if f.content)
    reasoning = (
        None if first.reasoning is None else "".join(f.reasoning for f in frames if f.reasoning)
    )
    return DeltaFrame(
        id=first.id,
        text="".join(f.text for f in frames),
        n=sum(f.n for f in frames),
        ids=ids,
        logprobs=logprobs,
        content=content,
        reasoning=reasoning,
    )


class StreamChannel:
    """Frames of one stream, in order, with consecutive deltas merged."""

    def __init__(self) -> None:
        self._items: deque[ChannelItem | _PendingDelta] = deque()
        self._backlog_tokens = 0
        self._waiter: asyncio.Future[bool] | None = None  # the reader's, while none is pushed
        self._wait_started = 0.0  # the loop's time when the reader's latest wait began
        self._stall_timer: asyncio.TimerHandle | None = None
        self.closed = False
        self.overflowed = False  # the client did not read (or a fault): the agent must stop it
        # Off while each delta must stay as the agent sent it (a move's token boundaries).
        self.merge_deltas = True
        self.sent_at = time.monotonic()
        self.first_delta_at: float | None = None  # when the agent's first token came in
        self.last_delta_at: float | None = None  # and its latest
        self.tokens_in = 0  # tokens come in, read or not
        self.delta_arrived_at = self.sent_at  # when the delta last taken came in
        # While set, and the reader waits with nothing unread, a delta is offered to it here,
        # from the link's reader, before it is queued: True, it was taken (sent on at once).
        self.take_now: Callable[[StreamChannel, DeltaFrame], bool] | None = None

    def push(self, item: ChannelItem) -> None:
        """Add a frame without ever waiting (called by the link's reader)."""
        if self.closed:
            return
        if isinstance(item, DeltaFrame):
            arrived_at = time.monotonic()
            if self.first_delta_at is None:
                self.first_delta_at = arrived_at
            self.last_delta_at = arrived_at
            self.tokens_in += item.n
            if self._taken_now(item, arrived_at):
                return
            last = self._items[-1] if self._items else None
            if isinstance(last, _PendingDelta) and self.merge_deltas:
                last.add(item)
            else:
                self._items.append(_PendingDelta(item, arrived_at))
            self._backlog_tokens += item.n
            if self._backlog_tokens > MAX_STREAM_BACKLOG_TOKENS:
                self.overflowed = True
                self.closed = True
                self._items.append(
                    ErrorFrame(
                        id=item.id,
                        code=ErrorCode.TIMEOUT,
                        message=f"the client did not read this stream; it was stopped with "
                        f"{self._backlog_tokens} tokens waiting",
                    )
                )
        else:
            self._items.append(item)
            self.closed = isinstance(item, DoneFrame | ErrorFrame | LinkLost | GatewayGoingAway)
        _wake_reader(self._waiter, True)

    def _taken_now(self, delta: DeltaFrame, arrived_at: float) -> bool:
        """Whether the waiting reader took the delta at once (`take_now`).

        Its wait goes on, renewed: the stall timer counts from this delta. Saves the reader a
        wake-up per delta, the relay's largest cost per token while its client keeps up.
        """
        take_now, waiter = self.take_now, self._waiter
        # `reader_waiting`, written out: this runs for every token
        if take_now is None or waiter is None or waiter.done() or self._items:
            return False
        if not self.merge_deltas:  # each delta stays as the agent sent it: through the reader
            return False
        previous, wait_started = self.delta_arrived_at, self._wait_started
        # The loop's clock is time.monotonic's (asyncio's; uvloop's, to the millisecond).
        self.delta_arrived_at = self._wait_started = arrived_at
        try:
            taken = take_now(self, delta)
        except Exception:  # a fault of this stream's: it ends, the link's other streams go on
            log.exception(
                "sending a delta at once failed; the stream ends", agent_stream_id=delta.id
            )
            self.take_now = None
            self.overflowed = True  # its agent is told to stop it
            self.push(ErrorFrame(id=delta.id, code=ErrorCode.INTERNAL, message=RELAY_FAILED))
            return True
        if not taken:
            self.delta_arrived_at, self._wait_started = previous, wait_started
        return taken

    @property
    def reader_waiting(self) -> bool:
        """Whether the stream's reader has read everything and waits for the next push."""
        waiter = self._waiter
        return waiter is not None and not waiter.done() and not self._items

    def first_delta_seconds(self) -> float | None:
        """From sending the stream to its first token coming in (None: none yet)."""
        return None if self.first_delta_at is None else self.first_delta_at - self.sent_at

    def gap_seconds(self) -> float | None:
        """The agent's mean time per token after its first (None: too few yet to tell)."""
        if self.first_delta_at is None or self.last_delta_at is None or self.tokens_in < 2:
            return None
        return (self.last_delta_at - self.first_delta_at) / (self.tokens_in - 1)

    def unread(self, skipped: int = 0) -> list[ChannelItem]:
        """What was pushed and not yet read, past the first `skipped`, in order (merged)."""
        return [
            entry.frame() if isinstance(entry, _PendingDelta) else entry
            for entry in itertools.islice(self._items, skipped, None)
        ]

    async def items(self, stall_seconds: float | None = None) -> AsyncIterator[ChannelItem]:
        """Everything pushed until the stream ends, or `StreamStalled` after a silent stall.

        Taken one entry at a time: a reader that stops early leaves the rest unread.
        """
        try:
            while True:
                if not self._items and not await self._pushed_within(stall_seconds):
                    yield StreamStalled(stall_seconds or 0.0)
                    return
                entry = self._items.popleft()
                if isinstance(entry, _PendingDelta):
                    self._backlog_tokens -= entry.n
                    self.delta_arrived_at = entry.arrived_at
                    item: ChannelItem = entry.frame()
                else:
                    item = entry
                yield item
                if isinstance(item, DoneFrame | ErrorFrame | LinkLost | GatewayGoingAway):
                    return
        finally:
            if self._stall_timer is not None:
                self._stall_timer.cancel()
                self._stall_timer = None

    async def pushed_within(self, seconds: float) -> bool:
        """Wait, reading nothing, for the next push, at most `seconds`: whether one came."""
        try:
            async with asyncio.timeout(max(0.0, seconds)):
                return await self._pushed_within(None)
        except TimeoutError:
            return False

    async def _pushed_within(self, seconds: float | None) -> bool:
        """Wait for the next push: True once one came, False if none did for `seconds`.

        A future per wait, and one timer per `seconds` that looks whether the wait then under
        way is that old: the reader waits once per delta, where a timer per wait, or
        `asyncio.timeout` and an `Event`, cost the relay a tenth of its CPU.
        """
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool] = loop.create_future()
        self._waiter = waiter
        if seconds is not None:
            self._wait_started = loop.time()
            if self._stall_timer is None:
                self._stall_timer = loop.call_at(
                    self._wait_started + seconds, self._check_stall, seconds
                )
        try:
            return await waiter
        finally:
            self._waiter = None

    def _check_stall(self, seconds: float) -> None:
        """The stall timer: end a wait `seconds` old, or look again when the current one is."""
        self._stall_timer = None
        waiter = self._waiter
        if waiter is None or waiter.done():  # not waiting: its next wait sets the timer
            return
        loop = waiter.get_loop()
        due = self._wait_started + seconds
        if loop.time() >= due:
            _wake_reader(waiter, False)
        else:
            self._stall_timer = loop.call_at(due, self._check_stall, seconds)


def _wake_reader(waiter: asyncio.Future[bool] | None, pushed: bool) -> None:
    """Wake a channel's waiting reader, if any: something was pushed, or its wait is over."""
    if waiter is not None and not waiter.done():
        waiter.set_result(pushed)


TokenSource = Callable[[], tuple[str, float]]
"""Returns a token for the agent and its expiry (epoch seconds)."""


class AgentLink:
    """The gateway's connection to one agent."""

    def __init__(
        self,
        agent_id: str,
        url: str,
        session: aiohttp.ClientSession,
        token_source: TokenSource,
    ) -> None:
        self.agent_id = agent_id
        self.url = url
        self._session = session
        self._token_source = token_source
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._reader: asyncio.Task[None] | None = None
        self._channels: dict[str, StreamChannel] = {}
        self._connecting = asyncio.Lock()
        self._failures = 0
        self._retry_at = 0.0
        self._token_expires = 0.0
        self.closed = False

    @property
    def open_streams(self) -> int:
        """Streams on this link right now."""
        return len(self._channels)

    async def open_stream(
        self, frame: GenerateFrame, *, merge_deltas: bool = True
    ) -> StreamChannel:
        """Send a `generate` frame; the returned channel yields the agent's frames for it."""
        ws = await self._connected()
        await self._refresh_token_if_due(ws)
        channel = StreamChannel()
        channel.merge_deltas = merge_deltas
        self._channels[frame.id] = channel
        try:
            await ws.send_str(encode_frame(frame))
            channel.sent_at = time.monotonic()
        except (ConnectionResetError, aiohttp.ClientError) as err:
            self._channels.pop(frame.id, None)
            raise LinkUnavailable(f"agent {self.agent_id}: {err}") from err
        return channel

    async def cancel(self, stream_id: str) -> None:
        """Tell the agent to stop a stream (the client went away)."""
        if self._channels.pop(stream_id, None) is None or self._ws is None or self._ws.closed:
            return
        with suppress(ConnectionResetError, aiohttp.ClientError):
            await self._ws.send_str(encode_frame(CancelFrame(id=stream_id)))

    def forget(self, stream_id: str) -> None:
        """Stop routing frames of a finished stream."""
        self._channels.pop(stream_id, None)

    async def close(self) -> None:
        """Close the socket; open channels learn the link is lost."""
        self.closed = True
        if self._ws is not None and not self._ws.closed:
            # Bounded: aiohttp's close waits without one for a receive under way to end.
            with suppress(TimeoutError):
                async with asyncio.timeout(SOCKET_CLOSE_SECONDS):
                    await self._ws.close()
        if self._reader is not None:
            await ended([self._reader])
        self._lose_all("link closed")

    async def _connected(self) -> aiohttp.ClientWebSocketResponse:
        if self._ws is not None and not self._ws.closed:
            return self._ws
        async with self._connecting:
            if self._ws is not None and not self._ws.closed:
                return self._ws
            if self.closed:
                raise LinkUnavailable(f"agent {self.agent_id}: link closed")
            if time.monotonic() < self._retry_at:
                raise LinkUnavailable(f"agent {self.agent_id}: backing off after failures")
            token, expires = self._token_source()
            try:
                ws = await self._session.ws_connect(
                    f"{self.url}/v1/ws",
                    headers={"Authorization": f"Bearer {token}"},
                    heartbeat=LINK_HEARTBEAT_SECONDS,
                    max_msg_size=MAX_AGENT_FRAME_BYTES,
                    timeout=aiohttp.ClientWSTimeout(ws_close=SOCKET_CLOSE_SECONDS),
                    compress=0,
                    protocols=(FRAME_LINES_SUBPROTOCOL,),
                )
            except (aiohttp.ClientError, TimeoutError, OSError) as err:
                delay = RECONNECT_BACKOFF_SECONDS[
                    min(self._failures, len(RECONNECT_BACKOFF_SECONDS) - 1)
                ]
                self._failures += 1
                self._retry_at = time.monotonic() + delay
                raise LinkUnavailable(f"agent {self.agent_id}: {err}") from err
            self._failures = 0
            self._token_expires = expires
            self._ws = ws
            self._reader = asyncio.create_task(self._read(ws), name=f"link {self.agent_id}")
            return ws

    async def _refresh_token_if_due(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        if time.time() < self._token_expires - TOKEN_REFRESH_MARGIN_SECONDS:
            return
        token, expires = self._token_source()
        await ws.send_str(encode_frame(AuthFrame(token=token)))
        self._token_expires = expires

    async def _read(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        reason = "agent closed the connection"
        lines = ws.protocol == FRAME_LINES_SUBPROTOCOL  # several frames a message, a line each
        try:
            async for message in ws:
                if message.type != aiohttp.WSMsgType.TEXT:
                    if message.type == aiohttp.WSMsgType.ERROR:
                        reason = f"socket error: {ws.exception()}"
                        break
                    continue
                for text in message.data.split("\n") if lines else (message.data,):
                    overflowed = self._deliver(text)
                    if overflowed is not None:
                        log.warning(
                            "stream stopped (its client did not read, or it failed)",
                            agent_stream_id=overflowed,
                        )
                        with suppress(ConnectionResetError, aiohttp.ClientError):
                            await ws.send_str(encode_frame(CancelFrame(id=overflowed)))
        finally:
            if ws.close_code is not None:
                reason = f"{reason} (code {ws.close_code})"
            self._lose_all(reason)

    def _deliver(self, text: str) -> str | None:
        """One frame from the agent to its stream's channel; the stream's id if it overflowed."""
        frame: ServerFrame
        try:
            frame = parse_frame(text, origin="server", max_bytes=MAX_AGENT_FRAME_BYTES)
        except FrameError as err:
            log.warning("bad frame from agent", agent_id=self.agent_id, error=str(err))
            if err.id not in self._channels:
                return None
            # Dropped, it would leave a hole in the reply: the stream resumes elsewhere from
            # what its client holds, and this agent is told to stop it.
            self._channels[err.id].overflowed = True
            frame = ErrorFrame(id=err.id, code=ErrorCode.INTERRUPTED, message=BAD_AGENT_FRAME)
        stream_id = getattr(frame, "id", None)
        channel = self._channels.get(stream_id) if stream_id else None
        if channel is None:
            if isinstance(frame, ErrorFrame) and frame.id is None:
                log.warning("agent error", agent_id=self.agent_id, message=frame.message)
            return None
        was_closed = channel.closed
        channel.push(frame)
        if channel.closed and not was_closed:  # the agent's last frame of the stream
            # A channel the gateway closed itself (`going_away`) stays until its relay
            # cancels it: the agent must still hear that.
            self._channels.pop(stream_id or "", None)
        return stream_id if channel.overflowed else None

    def going_away(self) -> None:
        """End every stream open on the link: the gateway is stopping (each tells its client)."""
        for channel in list(self._channels.values()):
            channel.push(GatewayGoingAway())

    def _lose_all(self, reason: str) -> None:
        channels, self._channels = self._channels, {}
        for channel in channels.values():
            channel.push(LinkLost(reason))
