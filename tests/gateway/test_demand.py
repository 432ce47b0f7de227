from __future__ import annotations

from gateway.demand import Published, current_demand, rows_due
from gateway.dispatch import PoolView
from spotgate.registry import AgentRecord, AgentState, BatchBacklog, Demand

TTL_SECONDS = 30.0  # keep-alive after a third of it: 10 s


def view_of(*agents: tuple[str, str]) -> PoolView:
    view = PoolView()
    records = [
        AgentRecord(
            agent_id=a,
            url=f"http://{a}",
            model=m,
            state=AgentState.READY,
            capacity=8,
            expires_at=TTL_SECONDS,
        )
        for a, m in agents
    ]
    view.replace(records, now=0.0)
    return view


def test_current_demand_sums_streams_per_model_and_lists_configured_models() -> None:
    view = view_of(("a1", "m1"), ("a2", "m1"), ("b1", "m2"))

    demand = current_demand(
        {"m3": 2}, {"a1": 3, "a2": 1, "gone": 5}, view, ["m4"], running_flex={}, backlogs={}
    )

    assert demand == {
        "m1": Demand(pending=0, active=4),
        "m2": Demand(pending=0, active=0),
        "m3": Demand(pending=2, active=0),
        "m4": Demand(pending=0, active=0),
    }


def test_flex_streams_are_not_demand_and_a_batch_backlog_is_published_with_its_model() -> None:
    view = view_of(("a1", "m1"), ("b1", "m2"))
    backlog = BatchBacklog(stream_seconds=600.0, due_at=86_400.0)

    demand = current_demand(
        {"m1": 1},
        {"a1": 5, "b1": 2},
        view,
        [],
        running_flex={"m1": 3, "m2": 4},
        backlogs={"m1": backlog, "m5": backlog},
    )

    assert demand == {
        "m1": Demand(pending=1, active=2, backlog=backlog),  # 5 running, 3 of them flex
        "m2": Demand(pending=0, active=0),  # never below none
        "m5": Demand(backlog=backlog),  # no agent yet: its backlog asks for some
    }


def test_rows_are_due_when_new_or_changed() -> None:
    current = {"same": Demand(1, 2), "changed": Demand(0, 3), "new": Demand(0, 0)}
    published = {
        "same": Published(Demand(1, 2), at=100.0),
        "changed": Published(Demand(0, 2), 100.0),
    }

    assert rows_due(current, published, now=101.0, ttl_seconds=TTL_SECONDS) == ["changed", "new"]


def test_an_unchanged_row_is_rewritten_before_it_can_expire() -> None:
    current = {"m": Demand(0, 0)}
    published = {"m": Published(Demand(0, 0), at=100.0)}

    assert rows_due(current, published, now=109.9, ttl_seconds=TTL_SECONDS) == []
    assert rows_due(current, published, now=110.0, ttl_seconds=TTL_SECONDS) == ["m"]
