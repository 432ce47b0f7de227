from __future__ import annotations

import uvloop

from loadtest.bench.limits import LOADS, render, run


def test_the_benchmark_times_both_paths_under_each_load_and_states_the_goal() -> None:
    results = uvloop.run(run(runs=1, requests=40))  # raises if the store ever fell back

    assert sorted(results) == sorted((path, load) for path in ("local", "shared") for load in LOADS)
    shared = results[("shared", LOADS[0])]
    assert len(shared.admit) == len(shared.auth_check) == len(shared.release) == 40
    assert len(shared.ping) == 40
    assert not results[("local", LOADS[0])].ping  # no store, nothing to ping
    table = render(results, runs=1, requests=40)
    for load in LOADS:
        assert f"| {load} | limit store |" in table
        assert f"| {load} | added by the store, admission p99 |" in table
