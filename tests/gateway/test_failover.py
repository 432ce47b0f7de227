"""The failover rules of one client stream, on plain data: no sockets, no event loop, no clock."""

from __future__ import annotations

import itertools

import pytest

from gateway.failover import Failover, agent_handle
from gateway.moves import (
    MOVE_PACE_GAP_MULTIPLE,
    CatchUp,
    DropNext,
    HoldForNext,
    OpenNext,
    Pace,
    Reopen,
    Repeat,
    Switch,
    TakeOver,
)
from gateway.outcome import Decision, GiveUp, ResumeElsewhere, Unplaced, WaitForRoom
from gateway.receipts import ReceiptSigner
from spotgate.protocol import (
    DeltaFrame,
    DoneFrame,
    ErrorCode,
    ErrorFrame,
    GenerateFrame,
    MovingFrame,
    QueuedFrame,
    Resume,
    StartFrame,
    Timings,
    Usage,
    client_delta,
)
from spotgate.tokens import KeyRing, SigningKey

MODEL = "synth"
CLIENT_ID = "c1"
REQUEST = GenerateFrame(id=CLIENT_ID, model=MODEL, prompt="hi", max_tokens=50, seed=7)
DEADLINE_SECONDS = 30.0
ARRIVED = 1_000.0  # wall clock when the stream arrived
STARTED = 50.0  # monotonic, at the same moment
LINK_LOST = "link lost"
STALLED = "stalled"
RESUMING_ENDINGS = [ErrorCode.INTERRUPTED, ErrorCode.NO_CAPACITY, LINK_LOST]
Ending = ErrorCode | str  # an agent's error code, LINK_LOST or STALLED


HANDLE_KEY = bytes(range(32))


def arrive(request: GenerateFrame = REQUEST, handle_key: bytes = HANDLE_KEY) -> Failover:
    return Failover.begin(
        request,
        deadline_seconds=DEADLINE_SECONDS,
        now=ARRIVED,
        monotonic=STARTED,
        handle_key=handle_key,
    )


def place(stream: Failover, agent: str, *, at: float = STARTED + 0.001) -> GenerateFrame:
    """The dispatcher chose `agent` and its stream opened: the frame the agent was sent."""
    stream.on_agent_chosen(monotonic=at)
    frame = stream.agent_frame(f"to-{agent}")
    stream.on_opened(agent)
    return frame


def delta(ids: list[int], text: str) -> DeltaFrame:
    return DeltaFrame(id="agent-stream", text=text, n=len(ids), ids=ids)


def relay(
    stream: Failover,
    ids: list[int],
    text: str,
    *,
    at: float = STARTED + 1,
    arrived: float | None = None,
) -> DeltaFrame:
    """The client is sent the agent's delta `at`; it came in `arrived` (the same, unless paced)."""
    agent_delta = delta(ids, text)
    receipt = stream.on_delta(
        agent_delta,
        monotonic=at,
        arrived_at=at if arrived is None else arrived,
        agent_sent_at=STARTED,
        agent_first_token_at=None,
    )
    request = stream.request
    return client_delta(agent_delta, request.id, with_ids=request.want_ids, receipt=receipt)


def start(agent: str) -> StartFrame:
    return StartFrame(id=f"to-{agent}", agent=agent, engine="synthetic")


def end(stream: Failover, how: Ending, *, now: float = ARRIVED + 1) -> Decision:
    """The serving agent's stream ends early: with an error frame, or its link is lost."""
    if how == LINK_LOST:
        return stream.on_link_lost(now=now)
    if how == STALLED:
        return stream.on_stalled(now=now)
    error = ErrorFrame(id="agent-stream", code=ErrorCode(how), message="agent says", retry_after=2)
    return stream.on_agent_error(error, now=now)


def done(completion_tokens: int) -> DoneFrame:
    return DoneFrame(
        id="agent-stream",
        finish_reason="stop",
        usage=Usage(prompt_tokens=4, completion_tokens=completion_tokens),
        timings=Timings(queue_ms=0, ttft_ms=1, total_ms=2),
    )


RESUMES = {
    ErrorCode.UNAUTHORIZED: False,
    ErrorCode.FORBIDDEN: False,
    ErrorCode.INVALID_REQUEST: False,
    ErrorCode.CONTEXT_LENGTH_EXCEEDED: False,
    ErrorCode.MODEL_NOT_FOUND: False,
    ErrorCode.RATE_LIMITED: False,
    ErrorCode.NO_CAPACITY: True,
    ErrorCode.TIMEOUT: False,
    ErrorCode.INTERRUPTED: True,
    ErrorCode.GOING_AWAY: False,  # a gateway's word to its clients, never an agent's
    ErrorCode.INTERNAL: False,
    LINK_LOST: True,
    STALLED: True,  # a wedged engine behind a live agent: it is told to stop, the stream moves
}


def test_every_error_code_is_classified() -> None:
    assert set(RESUMES) == {*ErrorCode, LINK_LOST, STALLED}


@pytest.mark.parametrize(("ending", "resumes"), RESUMES.items())
def test_which_agent_endings_resume_the_stream(ending: Ending, resumes: bool) -> None:
    stream = arrive()
    place(stream, "a")
    relay(stream, [5, 6], "ab")

    decision = end(stream, ending, now=ARRIVED + 9)

    assert stream.serving is None  # the agent's stream is over either way: forgotten, not cancelled
    if ending == ErrorCode.NO_CAPACITY:  # full of other gateways' streams: wait for room there
        assert decision == WaitForRoom(full_agent="a")
        assert stream.excluded == set()
        assert stream.deadline == ARRIVED + DEADLINE_SECONDS  # the same wait, not a fresh one
        assert stream.outcome.error is None
    elif resumes:
        assert decision == ResumeElsewhere(failed_agent="a", tokens_so_far=2)
        assert stream.excluded == {"a"}
        assert stream.deadline == ARRIVED + 9 + DEADLINE_SECONDS
        assert stream.outcome.error is None
    else:
        assert decision == GiveUp(
            ErrorFrame(id=CLIENT_ID, code=ending, message="agent says", retry_after=2)
        )
        assert stream.outcome.error == ending
        assert stream.excluded == set()


@pytest.mark.parametrize(
    ("sent", "resume"),
    [
        ([], None),
        ([([5], "a")], Resume(token_ids=[5], text="a", completion_tokens=1)),
        (
            [([5, 6], "ab"), ([7], " c"), ([8, 9, 10], "d€")],
            Resume(token_ids=[5, 6, 7, 8, 9, 10], text="ab cd€", completion_tokens=6),
        ),
    ],
    ids=["before-first-token", "one-token", "six-tokens-in-three-deltas"],
)
def test_the_next_agent_is_sent_what_the_client_already_has(
    sent: list[tuple[list[int], str]], resume: Resume | None
) -> None:
    stream = arrive()
    first = place(stream, "a")
    for ids, text in sent:
        relay(stream, ids, text)
    end(stream, ErrorCode.INTERRUPTED)

    second = place(stream, "b")

    assert first == REQUEST.model_copy(
        update={"id": "to-a", "want_ids": True, "resume": None, "move_early": True}
    )
    assert second == REQUEST.model_copy(
        update={"id": "to-b", "want_ids": True, "resume": resume, "move_early": True}
    )


@pytest.mark.parametrize(
    ("events", "excluded_after_each"),
    [
        ([("interrupted", "a"), ("interrupted", "b")], [{"a"}, {"a", "b"}]),
        ([("no_capacity", "a"), (LINK_LOST, "b")], [set(), {"b"}]),  # full is not failed
        ([("unavailable", "a"), ("unavailable", "b")], [{"a"}, {"a", "b"}]),
        (
            [("unavailable", "a"), ("interrupted", "b"), (LINK_LOST, "c")],
            [{"a"}, {"a", "b"}, {"a", "b", "c"}],
        ),
        ([("timeout", "a")], [set()]),  # given up, not moved: nothing to exclude from
    ],
)
def test_failed_and_unreachable_agents_are_excluded_for_good(
    events: list[tuple[str, str]], excluded_after_each: list[set[str]]
) -> None:
    stream = arrive()
    for (event, agent), excluded in zip(events, excluded_after_each, strict=True):
        if event == "unavailable":  # no link to it, or its link cannot connect
            stream.on_agent_chosen(monotonic=STARTED + 1)
            stream.on_unavailable(agent)
        else:
            place(stream, agent)
            end(stream, event)
        assert stream.excluded == excluded


@pytest.mark.parametrize(
    ("events", "deadline_after_each"),
    [
        ([("interrupted", 10.0)], [10.0 + DEADLINE_SECONDS]),
        ([("no_capacity", 10.0)], [DEADLINE_SECONDS]),  # waiting for room: the same wait
        ([(LINK_LOST, 10.0)], [10.0 + DEADLINE_SECONDS]),
        (
            [("interrupted", 10.0), (LINK_LOST, 25.0)],
            [10.0 + DEADLINE_SECONDS, 25.0 + DEADLINE_SECONDS],
        ),
        # An unreachable agent is no new placement: the stream goes on waiting to its deadline.
        ([("unavailable", 10.0)], [DEADLINE_SECONDS]),
        (
            [("interrupted", 10.0), ("unavailable", 20.0)],
            [10.0 + DEADLINE_SECONDS, 10.0 + DEADLINE_SECONDS],
        ),
    ],
)
def test_each_placement_gets_a_fresh_deadline(
    events: list[tuple[str, float]], deadline_after_each: list[float]
) -> None:
    stream = arrive()
    assert stream.deadline == ARRIVED + DEADLINE_SECONDS
    for agent, ((event, after), deadline) in enumerate(
        zip(events, deadline_after_each, strict=True)
    ):
        if event == "unavailable":
            stream.on_unavailable(f"agent-{agent}")
        else:
            place(stream, f"agent-{agent}")
            end(stream, event, now=ARRIVED + after)
        assert stream.deadline == ARRIVED + deadline


@pytest.mark.parametrize(
    ("history", "why", "code", "message", "retry_after"),
    [
        (
            "fresh",
            Unplaced.UNKNOWN_MODEL,
            "model_not_found",
            "model 'synth' is not served here; GET /v1/models lists those that are",
            None,
        ),
        (
            "fresh",
            Unplaced.QUEUE_FULL,
            "rate_limited",
            "too many requests wait for 'synth'; retry shortly",
            1.0,
        ),
        (
            "fresh",
            Unplaced.NO_CAPACITY,
            "no_capacity",
            "no agent for 'synth' could serve the request in time",
            5.0,
        ),
        (
            "interrupted before a token",
            Unplaced.NO_CAPACITY,
            "no_capacity",
            "no agent for 'synth' could serve the request in time",
            5.0,
        ),
        (
            "interrupted after a token",
            Unplaced.NO_CAPACITY,
            "no_capacity",
            "no agent for 'synth' could resume the stream in time",
            5.0,
        ),
        (
            "interrupted after a token",
            Unplaced.QUEUE_FULL,
            "rate_limited",
            "too many requests wait for 'synth'; retry shortly",
            1.0,
        ),
    ],
)
def test_a_stream_no_agent_can_take_ends_with_a_clear_error(
    history: str, why: Unplaced, code: str, message: str, retry_after: float | None
) -> None:
    stream = arrive()
    if history != "fresh":
        place(stream, "a")
        if history == "interrupted after a token":
            relay(stream, [5], "a")
        end(stream, ErrorCode.INTERRUPTED)

    error = stream.on_unplaced(why)

    param = "model" if why is Unplaced.UNKNOWN_MODEL else None
    assert error == ErrorFrame(
        id=CLIENT_ID, code=ErrorCode(code), message=message, retry_after=retry_after, param=param
    )
    assert stream.outcome.error == code


@pytest.mark.parametrize(
    ("history", "forwarded"),
    [
        ("fresh", True),
        ("started, no token yet", True),
        ("interrupted before a token", True),
        ("after a token", False),
        ("interrupted after a token", False),
    ],
)
def test_queue_positions_reach_the_client_only_before_its_first_token(
    history: str, forwarded: bool
) -> None:
    stream = arrive()
    if history != "fresh":
        place(stream, "a")
        stream.on_start(start("a"))
        if "after a token" in history:
            relay(stream, [5], "a")
        if history.startswith("interrupted"):
            end(stream, ErrorCode.INTERRUPTED)

    queued = stream.on_queued(3)

    assert queued == (QueuedFrame(id=CLIENT_ID, position=3) if forwarded else None)
    assert stream.queued  # waited, forwarded or not: no share of TTFT is the gateway's own


@pytest.mark.parametrize(
    ("agents", "announced", "resumes"),
    [
        (["a"], ["a"], 0),
        (["a", "a"], ["a"], 0),
        (["a", "b"], ["a", "b"], 1),
        (["a", "b", "b", "c"], ["a", "b", "c"], 2),
        (["a", "b", "a"], ["a", "b", "a"], 2),
    ],
)
def test_start_reaches_the_client_when_the_agent_changes_and_each_change_is_a_resume(
    agents: list[str], announced: list[str], resumes: int
) -> None:
    stream = arrive()
    forwarded = [stream.on_start(start(agent)) for agent in agents]

    assert [f for f in forwarded if f is not None] == [
        StartFrame(id=CLIENT_ID, agent=agent_handle(HANDLE_KEY, agent), engine="synthetic")
        for agent in announced
    ]
    assert stream.outcome.resumes == resumes
    assert stream.outcome.agent_id == announced[-1]


AGENT_ID = "i-0123456789abcdef0"


def test_start_names_the_agent_by_a_handle_no_other_stream_can_link_to_it() -> None:
    first, second = arrive(handle_key=b"k" * 32), arrive(handle_key=b"j" * 32)
    mine = first.on_start(start(AGENT_ID))
    theirs = second.on_start(start(AGENT_ID))
    assert mine is not None
    assert theirs is not None
    # The same agent, two streams: two unrelated handles, neither the agent's id nor part of it.
    assert mine.agent != theirs.agent
    assert AGENT_ID[2:10] not in mine.agent
    assert len(mine.agent) == 16
    # Within a stream a handle stays the agent's, and another agent gets another one.
    moved = first.on_start(start("i-other"))
    assert moved is not None
    assert moved.agent != mine.agent
    back = first.on_start(start(AGENT_ID))
    assert back is not None
    assert back.agent == mine.agent


@pytest.mark.parametrize(
    ("history", "agent_first_token_at", "added_ttft_ms"),
    [
        ("first agent", STARTED + 0.110, 12.0),  # 112 ms in all, 100 of them the agent's
        ("first agent, after an unreachable one", STARTED + 0.110, 12.0),
        ("first agent, its first token time unknown", None, None),
        ("first agent, after waiting in the queue", STARTED + 0.110, None),
        ("second agent", STARTED + 0.110, None),
    ],
)
def test_time_to_first_token_and_the_gateways_own_share(
    history: str, agent_first_token_at: float | None, added_ttft_ms: float | None
) -> None:
    stream = arrive()
    if "queue" in history:
        stream.on_queued(0)
    if "unreachable" in history:
        stream.on_unavailable("gone")
    if history == "second agent":
        place(stream, "a")
        end(stream, ErrorCode.INTERRUPTED)
    place(stream, "b")

    for ids, at in (([5], STARTED + 0.112), ([6], STARTED + 0.5)):  # only the first one counts
        stream.on_delta(
            delta(ids, "x"),
            monotonic=at,
            arrived_at=at,
            agent_sent_at=STARTED + 0.010,
            agent_first_token_at=agent_first_token_at,
        )

    assert stream.outcome.ttft_ms == pytest.approx(112.0)
    if added_ttft_ms is None:
        assert stream.outcome.added_ttft_ms is None
    else:
        assert stream.outcome.added_ttft_ms == pytest.approx(added_ttft_ms)


@pytest.mark.parametrize(
    ("tokens", "ttft_ms"),
    [
        ([], 3000.0),  # no token: time to first token is the whole stream's
        ([[5], [6, 7]], 500.0),
    ],
)
def test_done_carries_usage_and_timings_across_placements(
    tokens: list[list[int]], ttft_ms: float
) -> None:
    completion_tokens = sum(len(ids) for ids in tokens)
    stream = arrive()
    place(stream, "a", at=STARTED + 0.020)  # the first choice ends the wait in the queue
    end(stream, LINK_LOST)
    place(stream, "b", at=STARTED + 0.400)
    for n, ids in enumerate(tokens):
        relay(stream, ids, "x", at=STARTED + 0.5 + n)

    final = stream.on_done(done(completion_tokens), monotonic=STARTED + 3)

    assert (final.id, final.finish_reason) == (CLIENT_ID, "stop")
    assert final.usage == Usage(prompt_tokens=4, completion_tokens=completion_tokens)
    assert final.timings.queue_ms == pytest.approx(20.0)  # not 400: only the first wait
    assert final.timings.ttft_ms == pytest.approx(ttft_ms)
    assert final.timings.total_ms == pytest.approx(3000.0)
    assert stream.outcome.prompt_tokens == 4
    assert stream.outcome.completion_tokens == completion_tokens
    assert stream.serving is None


@pytest.mark.parametrize(
    ("want_ids", "ids_to_client"), [(True, [5, 6]), (False, None)], ids=["want-ids", "text-only"]
)
def test_tokens_reach_the_client_in_its_own_stream_id(
    want_ids: bool, ids_to_client: list[int] | None
) -> None:
    stream = arrive(REQUEST.model_copy(update={"want_ids": want_ids}))
    place(stream, "a")

    forwarded = relay(stream, [5, 6], "ab")

    assert forwarded == DeltaFrame(id=CLIENT_ID, text="ab", n=2, ids=ids_to_client)
    assert stream.outcome.relayed_tokens == 2
    assert stream.serving == "a"  # still open: a client going away now must cancel it


@pytest.mark.parametrize(("first", "second"), list(itertools.product(RESUMING_ENDINGS, repeat=2)))
def test_a_stream_interrupted_twice_reaches_the_client_whole(first: Ending, second: Ending) -> None:
    stream = arrive(REQUEST.model_copy(update={"want_ids": True}))
    to_client: list[object] = []

    def failed(endings: dict[str, Ending]) -> set[str]:  # a full agent is waited for, not failed
        return {agent for agent, ending in endings.items() if ending != ErrorCode.NO_CAPACITY}

    to_a = place(stream, "a")
    to_client += [stream.on_start(start("a")), relay(stream, [1, 2], "ab")]
    assert isinstance(end(stream, first), ResumeElsewhere | WaitForRoom)
    assert stream.excluded == failed({"a": first})

    to_b = place(stream, "b")
    to_client += [stream.on_start(start("b")), relay(stream, [3], " c")]
    assert isinstance(end(stream, second), ResumeElsewhere | WaitForRoom)
    assert stream.excluded == failed({"a": first, "b": second})

    to_c = place(stream, "c")
    to_client += [stream.on_start(start("c")), relay(stream, [4], "d")]
    to_client.append(stream.on_done(done(4), monotonic=STARTED + 2))

    assert to_a.resume is None
    assert to_b.resume == Resume(token_ids=[1, 2], text="ab", completion_tokens=2)
    assert to_c.resume == Resume(token_ids=[1, 2, 3], text="ab c", completion_tokens=3)
    deltas = [f for f in to_client if isinstance(f, DeltaFrame)]
    assert [i for f in deltas for i in f.ids or ()] == [1, 2, 3, 4]  # each token once
    assert "".join(f.text for f in deltas) == "ab cd"
    assert [f.agent for f in to_client if isinstance(f, StartFrame)] == [
        agent_handle(HANDLE_KEY, agent) for agent in "abc"
    ]
    assert all(getattr(f, "id", None) == CLIENT_ID for f in to_client)
    assert isinstance(to_client[-1], DoneFrame)
    assert to_client[-1].usage.completion_tokens == 4
    assert stream.outcome.resumes == 2
    assert stream.outcome.relayed_tokens == 4
    assert stream.outcome.agent_id == "c"
    assert stream.outcome.error is None


def test_a_stream_a_client_resumes_starts_as_one_that_has_its_tokens() -> None:
    held = Resume(token_ids=[5, 6], text="ab", completion_tokens=2)
    stream = arrive(REQUEST.model_copy(update={"resume": held}))
    assert stream.has_tokens
    assert stream.on_queued(3) is None  # it waits silently, as any resume
    first = place(stream, "a")
    assert first.resume == held  # the first agent continues after what the client holds
    assert stream.on_start(start("a")) is not None  # a new gateway: the client hears `start`
    relay(stream, [7], "c")
    moved = place(stream, "b")
    assert moved.resume == Resume(token_ids=[5, 6, 7], text="abc", completion_tokens=3)


def test_each_delta_carries_the_receipt_of_every_id_the_client_holds_across_moves() -> None:
    signer = ReceiptSigner(KeyRing([SigningKey.generate()]))
    held = Resume(token_ids=[5, 6], text="ab", completion_tokens=2)
    request = REQUEST.model_copy(update={"want_ids": True, "resume": held})
    stream = Failover.begin(
        request,
        deadline_seconds=DEADLINE_SECONDS,
        now=ARRIVED,
        monotonic=STARTED,
        handle_key=HANDLE_KEY,
        receipts=signer.chain("key-a", request),
    )
    place(stream, "a")
    relay(stream, [7], "c")
    end(stream, ErrorCode.INTERRUPTED.value)
    place(stream, "b")
    last = relay(stream, [8, 9], "de")
    assert last.receipt is not None
    ids = [5, 6, 7, 8, 9]
    proven = Resume(token_ids=ids, text="abcde", completion_tokens=5, receipt=last.receipt)
    assert signer.delivered("key-a", request.model_copy(update={"resume": proven}))
    unasked = arrive()  # a client that did not ask for ids gets no receipts
    place(unasked, "a")
    assert relay(unasked, [7], "c").receipt is None


@pytest.mark.parametrize(
    ("want_ids", "tokens", "advice"),
    [
        (True, [7], "resume it"),  # it holds ids: it carries on through another gateway
        (False, [7], "retry it"),  # an SSE client cannot say where it stopped
        (True, [], "retry it"),  # nothing received yet
    ],
)
def test_a_stream_open_when_its_gateway_stops_ends_with_going_away(
    want_ids: bool, tokens: list[int], advice: str
) -> None:
    stream = arrive(REQUEST.model_copy(update={"want_ids": want_ids}))
    place(stream, "a")
    if tokens:
        relay(stream, tokens, "c")
    error = stream.on_going_away()
    assert (error.id, error.code) == (CLIENT_ID, ErrorCode.GOING_AWAY)
    assert f"{advice} through another gateway" in error.message
    assert stream.outcome.error is ErrorCode.GOING_AWAY
    assert stream.serving == "a"  # the relay still tells the agent to stop


# Make-before-break: a draining agent says `moving`; the next agent's continuation opens at
# once, is opened afresh from the client's tokens in rounds, and the stream switches to it.


def moving(stream: Failover, held: list[int]) -> GenerateFrame:
    """The stream, on "a", holds `held`, hears `moving`, and its continuation opens on "b"."""
    place(stream, "a")
    stream.on_start(start("a"))
    for i, token in enumerate(held):
        relay(stream, [token], chr(ord("a") + i), at=STARTED + 1 + 0.02 * i)
    assert stream.on_moving() == OpenNext()
    return stream.next_agent_frame("to-b")


def test_a_moving_stream_is_prepared_once_and_its_next_agent_continues_where_the_client_is() -> (
    None
):
    stream = arrive()
    frame = moving(stream, [5, 6, 7])

    assert stream.on_moving() is None  # already being prepared
    assert frame.resume is not None
    assert frame.resume.token_ids == [5, 6, 7]
    assert frame.move_early is True  # the continuation may move early again
    assert (frame.max_tokens, frame.want_ids) == (REQUEST.max_tokens, True)


def test_a_stream_not_asked_to_move_early_tells_its_agent_so() -> None:
    stream = Failover.begin(
        REQUEST,
        deadline_seconds=DEADLINE_SECONDS,
        now=ARRIVED,
        monotonic=STARTED,
        handle_key=HANDLE_KEY,
        move_early=False,
    )
    assert place(stream, "a").move_early is False


def test_a_next_agent_behind_the_client_at_its_first_token_is_opened_afresh() -> None:
    """Its round is over: the next continuation starts from where the client is now."""
    stream = arrive()
    moving(stream, [5, 6, 7])  # its deltas came 20 ms apart
    relay(stream, [8], "h", at=STARTED + 1.06)
    following = [start("b")]
    assert stream.on_next_agent_news(following, silent=False, ttft_seconds=None) is None
    following.append(delta([8], "h"))
    relay(stream, [9], "i", at=STARTED + 1.08)
    news = following[stream.move.next_judged :]
    assert stream.on_next_agent_news(news, silent=False, ttft_seconds=0.6) == Reopen()
    assert stream.next_agent_frame("to-b-2").resume == Resume(
        token_ids=[5, 6, 7, 8, 9], text="abchi", completion_tokens=5
    )
    # The second round took a tenth of the first: not yet within a gap, the third is a round too.
    assert stream.on_next_agent_news([start("b")], silent=False, ttft_seconds=None) is None
    relay(stream, [10], "j", at=STARTED + 1.1)
    relay(stream, [11], "k", at=STARTED + 1.12)
    news = [delta([10], "j")]  # its first token, one behind the client
    assert stream.on_next_agent_news(news, silent=False, ttft_seconds=0.06) == Reopen()
    stream.next_agent_frame("to-b-3")
    relay(stream, [12], "l", at=STARTED + 1.14)
    news = [start("b"), delta([], "")]  # its first delta, its text held back
    held = stream.on_next_agent_news(news, silent=False, ttft_seconds=0.02)
    assert held == Reopen(hold_seconds=0.6)  # within a gap: the next is the switch
    stream.next_agent_frame("to-b-4")
    news = [start("b"), delta([13], "m")]  # the held switch's first token came
    switched = stream.on_next_agent_news(news, silent=True, ttft_seconds=None)
    assert switched == Switch(draining="a")
    assert not stream.repeating  # it started where the client stands: its token is new
    assert (stream.outcome.early_moves, stream.move.round_ttfts) == (1, [])


@pytest.mark.parametrize(
    "frames",
    [
        [],  # nothing in time
        [start("b")],  # its start, no token in time
        [start("b"), ErrorFrame(id="x", code=ErrorCode.INTERNAL, message="agent says")],
    ],
)
def test_a_switch_whose_continuation_does_not_come_is_dropped(frames: list[object]) -> None:
    stream = arrive()
    moving(stream, [5, 6, 7])
    stream.move.round_ttfts = [0.6]
    assert stream.on_next_agent_news(frames, silent=True, ttft_seconds=None) == DropNext()
    assert stream.move.next_from is None
    assert stream.on_moving() == OpenNext()  # the stream stays, and may move again


def test_a_last_round_that_stopped_shrinking_catches_up_with_a_paced_client() -> None:
    stream = arrive()
    moving(stream, [5, 6, 7])  # its deltas came 20 ms apart
    relay(stream, [8], "h", at=STARTED + 1.06)
    assert stream.on_next_agent_news([delta([], "")], silent=False, ttft_seconds=0.6) == Reopen()
    stream.next_agent_frame("to-b-2")
    assert stream.pace() is None  # a warming round: the client's own pace
    relay(stream, [9], "i", at=STARTED + 1.08)
    relay(stream, [10], "j", at=STARTED + 1.1)
    news = [delta([9], "i")]  # behind, after as long as the round before: it stopped shrinking
    assert stream.on_next_agent_news(news, silent=False, ttft_seconds=0.5) == Reopen()
    stream.next_agent_frame("to-b-3")
    last = STARTED + 1.1
    assert stream.pace() == Pace(last + MOVE_PACE_GAP_MULTIPLE * 0.02)
    # A paced delta is no measure of the pace: the gaps are those the agent's deltas came at.
    relay(stream, [11], "k", at=last + 0.025, arrived=last + 0.02)
    assert stream.pace() == Pace(last + 0.025 + MOVE_PACE_GAP_MULTIPLE * 0.02)
    relay(stream, [12], "l", at=last + 0.05, arrived=last + 0.04)
    news = [delta([11], "k")]  # its first token, behind: it catches up, not another round
    assert stream.on_next_agent_news(news, silent=False, ttft_seconds=0.05) is None
    news = [delta([12], "l")]  # where the client stands
    assert stream.on_next_agent_news(news, silent=False, ttft_seconds=0.05) == Switch("a")
    assert stream.pace() is None


@pytest.mark.parametrize("catches_up", [True, False])
def test_a_paced_last_round_too_slow_to_catch_up_is_waited_for_once(catches_up: bool) -> None:
    stream = arrive()
    moving(stream, [5, 6, 7])  # its deltas came 20 ms apart
    stream.move.round_ttfts, stream.move.pacing = [0.6, 0.5], True  # the last round, paced
    stream.next_agent_frame("to-b-3")
    relay(stream, [8], "h", at=STARTED + 1.06)
    relay(stream, [9], "i", at=STARTED + 1.08)
    news = [start("b"), delta([8], "h")]  # its first token: its pace not yet told
    assert stream.on_next_agent_news(news, silent=False, ttft_seconds=0.05) is None
    # Nothing new, its pace told: 30 ms a token against the stream's 20.
    waited = stream.on_next_agent_news([], silent=False, ttft_seconds=0.05, next_gap_seconds=0.03)
    assert waited == HoldForNext(seconds=0.6)  # one token behind: at least a resume's time
    assert stream.pace() is None  # the client is sent nothing while it waits, not paced
    news = [delta([9], "i")] if catches_up else []
    after = stream.on_next_agent_news(news, silent=not catches_up, ttft_seconds=None)
    assert after == (Switch("a") if catches_up else DropNext())
    assert stream.move.next_from is None


def test_at_the_break_a_warm_rounds_short_prefill_is_no_measure_of_a_resume() -> None:
    """A resume elsewhere prefills the whole conversation, as the first round did."""
    stream = arrive()
    moving(stream, [5, 6, 7])  # its deltas came 20 ms apart
    relay(stream, [8], "h")
    assert stream.on_next_agent_news([delta([], "")], silent=False, ttft_seconds=5.0) == Reopen()
    stream.next_agent_frame("to-b-2")
    for token in range(9, 24):  # 15 tokens on, the draining agent breaks
        relay(stream, [token], "x")
    end(stream, ErrorCode.INTERRUPTED)
    # 15 repeats at 20 ms: 0.3 s, more than this round's 0.25 s, less than a resume's 5 s.
    assert stream.at_break([], prefill_seconds=0.25, gap_seconds=0.02) == TakeOver()


def test_a_next_agents_pace_is_measured_afresh() -> None:
    """No gap is measured across agents: a break's wait, or one agent's buffered deltas."""
    stream = arrive()
    place(stream, "a")
    for i in range(3):
        relay(stream, [i], "x", at=STARTED + 1 + 0.02 * i)
    end(stream, ErrorCode.INTERRUPTED)
    place(stream, "b")
    relay(stream, [3], "x", at=STARTED + 9)
    relay(stream, [4], "x", at=STARTED + 9.02)
    assert list(stream.move.recent_gaps) == pytest.approx([0.02, 0.02, 0.02])


def deltas(*parts: tuple[list[int], str]) -> list[DeltaFrame]:
    return [delta(ids, text) for ids, text in parts]


@pytest.mark.parametrize(
    ("held_since", "next_frames", "verdict", "checked", "diverged"),
    [
        # Behind: nothing yet, its start only, or fewer tokens than the client holds since.
        ([8, 9], [], CatchUp.BEHIND, 0, 0),
        ([8, 9], [start("b"), *deltas(([8], "a"))], CatchUp.BEHIND, 0, 0),
        # Caught up at a token boundary, with the same text: switch.
        ([8, 9], [start("b"), *deltas(([8], "a"), ([9], "b"))], CatchUp.CAUGHT_UP, 0, 0),
        ([8, 9], [*deltas(([8], "a"), ([9], "b"), ([10], "c"))], CatchUp.CAUGHT_UP, 0, 0),
        ([8, 9], [*deltas(([8, 9], "ab"), ([10], "c"))], CatchUp.CAUGHT_UP, 0, 0),
        # Past the client, in a delta that repeats the rest of its tokens and text: switch
        # there (the client is sent what the delta adds); the draining agent held text back.
        ([8, 9], [*deltas(([8], "a"), ([9, 10], "bc"))], CatchUp.CAUGHT_UP, 0, 0),
        ([8, 9], deltas(([8, 9, 10], "abc")), CatchUp.CAUGHT_UP, 0, 0),
        ([8, 9], [*deltas(([8], "a"), ([9], "b\u00e9"))], CatchUp.CAUGHT_UP, 0, 0),
        # The same ids, the text not yet the same (held back), or another text: wait.
        ([8, 9], [*deltas(([8], "a"), ([9], ""))], CatchUp.BEHIND, 0, 0),
        ([8, 9], [*deltas(([8], "a"), ([9, 10], "Bc"))], CatchUp.BEHIND, 0, 0),
        # Thinking and content in the delta that goes past the client: not to be cut there.
        (
            [8, 9],
            [
                delta([8], "a"),
                DeltaFrame(id="x", text="b</think>c", n=2, ids=[9, 10], content="c", reasoning="b"),
            ],
            CatchUp.BEHIND,
            0,
            0,
        ),
        # Another way than the client's tokens, or ended short of them: dropped.
        ([8, 9], [*deltas(([8], "a"), ([4], "z"))], CatchUp.DIVERGED, 2, 1),
        ([8, 9], [*deltas(([8], "a")), done(1)], CatchUp.DIVERGED, 1, 1),
        # It failed, or its own agent drains too: dropped.
        (
            [8, 9],
            [start("b"), ErrorFrame(id="x", code=ErrorCode.INTERNAL, message="agent says")],
            CatchUp.FAILED,
            0,
            0,
        ),
        ([8, 9], [start("b"), MovingFrame(id="x")], CatchUp.FAILED, 0, 0),
    ],
)
def test_a_next_agent_is_caught_up_where_it_repeated_the_clients_tokens_to_a_boundary(
    held_since: list[int],
    next_frames: list[object],
    verdict: CatchUp,
    checked: int,
    diverged: int,
) -> None:
    stream = arrive()
    moving(stream, [5, 6, 7])
    relay(stream, held_since[:1], "a")
    relay(stream, held_since[1:], "b")

    assert stream.on_next_agent_frames(next_frames) is verdict
    assert stream.outcome.early_move_checked_tokens == checked
    assert stream.outcome.early_move_diverged == diverged
    # A dropped next agent ends the move: the stream moves at the break, if it comes.
    assert (stream.move.next_from is None) is (verdict in (CatchUp.DIVERGED, CatchUp.FAILED))


def test_a_next_agents_frames_are_judged_once_as_they_come() -> None:
    """Each check takes the frames after those already judged: a catch-up costs no rescans."""
    stream = arrive()
    moving(stream, [5, 6, 7])
    relay(stream, [8], "h")
    relay(stream, [9], "i")
    following = [start("b"), delta([8], "h")]
    assert stream.on_next_agent_frames(following[stream.move.next_judged :]) is CatchUp.BEHIND
    assert stream.move.next_judged == 2
    relay(stream, [10], "j")  # the client goes on meanwhile
    following.append(delta([9], "i"))
    assert stream.on_next_agent_frames(following[stream.move.next_judged :]) is CatchUp.BEHIND
    following.append(delta([10, 11], "jk"))
    assert stream.on_next_agent_frames(following[stream.move.next_judged :]) is CatchUp.CAUGHT_UP
    assert stream.move.next_judged == 3  # the last is where it switches: its rest is the client's


def test_how_far_behind_a_next_agent_is_counts_what_it_repeated() -> None:
    stream = arrive()
    moving(stream, [5, 6, 7])
    relay(stream, [8], "h")
    relay(stream, [9], "i")
    relay(stream, [10], "j")
    assert stream.move.behind(len(stream.ids)) == 3
    stream.on_next_agent_frames([start("b"), delta([8], "h")])
    assert stream.move.behind(len(stream.ids)) == 2


def test_a_switch_drops_the_next_agents_repeats_and_leaves_the_draining_agent() -> None:
    stream = arrive()
    moving(stream, [5, 6, 7])
    relay(stream, [8], "h")
    relay(stream, [9], "i")
    repeats = deltas(([8], "h"), ([9], "i"))
    assert stream.on_next_agent_frames([start("b"), *repeats]) is CatchUp.CAUGHT_UP

    assert stream.on_switch() == "a"
    stream.on_opened("b")
    assert stream.on_start(start("b")) is not None  # the client hears it moved
    assert stream.repeating
    assert all(stream.on_repeated_delta(d) == Repeat(repeats=True) for d in repeats)
    assert not stream.repeating
    relay(stream, [10], "j")  # its next token goes on from what the client held

    assert stream.ids == [5, 6, 7, 8, 9, 10]
    assert stream.excluded == {"a"}
    assert (stream.outcome.early_moves, stream.outcome.resumes) == (1, 1)
    assert (stream.outcome.early_move_checked_tokens, stream.outcome.early_move_diverged) == (2, 0)
    assert stream.on_moving() == OpenNext()  # its own agent may drain too, later


@pytest.mark.parametrize(
    ("repeated", "taken", "diverged"),
    [
        # Exactly: the stream goes on.
        (deltas(([8], "h"), ([9], "i")), [Repeat(True), Repeat(True)], 0),
        # Past what the client holds: the client is sent the rest (a token, or held-back text).
        (deltas(([8], "h"), ([9, 10], "ij")), [Repeat(True), Repeat(True, delta([10], "j"))], 0),
        (deltas(([8, 9, 10], "hij")), [Repeat(True, delta([10], "j"))], 0),
        (deltas(([8], "h"), ([9], "i!")), [Repeat(True), Repeat(True, delta([], "!"))], 0),
        (deltas(([8], "h"), ([4], "z")), [Repeat(True), Repeat(False)], 1),  # another token
        (deltas(([8], "h"), ([9], "I")), [Repeat(True), Repeat(False)], 0),  # another text
        (deltas(([8], "h"), ([9, 10], "Ij")), [Repeat(True), Repeat(False)], 0),
    ],
)
def test_a_next_agent_taking_over_at_the_break_must_repeat_the_clients_tokens(
    repeated: list[DeltaFrame], taken: list[Repeat], diverged: int
) -> None:
    stream = arrive()
    moving(stream, [5, 6, 7])
    relay(stream, [8], "h")
    relay(stream, [9], "i")
    decision = end(stream, ErrorCode.INTERRUPTED)  # before the next agent caught up
    assert decision == ResumeElsewhere(failed_agent="a", tokens_so_far=5)
    stream.on_next_agent_takes_over()
    stream.on_opened("b")

    assert [stream.on_repeated_delta(d) for d in repeated] == taken
    assert stream.outcome.early_moves == 1
    assert stream.outcome.early_move_diverged == diverged
    if all(repeat.repeats for repeat in taken):
        assert not stream.repeating  # what follows is new to the client
    else:  # it goes on from the client's tokens elsewhere, "b" not excluded
        resumed = stream.on_repeat_failed(now=ARRIVED + 2)
        assert resumed == ResumeElsewhere(failed_agent="b", tokens_so_far=5)
        assert stream.excluded == {"a"}
        assert not stream.repeating
        assert stream.agent_frame("to-c").resume == Resume(
            token_ids=[5, 6, 7, 8, 9], text="abchi", completion_tokens=5
        )


@pytest.mark.parametrize("how", [LINK_LOST, STALLED, ErrorCode.NO_CAPACITY])
def test_a_next_agent_that_breaks_before_its_repeats_leaves_none_owed_to_the_next(
    how: Ending,
) -> None:
    stream = arrive()
    moving(stream, [5, 6, 7])
    relay(stream, [8], "h")
    end(stream, ErrorCode.INTERRUPTED)  # the break: "b" takes over, owing a repeat of [8]
    stream.on_next_agent_takes_over()
    stream.on_opened("b")
    end(stream, how, now=ARRIVED + 2)  # "b" breaks before it repeated anything

    assert not stream.repeating
    stream.on_agent_chosen(monotonic=STARTED + 3)
    assert stream.agent_frame("to-c").resume == Resume(
        token_ids=[5, 6, 7, 8], text="abch", completion_tokens=4
    )
    stream.on_opened("c")
    stream.on_start(start("c"))
    relay(stream, [8], "h", at=STARTED + 4)  # new from "c": the same token again, sent on
    assert stream.ids == [5, 6, 7, 8, 8]


def test_an_abandoned_move_can_be_prepared_again() -> None:
    stream = arrive()
    place(stream, "a")
    assert stream.on_moving() == OpenNext()
    stream.on_move_abandoned()
    assert stream.on_moving() == OpenNext()


def test_a_stream_between_agents_is_not_moved_early() -> None:
    stream = arrive()
    place(stream, "a")
    end(stream, ErrorCode.INTERRUPTED)
    assert stream.on_moving() is None
