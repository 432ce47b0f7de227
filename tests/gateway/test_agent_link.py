"""A stream's channel: deltas merged in order, and a bounded backlog for a client that stalls."""

from __future__ import annotations

from gateway.agent_link import MAX_STREAM_BACKLOG_TOKENS, StreamChannel
from spotgate.protocol import DeltaFrame, DoneFrame, ErrorCode, ErrorFrame


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


async def test_a_delta_without_ids_drops_the_ids_of_the_merge() -> None:
    channel = StreamChannel()
    channel.push(delta("a", [1]))
    channel.push(delta("b", None))
    channel.push(done())

    first = await anext(channel.items())

    assert first == DeltaFrame(id="s", text="ab", n=2, ids=None)


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
