"""The prefix-routing benchmark's report: a table per pool size, the goal judged from it."""

from __future__ import annotations

from loadtest.bench.prefix_routing import PoolRun, Setup, render
from loadtest.bench.routing_modes import MODES, Calibration, ModeSample


def _sample(ttft_ms: float, queried: float, hit: float) -> ModeSample:
    return ModeSample(
        tokens_per_second=50.0,
        total_tokens=500,
        wall_seconds=10.0,
        ttfts_seconds=[ttft_ms / 1000] * 40,
        prompt_tokens=[700, 1900],
        queried_tokens=queried,
        hit_tokens=hit,
    )


SETUP = Setup(
    agents=2, runs=2, conversations=16, turns=5, concurrency=4, max_tokens=24, placement="."
)
CALIBRATION = Calibration(
    fresh_tokens=2000, fresh_ttft_seconds=0.8, new_tokens=300, cached_ttft_seconds=0.2
)


def test_the_table_has_a_row_per_mode_and_judges_the_goal_from_it() -> None:
    results = {
        "least load": [_sample(900, 1000, 400), _sample(1000, 1000, 500)],
        "explicit sessions": [_sample(500, 1000, 800), _sample(520, 1000, 800)],
        "prefix-aware": [_sample(600, 1000, 850), _sample(600, 1000, 790)],
    }

    table = render([PoolRun(SETUP, results, CALIBRATION)])

    assert "| least load | 45.0% | 40.0%, 50.0% | 900 | 1000 | 50.0 | 80 | 0 |" in table
    assert "| prefix-aware | 82.0% | 85.0%, 79.0% | 600 |" in table
    assert "82.0% vs 80.0% (1.02×): **met**" in table
    assert "600 vs 900 ms (0.67×, -33%): **met**" in table
    assert "### 2 agents" in table
    assert "Prompts of 700–1,900 tokens" in table
    assert "2,000-token prompt's TTFT was 800 ms" in table


def test_without_the_agents_counters_the_hit_rate_is_not_judged() -> None:
    results = {mode.name: [_sample(700, 0, 0)] for mode in MODES}

    table = render([PoolRun(SETUP, results, CALIBRATION)])

    assert "| least load | — | — | 700 |" in table
    assert "**not judged**" in table
    assert "700 vs 700 ms (1.00×, +0%): **not met**" in table
