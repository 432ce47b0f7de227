from __future__ import annotations

from collections import Counter

import pytest

from gateway.router import Candidate, PrefixAffinity, choose_agent
from spotgate.registry import AgentState

NOW = 1000.0


def agent(
    agent_id: str,
    outstanding: int = 0,
    capacity: int = 10,
    state: AgentState = AgentState.READY,
    expires_at: float = NOW + 30,
    reported: int = 0,
    full: bool = False,
    adapters: frozenset[str] = frozenset(),
    remote: bool = False,
) -> Candidate:
    return Candidate(
        agent_id, state, capacity, outstanding, expires_at, reported, full, adapters, remote
    )


def chosen(candidates: list[Candidate], **kwargs: object) -> str | None:
    result = choose_agent(candidates, now=NOW, **kwargs)  # type: ignore[arg-type]
    return result.agent_id if result else None


def test_least_loaded_relative_to_capacity() -> None:
    assert chosen([agent("a", 5, 10), agent("b", 3, 4), agent("c", 6, 20)]) == "c"


@pytest.mark.parametrize(
    "unroutable",
    [
        agent("x", state=AgentState.DRAINING),
        agent("x", state=AgentState.STARTING),
        agent("x", state=AgentState.GONE),
        agent("x", expires_at=NOW),  # stale: heartbeat stopped
        agent("x", outstanding=10),  # full
        agent("x", full=True),  # it refused a stream for capacity: other gateways fill it
    ],
)
def test_never_routes_to_draining_stale_or_full_agents(unroutable: Candidate) -> None:
    assert chosen([unroutable]) is None
    assert chosen([unroutable], session="s") is None
    assert chosen([unroutable, agent("ok", 9)]) == "ok"


def test_excluded_agents_are_skipped() -> None:
    assert chosen([agent("a"), agent("b", 5)], exclude={"a"}) == "b"


def test_session_affinity_is_stable_and_spreads_sessions() -> None:
    pool = [agent(f"agent-{n}") for n in range(4)]
    picks = {f"s{n}": chosen(pool, session=f"s{n}") for n in range(200)}
    assert picks == {f"s{n}": chosen(pool, session=f"s{n}") for n in range(200)}
    assert set(Counter(picks.values())) == {f"agent-{n}" for n in range(4)}
    assert min(Counter(picks.values()).values()) > 25


def test_affinity_ignores_load_while_the_preferred_agent_has_room() -> None:
    preferred = chosen([agent("a"), agent("b")], session="chat-1")
    busy = [agent(a, outstanding=9 if a == preferred else 0) for a in ("a", "b")]
    assert chosen(busy, session="chat-1") == preferred


def test_full_preferred_agent_spills_to_the_next_in_its_ranking() -> None:
    pool = [agent(f"agent-{n}") for n in range(5)]
    preferred = chosen(pool, session="s")
    full = [agent(c.agent_id, outstanding=10 if c.agent_id == preferred else 0) for c in pool]
    spill = chosen(full, session="s")
    assert spill not in (None, preferred)
    # Removing the preferred agent moves the session to the same place.
    assert chosen([c for c in pool if c.agent_id != preferred], session="s") == spill


def test_adding_an_agent_moves_few_sessions() -> None:
    before = [agent(f"agent-{n}") for n in range(4)]
    after = [*before, agent("agent-new")]
    moved = sum(
        chosen(before, session=f"s{n}") != chosen(after, session=f"s{n}") for n in range(400)
    )
    assert moved < 400 * 0.35  # about 1/5 move; a modulo hash would move about 4/5


def test_what_an_agent_reports_orders_agents_but_only_its_refusal_fills_it() -> None:
    # `b` reported 9 of 10 busy (other gateways' streams): `a`, with more of ours, is lighter.
    assert chosen([agent("a", outstanding=4), agent("b", outstanding=1, reported=9)]) == "a"
    # A report a heartbeat old does not stop routing: the agent itself refuses when full.
    assert chosen([agent("b", outstanding=1, reported=10)]) == "b"


def affinity(
    matched: dict[str, int], conversation: str = "c", skew: float = 0.25
) -> PrefixAffinity:
    return PrefixAffinity(matched, conversation, skew)


@pytest.mark.parametrize(
    ("pool", "matched", "expected"),
    [
        # The longest matched prefix wins while its agent is within the skew of the least loaded.
        ([agent("a", 2), agent("b", 0)], {"a": 5, "b": 1}, "a"),
        ([agent("a", 2), agent("b", 0), agent("c", 1)], {"a": 1, "b": 0, "c": 7}, "c"),
        # Two busier than the least loaded, of 10: 0.2 ≤ 0.25, still chosen.
        ([agent("a", 2), agent("b", 0)], {"a": 5}, "a"),
        # Three busier: 0.3 > 0.25, the hot prefix spills to the least loaded.
        ([agent("a", 3), agent("b", 0)], {"a": 5}, "b"),
        # Exactly at the bound stays (no float rounding pushes it out): 0.7 vs 0.45 + 0.25.
        ([agent("a", 7, 10), agent("b", 9, 20)], {"a": 5}, "a"),
        # Spill goes to the next longest match within the bound, not just the least loaded.
        ([agent("a", 9), agent("b", 1), agent("c", 0)], {"a": 9, "b": 4, "c": 0}, "b"),
        # Load is a share of capacity, and other gateways' streams count (`reported`).
        ([agent("a", 1, reported=6), agent("b", 2)], {"a": 5}, "b"),
        ([agent("a", 10, 40), agent("b", 1, 4)], {"a": 5}, "a"),
        # Full, excluded or unroutable agents never win, however long their match.
        ([agent("a", 10), agent("b", 9)], {"a": 50}, "b"),
        ([agent("a", full=True), agent("b", 5)], {"a": 50}, "b"),
        ([agent("a", state=AgentState.DRAINING), agent("b", 5)], {"a": 50}, "b"),
    ],
)
def test_prefix_affinity_scores_matched_prefix_within_a_load_skew(
    pool: list[Candidate], matched: dict[str, int], expected: str
) -> None:
    assert chosen(pool, affinity=affinity(matched)) == expected


def test_a_resumed_stream_goes_where_its_prefix_was_sent_not_back_to_the_failed_agent() -> None:
    pool = [agent("failed", 0), agent("cached", 2), agent("idle", 0)]
    matched = {"failed": 12, "cached": 12, "idle": 0}
    assert chosen(pool, affinity=affinity(matched), exclude={"failed"}) == "cached"


def test_unmatched_prompts_spread_by_conversation_and_agree_across_gateways() -> None:
    pool = [agent(f"agent-{n}") for n in range(4)]
    picks = {n: chosen(pool, affinity=affinity({}, f"conv-{n}")) for n in range(200)}
    # Another gateway that never saw these conversations sends each to the same agent.
    assert picks == {n: chosen(pool, affinity=affinity({}, f"conv-{n}")) for n in range(200)}
    assert min(Counter(picks.values()).values()) > 25
    # A shared prefix every agent holds (a common system prompt) leaves the spread as it was.
    shared = {f"agent-{n}": 3 for n in range(4)}
    assert picks == {n: chosen(pool, affinity=affinity(shared, f"conv-{n}")) for n in range(200)}


def test_an_explicit_session_outranks_the_prefix() -> None:
    pool = [agent("a"), agent("b")]
    preferred = chosen(pool, session="s")
    other = "b" if preferred == "a" else "a"
    assert chosen(pool, session="s", affinity=affinity({other: 99})) == preferred


def test_with_zero_skew_the_prefix_only_breaks_ties_of_load() -> None:
    pool = [agent("a", 1), agent("b", 0), agent("c", 0)]
    assert chosen(pool, affinity=affinity({"a": 9, "c": 2}, skew=0.0)) == "c"


ADAPTER_CASES = {
    "goes where the adapter was sent, though busier": (
        [agent("a", outstanding=1), agent("b", outstanding=5, adapters=frozenset({"x"}))], "b"),
    "the least loaded of those that have it": (
        [agent("a", 3, adapters=frozenset({"x"})), agent("b", 1, adapters=frozenset({"x", "y"})),
         agent("c")], "b"),
    "where it was sent is full: anywhere with room": (
        [agent("a", outstanding=10, adapters=frozenset({"x"})), agent("b", outstanding=2)], "b"),
    "sent nowhere yet: the least loaded": (
        [agent("a", outstanding=4, adapters=frozenset({"y"})), agent("b", outstanding=2)], "b"),
}  # fmt: skip


@pytest.mark.parametrize(("candidates", "expected"), ADAPTER_CASES.values(), ids=ADAPTER_CASES)
def test_a_stream_with_an_adapter_prefers_an_agent_it_was_sent_to(
    candidates: list[Candidate], expected: str
) -> None:
    assert chosen(candidates, adapter="x") == expected
    assert chosen(candidates) != "b" or expected == "b"  # without one, load alone decides


@pytest.mark.parametrize(
    ("pool", "matched", "expected"),
    [
        # At equal load the gateway's own region goes first, whatever the names' order.
        ([agent("a", 1, remote=True), agent("b", 1)], None, "b"),
        ([agent("a", 0, remote=True), agent("b", 0), agent("c", 0, remote=True)], None, "b"),
        # A remote agent less loaded, or the one with room, is chosen.
        ([agent("a", 0, remote=True), agent("b", 1)], None, "a"),
        ([agent("a", 3, remote=True), agent("b", 10)], None, "a"),
        ([agent("a", remote=True), agent("b", state=AgentState.DRAINING)], None, "a"),
        # With a prefix: the longest match first, then the own region, within the skew.
        ([agent("a", 0, remote=True), agent("b", 1)], {"a": 2, "b": 2}, "b"),
        ([agent("a", 0, remote=True), agent("b", 1)], {"a": 3, "b": 2}, "a"),
    ],
)
def test_an_agent_in_the_gateways_own_region_goes_first_at_equal_load(
    pool: list[Candidate], matched: dict[str, int] | None, expected: str
) -> None:
    assert chosen(pool, affinity=affinity(matched) if matched else None) == expected
