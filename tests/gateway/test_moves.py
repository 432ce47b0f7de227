"""The rules of make-before-break, on plain data: a next agent's deltas against the tokens
the client holds, its warming rounds, whether its last round is waited for, whether it takes
over at the break, whether it is silent."""

from __future__ import annotations

import pytest

from gateway.moves import (
    MOVE_PACE_GAP_MULTIPLE,
    MOVE_WARM_ROUNDS,
    PACE_GIVE_UP_GAP_MULTIPLE,
    Against,
    HoldForNext,
    Move,
    Reopen,
    against_held,
    next_silent,
    past_held,
    worth_taking_over,
)
from spotgate.protocol import DeltaFrame, TokenLogprob


def delta(ids: list[int], text: str) -> DeltaFrame:
    return DeltaFrame(id="agent-stream", text=text, n=len(ids), ids=ids)


@pytest.mark.parametrize(
    ("behind_tokens", "prefill_seconds", "gap_seconds", "takes_over"),
    [
        (200, None, None, True),  # still in its prefill: a resume would start one afresh
        (200, 0.6, None, True),  # one token yet: its pace unknown
        (20, 0.75, 0.03125, True),  # 0.625 s of repeats against a 0.75 s prefill
        (24, 0.75, 0.03125, True),  # as long as a prefill
        (25, 0.75, 0.03125, False),
        (130, 0.5, 0.05, False),  # slower than the client's pace: it fell far behind
    ],
)
def test_a_next_agent_takes_over_at_the_break_unless_a_prefill_is_sooner(
    behind_tokens: int, prefill_seconds: float | None, gap_seconds: float | None, takes_over: bool
) -> None:
    assert worth_taking_over(behind_tokens, prefill_seconds, gap_seconds) is takes_over


def logprob(token: str) -> TokenLogprob:
    return TokenLogprob(token=token, logprob=-1.0, bytes=None, top_logprobs=[])


@pytest.mark.parametrize(
    ("next_delta", "past"),
    [
        # Tokens past the client's, their logprobs with them.
        (
            DeltaFrame(id="x", text="ij", n=2, ids=[9, 10], logprobs=[logprob("i"), logprob("j")]),
            DeltaFrame(id="x", text="j", n=1, ids=[10], logprobs=[logprob("j")]),
        ),
        # Within the thinking, or within the content: the part cut as the text is.
        (
            DeltaFrame(id="x", text="ij", n=2, ids=[9, 10], content="", reasoning="ij"),
            DeltaFrame(id="x", text="j", n=1, ids=[10], content="", reasoning="j"),
        ),
        (
            DeltaFrame(id="x", text="ij", n=2, ids=[9, 10], content="ij"),
            DeltaFrame(id="x", text="j", n=1, ids=[10], content="j"),
        ),
        # Thinking ends within it: which part the rest belongs to is not known here.
        (DeltaFrame(id="x", text="i</think>j", n=2, ids=[9, 10], content="j", reasoning="i"), None),
        # Exactly the client's (nothing past), or not the client's ids or text.
        (delta([9], "i"), None),
        (delta([4, 10], "ij"), None),
        (delta([9, 10], "Ij"), None),
    ],
)
def test_what_a_next_agents_delta_adds_past_the_clients_tokens(
    next_delta: DeltaFrame, past: DeltaFrame | None
) -> None:
    assert past_held(next_delta, [9], "i") == past


@pytest.mark.parametrize(
    ("next_delta", "against"),
    [
        # The client holds ids [8, 9] as "hi"; this delta follows one that repeated [8] "h".
        (delta([9], "i"), (Against.REPEATED, None)),
        (delta([9, 10], "ij"), (Against.REPEATED, delta([10], "j"))),
        (delta([9], "i!"), (Against.REPEATED, delta([], "!"))),
        (delta([4], "i"), (Against.DIVERGED, None)),
        (delta([9], ""), (Against.UNCUT, None)),  # its text held back
        (delta([9, 10], "Ij"), (Against.UNCUT, None)),  # its ids, but not the client's text
        (delta([], ""), (Against.SHORT, None)),  # no token yet
    ],
)
def test_a_next_agents_delta_against_the_tokens_it_is_to_repeat(
    next_delta: DeltaFrame, against: tuple[Against, DeltaFrame | None]
) -> None:
    assert against_held(next_delta, [9], "h", "hi") == against


def test_a_next_agents_delta_short_of_the_clients_tokens_is_to_be_followed() -> None:
    assert against_held(delta([8], "h"), [8, 9], "", "hi") == (Against.SHORT, None)


@pytest.mark.parametrize(
    ("first_token_at", "sent_at", "monotonic", "silent"),
    [
        (None, 10.0, 15.0, False),  # within the stall limit (10 s)
        (None, 10.0, 20.0, False),  # at it
        (None, 10.0, 20.5, True),  # past it, no token yet
        (12.0, 10.0, 40.0, False),  # it sent a token: no longer silent, however long ago
    ],
)
def test_a_next_agent_is_silent_once_the_stall_limit_passes_without_a_token(
    first_token_at: float | None, sent_at: float, monotonic: float, silent: bool
) -> None:
    assert next_silent(first_token_at, sent_at, monotonic=monotonic, stall_seconds=10.0) is silent


@pytest.mark.parametrize(
    ("earlier_rounds", "ttft_seconds", "reopen", "paced"),
    [
        ([], 0.6, Reopen(), False),  # a cold prefill: warm it again from where the client is
        ([], 0.02, Reopen(hold_seconds=0.08), False),  # within a gap: the next, held, switches
        ([0.6], 0.06, Reopen(), False),  # a tenth of the round before: another shrinks it more
        ([0.6], 0.024, Reopen(hold_seconds=0.6), False),  # held at most the first round's time
        ([0.6, 0.06], 0.025, Reopen(), False),  # past 1.2 gaps, and still halving
        # It stopped shrinking (the agent's own turn-around), or the rounds are spent: the last
        # round catches up with the client's stream, paced.
        ([0.6, 0.06], 0.04, Reopen(), True),
        ([0.6, 0.2, 0.08], 0.03, Reopen(), True),
        ([0.01], 0.02, Reopen(hold_seconds=0.08), False),  # held at most 4 of the round before
    ],
)
def test_a_next_agent_is_warmed_in_rounds_until_one_is_short_and_the_next_is_the_switch(
    earlier_rounds: list[float], ttft_seconds: float, reopen: Reopen, paced: bool
) -> None:
    move = Move(round_ttfts=list(earlier_rounds))
    for i in range(10):  # the stream's deltas came 20 ms apart
        move.relayed(arrived_at=0.02 * i, monotonic=0.02 * i)

    assert move.next_round(ttft_seconds) == reopen
    assert move.round_ttfts == [*earlier_rounds, ttft_seconds]
    assert len(earlier_rounds) < MOVE_WARM_ROUNDS
    assert move.pacing is paced
    assert (move.pace_until() is not None) is paced


def test_a_round_without_a_measured_pace_waits_for_the_rounds_to_shrink() -> None:
    """No gap known yet (a move at the stream's first token): only the rounds' own trend counts."""
    assert Move().next_round(0.01) == Reopen()


@pytest.mark.parametrize(
    ("pacing", "behind", "next_gap", "hold"),
    [
        (True, 3, 0.02, None),  # as fast as the stream: the paced client is caught up with
        (True, 3, 0.0215, None),  # a little slower: it still catches up soon enough
        (True, 3, 0.023, HoldForNext(seconds=0.6)),  # too slow: wait, at least a resume's time
        (True, 10, 0.025, HoldForNext(seconds=1.0)),  # slower than the pace: it never would
        (True, 3, None, None),  # its pace not yet told (one token)
        (False, 3, 0.05, None),  # no last round paced: nothing to give up
    ],
)
def test_a_paced_last_round_too_slow_to_catch_up_is_waited_for(
    pacing: bool, behind: int, next_gap: float | None, hold: HoldForNext | None
) -> None:
    move = Move(round_ttfts=[0.6, 0.5], pacing=pacing)
    for i in range(10):  # the stream's deltas came 20 ms apart
        move.relayed(arrived_at=0.02 * i, monotonic=0.02 * i)

    assert move.give_up_pacing(behind, next_gap) == hold
    assert move.pacing is (pacing and hold is None)
    assert PACE_GIVE_UP_GAP_MULTIPLE < MOVE_PACE_GAP_MULTIPLE  # waited for before it falls back


def test_a_delta_from_where_the_client_stands_is_all_new_whatever_its_parts() -> None:
    """A switch opened from the client's tokens repeats none: nothing of it is to be cut."""
    both = DeltaFrame(id="x", text="i</think>j", n=2, ids=[9, 10], content="j", reasoning="i")
    assert past_held(both, [], "") == both
    assert past_held(delta([], ""), [], "") is None  # nothing in it yet
