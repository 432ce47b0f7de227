"""What the side-by-side benchmarks share: where their servers' logs go."""

from __future__ import annotations

from pathlib import Path

from loadtest.bench.harness import logs_dir


def test_logs_asked_for_are_kept_and_others_go_with_the_run(tmp_path: Path) -> None:
    kept = tmp_path / "kept" / "logs"
    with logs_dir(kept) as logs:
        (logs / "gateway.log").write_text("served")
    with logs_dir(None) as scratch:
        (scratch / "gateway.log").write_text("served")

    assert logs == kept
    assert (kept / "gateway.log").read_text() == "served"
    assert not scratch.exists()
