"""The routing benchmarks' stack: where its agents run."""

from __future__ import annotations

from loadtest.bench.routing_stack import placement


def test_agents_get_a_cpu_each_and_share_when_there_are_more_agents_than_cpus() -> None:
    assert placement(2, [0, 1])[0] == [0, 1]
    cpus, sentence = placement(3, [4, 5])
    assert cpus == [4, 5, 4]
    assert "agent 3 to CPU 4 (agents share CPUs" in sentence
