"""The relay's bookkeeping of agent capacity, with a link that is slow to open."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

import pytest

from gateway.agent_link import ChannelItem, StreamChannel, Wakeup
from gateway.dispatch import Dispatcher
from gateway.relay import ClientFrame, RelayOutcome, relay_stream
from gateway.streams import RelayHandle
from spotgate.protocol import (
    DeltaFrame,
    DoneFrame,
    ErrorCode,
    ErrorFrame,
    GenerateFrame,
    MovingFrame,
    QueuedFrame,
    StartFrame,
    Timings,
    Usage,
    client_delta,
)
from spotgate.registry import AgentRecord, AgentState
from spotgate.settings import QueueSettings
from tests.support.channels import WaitedChannel, reader_waits

MODEL = "synth"


class OpeningLink:
    """A link to an agent whose first connection never completes."""

    def __init__(self) -> None:
        self.opening = asyncio.Event()
        self.opened = 0

    async def open_stream(self, _frame: GenerateFrame) -> StreamChannel:
        self.opened += 1
        self.opening.set()
        await asyncio.Event().wait()
        raise AssertionError("never opens")


async def test_a_chosen_agent_counts_the_stream_while_its_link_opens() -> None:
    dispatcher = Dispatcher(QueueSettings(deadline_seconds=5.0))
    now = time.time()
    dispatcher.view.replace(
        [AgentRecord("a", "http://a", MODEL, AgentState.READY, capacity=1, expires_at=now + 60)],
        now,
    )
    link = OpeningLink()

    def relay(stream_id: str):  # type: ignore[no-untyped-def]
        frame = GenerateFrame(id=stream_id, model=MODEL, prompt="hi")
        return relay_stream(
            frame,
            dispatcher=dispatcher,
            link_for=lambda _agent_id: link,  # type: ignore[arg-type,return-value]
            deadline_seconds=5.0,
            stall_seconds=30.0,
            outcome=RelayOutcome(),
        )

    first, second = relay("first"), relay("second")
    placing = asyncio.create_task(anext(first))
    await link.opening.wait()
    async with asyncio.timeout(30):
        # The agent's one slot is taken: the second stream waits instead of overbooking it.
        assert await anext(second) == QueuedFrame(id="second", position=0)
    placing.cancel()
    await asyncio.gather(placing, return_exceptions=True)
    await second.aclose()

    assert link.opened == 1
    assert dict(dispatcher.outstanding) == {}  # the cancelled placement gave its slot back


class WatchedChannel(WaitedChannel):
    """A stream's channel that tells when a move's task, ended, woke its reader, and when its
    reader waits for the next push."""

    def __init__(self) -> None:
        super().__init__()
        self.woken = asyncio.Event()

    def push(self, item: ChannelItem) -> None:
        super().push(item)
        if isinstance(item, Wakeup):
            self.woken.set()


class ScriptedLink:
    """A link to an agent whose stream's frames the test pushes, as the agent would send them."""

    def __init__(self, agent: str) -> None:
        self.agent = agent
        self.frames: list[GenerateFrame] = []
        self.channel = WatchedChannel()
        self.opened = asyncio.Event()
        self.cancelled: list[str] = []

    async def open_stream(self, frame: GenerateFrame) -> StreamChannel:
        self.frames.append(frame)
        self.channel = WatchedChannel()  # each stream its own
        self.opened.set()
        return self.channel

    async def cancel(self, stream_id: str) -> None:
        self.cancelled.append(stream_id)

    def forget(self, _stream_id: str) -> None:
        """Nothing to forget: the test holds the channel."""

    def start(self) -> None:
        self.channel.push(StartFrame(id=self.frames[-1].id, agent=self.agent, engine="vllm"))

    def delta(self, ids: list[int], text: str) -> None:
        self.channel.push(DeltaFrame(id=self.frames[-1].id, text=text, n=len(ids), ids=ids))


def done(stream_id: str, tokens: int) -> DoneFrame:
    return DoneFrame(
        id=stream_id,
        finish_reason="stop",
        usage=Usage(prompt_tokens=1, completion_tokens=tokens),
        timings=Timings(queue_ms=0, ttft_ms=1, total_ms=2),
    )


def ready(*agents: str) -> list[AgentRecord]:
    now = time.time()
    return [
        AgentRecord(a, f"http://{a}", MODEL, AgentState.READY, capacity=1, expires_at=now + 60)
        for a in agents
    ]


@dataclass
class ClientSocket:
    """The client's socket, as the relay sends to it without waiting."""

    keeping_up: bool = True
    sent: list[DeltaFrame] = field(default_factory=list)

    def keeps_up(self) -> bool:
        return self.keeping_up

    def send_delta(
        self, delta: DeltaFrame, stream_id: str, *, with_ids: bool, receipt: str | None
    ) -> None:
        self.sent.append(client_delta(delta, stream_id, with_ids=with_ids, receipt=receipt))


@dataclass
class ScriptedRelay:
    """One client stream relayed to agents whose frames the test scripts; only "a" ready yet."""

    dispatcher: Dispatcher
    links: dict[str, ScriptedLink]
    frames: AsyncGenerator[ClientFrame, None]

    @classmethod
    def open(
        cls, max_tokens: int, agents: str = "ab", direct: ClientSocket | None = None
    ) -> ScriptedRelay:
        """The stream, asking for `max_tokens`, with a scripted link to each of `agents`."""
        dispatcher = Dispatcher(QueueSettings(deadline_seconds=5.0))
        dispatcher.view.replace(ready("a"), time.time())
        links = {agent: ScriptedLink(agent) for agent in agents}
        frames = relay_stream(
            GenerateFrame(id="s", model=MODEL, prompt="hi", max_tokens=max_tokens, want_ids=True),
            dispatcher=dispatcher,
            link_for=links.get,  # type: ignore[arg-type]
            deadline_seconds=5.0,
            stall_seconds=30.0,
            outcome=RelayOutcome(),
            direct=direct,
        )
        return cls(dispatcher, links, frames)

    client: list[ClientFrame] = field(default_factory=list)  # what the client read so far

    async def started_on_a(self) -> None:
        """The stream placed on "a", the client given its `start`."""
        placing = asyncio.create_task(anext(self.frames))
        await self.links["a"].opened.wait()
        self.links["a"].start()
        self.client.append(await placing)

    async def client_gets(self, token: int) -> None:
        """Agent "a" sends `token`; the client reads the frame that comes next."""
        self.links["a"].delta([token], chr(ord("a") + token))
        self.client.append(await anext(self.frames))

    def next_breaks(self, next_stream: str, tokens: int) -> None:
        """The next agent's continuation `next_stream` breaks; "a" ends after `tokens`."""
        self.links["b"].channel.push(
            ErrorFrame(id=next_stream, code=ErrorCode.INTERNAL, message="broke")
        )
        self.links["a"].channel.push(done(self.links["a"].frames[-1].id, tokens))

    async def rest(self, reading: asyncio.Task[None]) -> list[ClientFrame]:
        """All the client read, once its pending read is done, to the stream's end."""
        async with asyncio.timeout(30):
            await reading
            self.client += [frame async for frame in self.frames]
        return self.client

    def routable(self, *agents: str) -> None:
        """The agents the dispatcher may choose from now on."""
        self.dispatcher.view.replace(ready(*agents), time.time())


async def test_a_move_switches_within_a_next_agent_delta_that_goes_past_the_client() -> None:
    """Its repeats are dropped and the rest of that delta is the client's next tokens.

    The draining agent sends two more tokens, and the next agent's first delta holds those
    and one more: no delta of the next agent ends where the client stands.
    """
    relay = ScriptedRelay.open(6)
    links, frames = relay.links, relay.frames
    draining, following = links["a"], links["b"]
    placing = asyncio.create_task(anext(frames))
    await draining.opened.wait()
    draining.start()
    client = [await placing]
    for token, text in ((1, "a"), (2, "b")):
        draining.delta([token], text)
        client.append(await anext(frames))
    relay.routable("a", "b")
    draining.channel.push(MovingFrame(id=draining.frames[-1].id))
    reading = asyncio.create_task(anext(frames))
    await following.opened.wait()
    assert following.frames[-1].resume is not None
    assert following.frames[-1].resume.token_ids == [1, 2]  # it continues from the client
    following.start()
    following.delta([3, 4, 5], "cde")
    following.delta([6], "f")
    following.channel.push(
        DoneFrame(
            id=following.frames[-1].id,
            finish_reason="length",
            usage=Usage(prompt_tokens=1, completion_tokens=6),
            timings=Timings(queue_ms=0, ttft_ms=1, total_ms=2),
        )
    )
    draining.delta([3], "c")
    client.append(await reading)
    draining.delta([4], "d")  # the client stands within the next agent's first delta
    async with asyncio.timeout(30):  # no boundary to switch at would leave it waiting
        client += [frame async for frame in frames]

    deltas = [frame for frame in client if isinstance(frame, DeltaFrame)]
    assert [token for d in deltas for token in d.ids or ()] == [1, 2, 3, 4, 5, 6]
    assert "".join(d.text for d in deltas) == "abcdef"
    assert [type(frame) for frame in client].count(StartFrame) == 2
    assert isinstance(client[-1], DoneFrame)
    assert draining.cancelled == [draining.frames[-1].id]


async def test_a_client_that_cancels_twice_mid_move_leaves_neither_agent_streaming() -> None:
    """A second `cancel` (or the socket's close after one) does not cut the first's cleanup."""
    relay = ScriptedRelay.open(50)
    dispatcher, links, frames = relay.dispatcher, relay.links, relay.frames
    draining, following = links["a"], links["b"]
    first_delta = asyncio.Event()

    async def client() -> None:
        async for frame in frames:
            if isinstance(frame, DeltaFrame):
                first_delta.set()

    handle = RelayHandle(asyncio.create_task(client()))
    await draining.opened.wait()
    draining.start()
    draining.delta([1], "a")
    await first_delta.wait()
    relay.routable("a", "b")
    draining.channel.push(MovingFrame(id=draining.frames[-1].id))
    await following.opened.wait()  # the move's next agent is open

    handle.end("cancelled")
    await asyncio.sleep(0)  # its cleanup has begun: it waits on the move's task
    handle.end("cancelled")
    await asyncio.gather(handle.task, return_exceptions=True)

    assert draining.cancelled == [draining.frames[-1].id]
    assert following.cancelled == [following.frames[-1].id]
    assert dict(dispatcher.outstanding) == {}  # both agents' slots given back


async def test_a_next_agent_that_drains_while_it_repeats_is_relayed_a_token_at_a_time() -> None:
    """Its own move may switch at any of its tokens: its deltas stay unmerged past its repeats."""
    relay = ScriptedRelay.open(50, "abc")
    links, frames = relay.links, relay.frames
    draining, following = links["a"], links["b"]
    placing = asyncio.create_task(anext(frames))
    await draining.opened.wait()
    draining.start()
    await placing
    draining.delta([1], "a")
    assert isinstance(await anext(frames), DeltaFrame)
    relay.routable("a", "b")
    draining.channel.push(MovingFrame(id=draining.frames[-1].id))
    reading = asyncio.create_task(anext(frames))
    await following.opened.wait()
    draining.delta([2], "b")
    await reading  # the client holds [1, 2]; the next agent continues from [1]
    draining.channel.push(
        ErrorFrame(id=draining.frames[-1].id, code=ErrorCode.INTERRUPTED, message="drained")
    )
    reading = asyncio.create_task(anext(frames))
    following.start()
    assert isinstance(await reading, StartFrame)  # taken over: it owes a repeat of [2]
    relay.routable("a", "b", "c")
    following.channel.push(MovingFrame(id=following.frames[-1].id))  # it drains too
    reading = asyncio.create_task(anext(frames))
    await links["c"].opened.wait()
    following.delta([2], "b")  # its repeat, dropped
    following.delta([3], "c")
    assert await reading == DeltaFrame(id="s", text="c", n=1, ids=[3])
    assert following.channel.merge_deltas is False
    await frames.aclose()


@pytest.mark.parametrize("switch", ["comes", "fails", "drains too"])
async def test_a_next_agent_behind_at_its_first_token_is_warmed_again_then_switched_to(
    switch: str,
) -> None:
    """Each round opens its continuation afresh from the client's tokens; the last is waited for.

    While the client waits for the switch's first token, the draining agent's deltas are held:
    dropped when it comes, sent on when that continuation fails or its agent drains too. (The
    relay looks at the next agent's frames after each delta it sent the client, before it
    reads the next.)
    """
    relay = ScriptedRelay.open(50)
    await relay.started_on_a()
    dispatcher, links = relay.dispatcher, relay.links
    draining, following = links["a"], links["b"]
    client_gets = relay.client_gets

    async def round_opened(tokens: list[int]) -> str:
        await following.opened.wait()
        following.opened.clear()
        assert following.frames[-1].resume is not None
        assert following.frames[-1].resume.token_ids == tokens
        assert dispatcher.outstanding["b"] == 1  # each round in the one slot
        return following.frames[-1].id

    def first_token(token: int, *, took_seconds: float) -> None:
        following.start()
        following.delta([token], chr(ord("a") + token))
        following.channel.first_delta_at = following.channel.sent_at + took_seconds

    await client_gets(1)
    relay.routable("a", "b")
    draining.channel.push(MovingFrame(id=draining.frames[-1].id))
    await client_gets(2)
    rounds = [await round_opened([1, 2])]
    await draining.channel.woken.wait()  # the move's task ended: the relay reads that next
    await client_gets(3)
    await client_gets(4)
    # A cold prefill, behind the client: the round is over. (The switch is then waited for as
    # long as a resume's prefill would take: longer than this test runs.)
    first_token(3, took_seconds=1000.0)
    await client_gets(5)
    rounds.append(await round_opened([1, 2, 3, 4]))
    await client_gets(6)
    first_token(5, took_seconds=0.0)  # at once, behind: the next round is the switch, held
    reading = asyncio.create_task(client_gets(7))
    last = await round_opened([1, 2, 3, 4, 5, 6])
    assert following.cancelled == rounds
    assert not reading.done()  # the client waits: the draining agent's 7 is held
    if switch == "comes":
        first_token(70, took_seconds=0.0)
        following.channel.push(done(last, 7))
    elif switch == "fails":
        relay.next_breaks(last, 7)
    else:
        following.start()
        following.channel.push(MovingFrame(id=last))
        async with asyncio.timeout(30):  # at once, not when the wait would run out
            await reading
        draining.channel.push(done(draining.frames[-1].id, 7))
    client = await relay.rest(reading)

    deltas = [frame for frame in client if isinstance(frame, DeltaFrame)]
    ids = [token for d in deltas for token in d.ids or ()]
    assert isinstance(client[-1], DoneFrame)
    assert dict(dispatcher.outstanding) == {}
    if switch == "comes":  # the draining agent's 7 was dropped, the next agent's token sent
        assert ids == [1, 2, 3, 4, 5, 6, 70]
        assert [type(frame) for frame in client].count(StartFrame) == 2
        assert draining.cancelled == [draining.frames[-1].id]
    else:
        assert ids == [1, 2, 3, 4, 5, 6, 7]
        assert following.cancelled[-1] == last


@pytest.mark.parametrize("next_agent", ["catches up", "fails", "holds its text back"])
async def test_a_last_round_too_slow_to_catch_up_with_a_paced_client_is_waited_for(
    next_agent: str,
) -> None:
    """Once the paced last round's own gap is too long, the client's next tokens are held.

    Held until it repeats what the client holds (the switch: the draining agent's held token
    dropped), or sent on when it fails or its repeat cannot be cut where the client waits.
    """
    relay = ScriptedRelay.open(50)
    await relay.started_on_a()
    dispatcher, links = relay.dispatcher, relay.links
    draining, following = links["a"], links["b"]
    client_gets = relay.client_gets

    async def round_opened() -> str:
        await following.opened.wait()
        following.opened.clear()
        return following.frames[-1].id

    def next_delta(token: int, *, first_token_seconds: float | None = None) -> None:
        if first_token_seconds is not None:
            following.start()
        following.delta([token], chr(ord("a") + token))
        if first_token_seconds is not None:
            following.channel.first_delta_at = following.channel.sent_at + first_token_seconds

    await client_gets(1)
    relay.routable("a", "b")
    draining.channel.push(MovingFrame(id=draining.frames[-1].id))
    await client_gets(2)
    await round_opened()
    await draining.channel.woken.wait()
    await client_gets(3)
    await client_gets(4)
    next_delta(3, first_token_seconds=10.0)  # a cold prefill, behind: the round is over
    await client_gets(5)
    await round_opened()  # from [1..4]
    await client_gets(6)
    next_delta(5, first_token_seconds=8.0)  # no shorter: the last round catches up, paced
    await client_gets(7)
    last = await round_opened()  # from [1..6]
    await client_gets(8)
    await client_gets(9)
    next_delta(7, first_token_seconds=1.0)
    next_delta(8)
    channel = following.channel
    assert channel.first_delta_at is not None
    channel.last_delta_at = channel.first_delta_at + 10.0  # a token in 10 s: far too slow
    # Before it reads the draining agent's 10, the relay looks at the next agent: behind.
    reading = asyncio.create_task(client_gets(10))
    await asyncio.sleep(0)
    assert not reading.done()  # the client waits: the draining agent's 10 is held
    if next_agent == "catches up":
        next_delta(9)  # it repeats the client's last token: the switch
        next_delta(90)
        following.channel.push(done(last, 10))
    elif next_agent == "fails":
        relay.next_breaks(last, 10)
    else:  # the client's 9, its text not yet: only the client's next tokens would tell
        following.channel.push(DeltaFrame(id=last, text="", n=1, ids=[9]))
        async with asyncio.timeout(30):  # at once, not when the wait would run out
            await reading
        draining.channel.push(done(draining.frames[-1].id, 10))
    client = await relay.rest(reading)

    ids = [token for frame in client if isinstance(frame, DeltaFrame) for token in frame.ids or ()]
    assert isinstance(client[-1], DoneFrame)
    assert dict(dispatcher.outstanding) == {}
    if next_agent == "catches up":
        assert ids == [*range(1, 10), 90]
        assert draining.cancelled == [draining.frames[-1].id]
    else:
        assert ids == list(range(1, 11))
        assert following.cancelled[-1] == last


async def test_a_client_that_keeps_up_is_sent_each_delta_at_once_and_one_that_lags_is_not() -> None:
    """Sent from the agent's link as it comes; through the relay, which waits, when it lags."""
    socket = ClientSocket()
    relay = ScriptedRelay.open(3, direct=socket)
    agent = relay.links["a"]
    await relay.started_on_a()
    reading = asyncio.create_task(anext(relay.frames))
    await reader_waits(agent.channel)
    agent.delta([1], "a")
    assert socket.sent == [DeltaFrame(id="s", text="a", n=1, ids=[1])]  # the client's stream id
    socket.keeping_up = False
    agent.delta([2], "b")
    assert await reading == DeltaFrame(id="s", text="b", n=1, ids=[2])
    socket.keeping_up = True
    reading = asyncio.create_task(anext(relay.frames))
    await reader_waits(agent.channel)
    agent.delta([3], "c")
    agent.channel.push(done(agent.frames[-1].id, 3))
    finished = await reading

    assert [frame.ids for frame in socket.sent] == [[1], [3]]
    assert isinstance(finished, DoneFrame)
    assert finished.usage.completion_tokens == 3


async def test_a_stream_being_moved_sends_no_delta_at_once() -> None:
    """From `moving` on, the move decides what the client is sent of each delta, and when."""
    socket = ClientSocket()
    relay = ScriptedRelay.open(50, direct=socket)
    draining, following = relay.links["a"], relay.links["b"]
    await relay.started_on_a()
    reading = asyncio.create_task(anext(relay.frames))
    await reader_waits(draining.channel)
    draining.delta([1], "a")
    relay.routable("a", "b")
    draining.channel.push(MovingFrame(id=draining.frames[-1].id))
    await following.opened.wait()
    await reader_waits(draining.channel)
    draining.delta([2], "b")

    assert await reading == DeltaFrame(id="s", text="b", n=1, ids=[2])
    assert [frame.ids for frame in socket.sent] == [[1]]
    reading.cancel()
    await relay.frames.aclose()
