"""Streams waiting for a model's agents are taken in fair turns of their tenants, by tokens."""

from __future__ import annotations

import pytest

from gateway.fair_queue import (
    DEFAULT_REPLY_TOKENS,
    FairQueue,
    RunningFlex,
    Waiter,
    place_in_line,
    stream_cost_tokens,
)
from spotgate.protocol import GenerateFrame

WEIGHTS = {"double": 2.0}


def serve_order(arrivals: list[tuple[str, int]]) -> list[str]:
    """The tenants in the order a queue serves streams that all arrived before any left."""
    fair = FairQueue()
    line: list[tuple[Waiter, str]] = []
    for tenant, cost in arrivals:
        me = Waiter(under_way=False, tag=fair.tag(tenant, cost, WEIGHTS.get(tenant, 1.0)))
        line.insert(place_in_line([w for w, _ in line], me), (me, tenant))
    order = []
    for waiter, tenant in line:
        fair.served(waiter.tag)
        order.append(tenant)
    return order


@pytest.mark.parametrize(
    ("arrivals", "served"),
    [
        # One tenant's burst first: the light tenant is served after one turn, not after it.
        ([("heavy", 100)] * 5 + [("light", 100)], ["heavy", "light", *["heavy"] * 4]),
        # Turns by tokens: a stream twice as long takes a turn twice as long.
        ([("a", 200), ("a", 200), ("b", 100), ("b", 100), ("b", 100)], ["a", "b", "b", "a", "b"]),
        # Alone, a tenant is first come first served.
        ([("a", 10), ("a", 500), ("a", 1)], ["a", "a", "a"]),
        # A tenant of weight 2 gets twice the tokens in each round.
        ([("double", 100)] * 4 + [("b", 100)] * 2, ["double", "b", *["double"] * 2, "b", "double"]),
        # Three tenants: round robin.
        ([("a", 1)] * 2 + [("b", 1)] * 2 + [("c", 1)] * 2, ["a", "b", "c", "a", "b", "c"]),
    ],
)  # fmt: skip
def test_tenants_take_turns_by_tokens(arrivals: list[tuple[str, int]], served: list[str]) -> None:
    assert serve_order(arrivals) == served


def test_a_tenant_back_after_its_share_ended_starts_afresh_not_behind_its_past() -> None:
    fair = FairQueue()
    for _ in range(10):  # a burst, all served
        fair.served(fair.tag("heavy", 100))
    late = fair.tag("light", 100)
    again = fair.tag("heavy", 100)
    assert late <= again  # the heavy tenant's past does not buy it a place ahead


def test_streams_under_way_wait_ahead_of_every_tag() -> None:
    line = [Waiter(False, 0.0), Waiter(False, 50.0)]
    assert place_in_line(line, Waiter(True)) == 0
    line.insert(0, Waiter(True))
    assert place_in_line(line, Waiter(True)) == 1  # after those under way already
    assert place_in_line(line, Waiter(False, 10.0)) == 2  # between the tags


def test_flex_streams_wait_behind_every_interactive_one_in_turns_of_their_own() -> None:
    line = [Waiter(True), Waiter(False, 50.0), Waiter(False, 0.0, flex=True)]
    assert place_in_line(line, Waiter(False, 900.0)) == 2  # interactive: before every flex
    assert place_in_line(line, Waiter(False, 0.0, flex=True)) == 3  # equal tags: in turn
    line.append(Waiter(False, 10.0, flex=True))
    assert place_in_line(line, Waiter(False, 5.0, flex=True)) == 3  # by tag among flex
    assert place_in_line(line, Waiter(True)) == 1


def test_a_preempted_flex_stream_waits_ahead_of_new_flex_ones_behind_interactive_ones() -> None:
    line = [Waiter(False, 50.0), Waiter(False, 0.0, flex=True)]
    assert place_in_line(line, Waiter(True, flex=True)) == 1


def test_each_waiting_interactive_stream_stops_the_newest_flex_stream_of_its_model() -> None:
    stopped: list[str] = []
    running = RunningFlex()
    older = running.add("m", lambda: stopped.append("older"))
    running.add("m", lambda: stopped.append("newer"))
    running.add("other", lambda: stopped.append("other"))

    assert running.preempt_one("m")
    running.remove("m", older)  # it ended on its own
    assert not running.preempt_one("m")
    assert not running.preempt_one("none")
    assert stopped == ["newer"]


def test_a_streams_cost_is_its_prompt_and_the_most_it_may_generate() -> None:
    frame = GenerateFrame(type="generate", id="s", model="m", prompt="x" * 400)
    assert stream_cost_tokens(frame) == 100 + DEFAULT_REPLY_TOKENS
    capped = frame.model_copy(update={"max_tokens": 50, "max_tokens_cap": 20})
    assert stream_cost_tokens(capped) == 120
