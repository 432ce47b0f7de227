from __future__ import annotations

from loadtest.bench.detokenizer import measure, render
from tests.support.tokenizers import backend


def test_the_benchmark_streams_exact_text_and_reports_per_token_costs() -> None:
    measured = measure("llama2", backend("llama2"), length=300, runs=2)  # checks the text

    assert measured.tokens == 300
    assert len(measured.step_seconds) == 600
    table = render([measured], runs=2)
    assert "| llama2 | 300 |" in table
