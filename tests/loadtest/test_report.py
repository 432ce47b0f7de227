from __future__ import annotations

from pathlib import Path

import pytest

from loadtest.bench.report import percentile, write_section


def test_sections_are_replaced_in_place_and_others_kept(tmp_path: Path) -> None:
    report = tmp_path / "docs" / "benchmarks.md"
    write_section(report, "a", "first A")
    write_section(report, "b", "first B")
    write_section(report, "a", "second A with $1 and \\1")

    text = report.read_text()
    assert text.startswith("# Benchmarks")
    assert "first A" not in text
    assert "second A with $1 and \\1" in text
    assert text.index("second A") < text.index("first B")
    assert text.count("<!-- bench:a -->") == 1


def test_percentile_by_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 50
    assert percentile(values, 0.99) == 99
    assert percentile(values, 0.0) == 1
    assert percentile([7.0], 0.99) == 7
    with pytest.raises(ValueError):
        percentile([], 0.5)
