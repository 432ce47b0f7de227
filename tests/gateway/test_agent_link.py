"""A stream's channel (deltas merged in order, a bounded backlog), and the link's cancels."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway.agent_link import (
    MAX_STREAM_BACKLOG_TOKENS,
    AgentLink,
    GatewayGoingAway,
    StreamChannel,
    StreamStalled,
)
from spotgate.protocol import (
    DeltaFrame,
    DoneFrame,
    ErrorCode,
    ErrorFrame,
    GenerateFrame,
    encode_frame,
)
from tests.support.channels import WaitedChannel, reader_waits

AgentHandler = Callable[[web.Request], Awaitable[web.WebSocketResponse]]


@asynccontextmanager
async def link_to(agent: AgentHandler) -> AsyncIterator[AgentLink]:
    """A gateway's link to an agent whose socket `agent` serves; closed afterwards."""
    app = web.Application()
    app.router.add_get("/v1/ws", agent)
    async with TestServer(app) as server, aiohttp.ClientSession() as session:
        link = AgentLink("agent", str(server.make_url("")).rstrip("/"), session,
                         lambda: ("token", time.time() + 3600))  # fmt: skip
        try:
            yield link
        finally:
            await link.close()


def delta(text: str, ids: list[int] | None) -> DeltaFrame:
    return DeltaFrame(id="s", text=text, n=len(text), ids=ids)


def done() -> DoneFrame:
    return DoneFrame.model_validate(
        {
            "id": "s",
            "finish_reason": "length",
            "usage": {"prompt_tokens": 1, "completion_tokens": 3},
            "timings": {"queue_ms": 0, "ttft_ms": 1, "total_ms": 2},
        }
    )


async def test_consecutive_deltas_come_out_merged_and_in_order() -> None:
    channel = StreamChannel()
    channel.push(delta("a", [1]))
    channel.push(delta("bc", [2, 3]))
    channel.push(done())

    items = [item async for item in channel.items()]

    assert items == [DeltaFrame(id="s", text="abc", n=3, ids=[1, 2, 3]), done()]


async def test_each_delta_taken_tells_when_the_agent_sent_its_first_part() -> None:
    """The agent's own pace, whatever the reader's: a move paces the client by it."""
    channel = StreamChannel()
    before = time.monotonic()
    channel.push(delta("a", [1]))
    channel.push(delta("b", [2]))  # merged into the first
    between = time.monotonic()
    channel.merge_deltas = False
    channel.push(delta("c", [3]))
    after = time.monotonic()
    items = channel.items()

    await anext(items)
    assert before <= channel.delta_arrived_at <= between
    await anext(items)
    assert between <= channel.delta_arrived_at <= after


async def test_a_delta_without_ids_drops_the_ids_of_the_merge() -> None:
    channel = StreamChannel()
    channel.push(delta("a", [1]))
    channel.push(delta("b", None))
    channel.push(done())

    first = await anext(channel.items())

    assert first == DeltaFrame(id="s", text="ab", n=2, ids=None)


async def test_a_lone_delta_is_passed_on_as_it_came() -> None:
    channel = StreamChannel()
    sent = delta("a", [1])
    channel.push(sent)

    assert await anext(channel.items()) is sent


async def test_merged_deltas_keep_content_and_reasoning_in_order() -> None:
    channel = StreamChannel()
    channel.push(DeltaFrame(id="s", text="", n=1, ids=[1], reasoning="hm", content=""))
    channel.push(DeltaFrame(id="s", text="a", n=1, ids=[2], content="a"))
    channel.push(DeltaFrame(id="s", text="b", n=1, ids=[3], reasoning="!", content="b"))

    merged = await anext(channel.items())

    assert (merged.text, merged.content, merged.reasoning) == ("ab", "ab", "hm!")  # type: ignore[union-attr]
    assert merged.ids == [1, 2, 3]  # type: ignore[union-attr]


async def test_a_silent_stream_stalls() -> None:
    channel = StreamChannel()

    assert await anext(channel.items(0.01)) == StreamStalled(0.01)


async def test_a_stall_is_counted_from_the_wait_under_way_not_an_earlier_one() -> None:
    """One timer serves many waits: when it fires on a younger wait, it looks again later."""
    stall_seconds = 0.2
    loop = asyncio.get_running_loop()
    channel = StreamChannel()
    items = channel.items(stall_seconds)
    loop.call_later(stall_seconds / 2, channel.push, delta("a", [1]))  # within the first wait

    assert await anext(items) == delta("a", [1])
    second_wait_began = loop.time()
    assert await anext(items) == StreamStalled(stall_seconds)
    # The timer set by the first wait fired half-way through this one, and let it run on.
    assert loop.time() - second_wait_began >= stall_seconds - 0.01


async def test_an_unread_stream_stops_at_the_backlog_bound_after_what_it_holds() -> None:
    channel = StreamChannel()
    chunk = "x" * 1000
    pushed = 0
    while not channel.closed:
        channel.push(delta(chunk, None))
        pushed += len(chunk)
    channel.push(delta(chunk, None))  # the agent's frames still in flight are dropped

    items = [item async for item in channel.items()]

    assert channel.overflowed
    assert MAX_STREAM_BACKLOG_TOKENS < pushed <= MAX_STREAM_BACKLOG_TOKENS + len(chunk)
    assert isinstance(items[0], DeltaFrame)
    assert items[0].n == pushed
    assert isinstance(items[1], ErrorFrame)
    assert items[1].code is ErrorCode.TIMEOUT
    assert len(items) == 2


async def test_a_client_that_keeps_up_never_hits_the_bound() -> None:
    channel = StreamChannel()
    chunk = "y" * 1000
    taken = 0
    reader = channel.items()
    for _ in range(3 * MAX_STREAM_BACKLOG_TOKENS // len(chunk)):
        channel.push(delta(chunk, None))
        item = await anext(reader)
        assert isinstance(item, DeltaFrame)
        taken += item.n
    assert not channel.closed
    assert taken == 3 * MAX_STREAM_BACKLOG_TOKENS // len(chunk) * len(chunk)


async def test_a_stream_the_gateway_ended_itself_is_still_cancelled_on_its_agent() -> None:
    """`going_away` closes a channel; the agent's next frame for it must not make it unknown."""
    cancelled: asyncio.Queue[str] = asyncio.Queue()
    go_on = asyncio.Event()

    async def agent(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for message in ws:
            frame = json.loads(message.data)
            if frame["type"] == "cancel":
                await cancelled.put(frame["id"])
            elif frame["id"] == "a":
                await ws.send_str(encode_frame(DeltaFrame(id="a", text="x", n=1, ids=[1])))
            elif frame["id"] == "b":
                await go_on.wait()
                # The stream the gateway ended goes on until told; then another stream's token.
                await ws.send_str(encode_frame(DeltaFrame(id="a", text="y", n=1, ids=[2])))
                await ws.send_str(encode_frame(DeltaFrame(id="b", text="z", n=1, ids=[3])))
        return ws

    async with link_to(agent) as link:
        first = await link.open_stream(GenerateFrame(id="a", model="m", prompt="p"))
        second = await link.open_stream(GenerateFrame(id="b", model="m", prompt="p"))
        assert isinstance(await anext(first.items()), DeltaFrame)
        first.push(GatewayGoingAway())  # what `going_away` does to every channel
        go_on.set()
        assert isinstance(await anext(second.items()), DeltaFrame)  # "a"'s token came before

        await link.cancel("a")
        async with asyncio.timeout(30):
            assert await cancelled.get() == "a"


async def test_an_agents_pace_is_told_from_the_tokens_come_in() -> None:
    """Read or not: a next agent still catching up is judged by what it sent."""
    channel = StreamChannel()
    channel.push(delta("a", [1]))
    assert (channel.tokens_in, channel.gap_seconds()) == (1, None)  # one token: no pace yet
    before = time.monotonic()
    channel.push(delta("bc", [2, 3]))
    after = time.monotonic()
    assert channel.tokens_in == 3
    gap = channel.gap_seconds()
    assert gap is not None
    assert channel.first_delta_at is not None
    assert (before - channel.first_delta_at) / 2 <= gap <= (after - channel.first_delta_at) / 2


async def test_a_wait_for_the_next_push_tells_whether_one_came_and_reads_nothing() -> None:
    channel = StreamChannel()
    assert await channel.pushed_within(0.0) is False  # nothing pushed: the wait ran out
    waiting = asyncio.create_task(channel.pushed_within(60.0))
    await asyncio.sleep(0)
    channel.push(delta("a", [1]))
    assert await waiting is True
    assert [frame.text for frame in channel.unread()] == ["a"]  # still there to be read


async def test_a_waiting_reader_takes_deltas_at_once_and_reads_what_comes_after_them() -> None:
    channel = WaitedChannel()
    taken: list[DeltaFrame] = []
    channel.take_now = lambda _channel, frame: taken.append(frame) is None
    channel.push(delta("a", [1]))  # nobody waits yet: queued
    items = channel.items()
    assert await anext(items) == delta("a", [1])
    reading = asyncio.create_task(anext(items))
    await reader_waits(channel)

    before = time.monotonic()
    channel.push(delta("b", [2]))
    channel.push(delta("c", [3]))
    assert taken == [delta("b", [2]), delta("c", [3])]
    assert not reading.done()
    assert channel.delta_arrived_at >= before  # when the delta taken last came in
    channel.push(done())
    assert await reading == done()
    assert channel.tokens_in == 3


async def test_a_delta_not_taken_at_once_is_read_and_so_is_all_that_follows_it() -> None:
    """Declined, or with deltas kept apart (a move's), it is queued; what comes after waits."""
    channel = WaitedChannel()
    offered: list[str] = []

    def decline(_channel: StreamChannel, frame: DeltaFrame) -> bool:
        offered.append(frame.text)
        return False

    channel.take_now = decline
    items = channel.items()
    reading = asyncio.create_task(anext(items))
    await reader_waits(channel)
    channel.push(delta("a", [1]))
    channel.take_now = lambda _channel, _frame: True
    channel.push(delta("b", [2]))  # "a" is unread: not offered, merged after it
    assert await reading == delta("ab", [1, 2])
    channel.merge_deltas = False
    reading = asyncio.create_task(anext(items))
    await reader_waits(channel)
    channel.push(delta("c", [3]))
    assert await reading == delta("c", [3])
    assert offered == ["a"]


async def test_deltas_taken_at_once_keep_a_stream_from_stalling() -> None:
    """The stall is counted from the last delta taken, not from when the wait began."""
    stall_seconds = 1.0
    loop = asyncio.get_running_loop()
    channel = StreamChannel()
    taken: list[DeltaFrame] = []
    channel.take_now = lambda _channel, frame: taken.append(frame) is None
    items = channel.items(stall_seconds)
    for step, token in enumerate((1, 2, 3), start=1):  # each within the stall of the last
        loop.call_later(step * stall_seconds / 2, channel.push, delta("x", [token]))

    assert await anext(items) == StreamStalled(stall_seconds)
    assert [frame.ids for frame in taken] == [[1], [2], [3]]


async def test_a_delta_that_fails_to_be_sent_at_once_ends_its_stream_alone() -> None:
    """An error for the stream, whose agent is told to stop it; the link's reader goes on."""
    channel = WaitedChannel()

    def fail(_channel: StreamChannel, _frame: DeltaFrame) -> bool:
        raise RuntimeError("a fault")

    channel.take_now = fail
    items = channel.items()
    reading = asyncio.create_task(anext(items))
    await reader_waits(channel)
    channel.push(delta("a", [1]))  # raises nothing here

    error = await reading
    assert isinstance(error, ErrorFrame)
    assert (error.id, error.code) == ("s", ErrorCode.INTERNAL)
    assert channel.overflowed
    assert channel.closed


async def test_a_bad_frame_for_a_stream_ends_it_on_that_agent_for_a_resume_elsewhere() -> None:
    """Dropped, the frame would leave a hole in the reply; the link's other streams go on."""
    cancelled: asyncio.Queue[str] = asyncio.Queue()

    async def agent(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for message in ws:
            frame = json.loads(message.data)
            if frame["type"] == "cancel":
                await cancelled.put(frame["id"])
            elif frame["id"] == "b":
                await ws.send_str('{"type":"delta","id":"a","text":"x","n":-1}')
                await ws.send_str(encode_frame(DeltaFrame(id="b", text="z", n=1, ids=[3])))
        return ws

    async with link_to(agent) as link:
        first = await link.open_stream(GenerateFrame(id="a", model="m", prompt="p"))
        second = await link.open_stream(GenerateFrame(id="b", model="m", prompt="p"))

        ended = await anext(first.items())
        assert isinstance(ended, ErrorFrame)
        assert (ended.id, ended.code) == ("a", ErrorCode.INTERRUPTED)  # resumed elsewhere
        assert await anext(second.items()) == DeltaFrame(id="b", text="z", n=1, ids=[3])
        async with asyncio.timeout(30):
            assert await cancelled.get() == "a"
