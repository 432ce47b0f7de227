"""The fault scenarios, at a small size: every stream ends exact or with a clear error.

Synthetic agents here; `make chaos` runs them on vLLM agents too. A vLLM stream moved mid-reply
by a kill -9 is checked in-process, on the suite's shared engine (tests/gateway/test_vllm_failover).
"""

from __future__ import annotations

from loadtest.chaos import run_all, scenarios_for
from loadtest.chaos.stack import StackTimings
from spotgate.settings import RegistryTimings

# Each fault is detected and recovered from as at full size, only sooner: a hung agent's entry
# expires 8 s after its last heartbeat (1 s apart, and above the AWS outage) instead of 30 s,
# its streams move after 5 s without a token, and a gateway drains for 5 s (its in-flight
# 3-second streams still end within it, the long ones still outlive it).
TIMINGS = StackTimings(
    gateway_grace_seconds=5.0,
    stream_stall_seconds=5.0,
    registry=RegistryTimings(agent_ttl_seconds=8.0),
)


async def test_no_stream_is_lost_and_the_pool_recovers_from_every_fault() -> None:
    outcomes = await run_all(
        agents=2, streams=4, aws_down_seconds=3.0, settle_seconds=1.0, timings=TIMINGS
    )
    expected = [name.split(" (")[0] for name in scenarios_for("synthetic")]
    assert [o.name.split(" (")[0] for o in outcomes] == expected
    for outcome in outcomes:
        tally = outcome.tally
        assert tally.started > 0, outcome.name
        assert tally.lost == 0, outcome.name
        assert tally.exact + sum(tally.failed.values()) == tally.started, outcome.name
        assert outcome.recovery_seconds is not None, outcome.name
    by_name = {o.name: o for o in outcomes}
    assert by_name["kill -9 of a serving agent"].tally.resumed > 0  # moved, not restarted
    restart = by_name["gateway restarted (SIGTERM, new process)"].tally
    # Streams in flight finish within the grace; new ones go through the other gateway.
    assert restart.failed.total() == 0
    assert restart.exact > 0
    killed = by_name["kill -9 of one of two gateways"].tally
    assert killed.failed.total() == 0  # its clients resumed their streams through the other
    assert killed.resumed > 0
    long = by_name["SIGTERM of one of two gateways, streams longer than its grace"].tally
    # Websocket clients resumed through the other gateway; SSE clients heard going_away.
    assert long.failed == {"going_away": 2}
    assert long.resumed >= 2
    assert by_name["replacement killed before its first heartbeat"].tally.failed.total() == 0
    store = next(o.tally for o in outcomes if o.name.startswith("limit store (Redis) restarted"))
    assert store.failed.total() == 0  # each replica decides alone meanwhile, then shares again
    assert store.exact > 0
    full = by_name["full pool: a surge of its whole capacity"].tally
    assert full.queued > 0
    assert set(full.failed) <= {"no_capacity", "rate_limited"}
