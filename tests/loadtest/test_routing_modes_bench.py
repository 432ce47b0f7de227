"""Measuring routing modes: the agents' prefix-cache counters as the runs read them."""

from __future__ import annotations

from loadtest.bench.harness import metric_value
from loadtest.bench.routing_modes import HIT_COUNTER, QUERIED_COUNTER


def test_counters_are_summed_over_labels_and_read_as_zero_when_absent() -> None:
    text = "\n".join(
        [
            f"# HELP {QUERIED_COUNTER} prompt tokens looked up",
            f"# TYPE {QUERIED_COUNTER} counter",
            f"{QUERIED_COUNTER} 1200.0",
            'spotgate_gateway_agents{state="ready"} 2.0',
            'spotgate_gateway_agents{state="gone"} 1.0',
        ]
    )

    assert metric_value(text, QUERIED_COUNTER) == 1200
    assert metric_value(text, HIT_COUNTER) == 0
    assert metric_value(text, 'spotgate_gateway_agents{state="ready"}') == 2
    assert metric_value(text, "spotgate_gateway_agents") == 3
