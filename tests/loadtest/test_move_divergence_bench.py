"""The move-divergence benchmark counts continuations that differ from the unmoved reply."""

from __future__ import annotations

import argparse
import random

from gpu_agent.synthetic_engine import SyntheticEngine
from loadtest.bench.move_divergence import Divergence, measure, render
from spotgate.settings import AgentSettings, SyntheticSettings


async def test_an_engine_whose_numerics_ignore_the_batch_never_differs() -> None:
    pace = SyntheticSettings(ttft_seconds=0.0, tokens_per_second=5_000)
    engine = SyntheticEngine(AgentSettings(engine="synthetic", synthetic=pace))

    results = await measure(engine, prompts=3, load=2, tokens=20, rng=random.Random(1))

    assert len(results) == 3
    assert all(0 < r.cut < 20 and r.first_difference is None for r in results)


def test_the_report_counts_what_differs_and_where() -> None:
    args = argparse.Namespace(prompts=3, load=8, tokens=128, batch_invariant=False)
    results = [Divergence(10, None), Divergence(40, 52), Divergence(7, 70)]

    section = render(results, args)

    assert "| 3 | 2 | 61 |" in section
    assert "batch-invariant mode off" in section
