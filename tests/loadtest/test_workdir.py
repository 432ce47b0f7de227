"""Where a benchmark keeps its files: logs kept when asked, scratch space gone after."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from loadtest.bench.workdir import add_logs_option, logs_dir, print_log_tails, scratch_dir


def test_logs_asked_for_are_kept_and_others_go_with_the_run(tmp_path: Path) -> None:
    kept = tmp_path / "kept" / "logs"
    with logs_dir(kept) as logs:
        (logs / "gateway.log").write_text("served")
    with logs_dir(None) as scratch:
        (scratch / "gateway.log").write_text("served")

    assert logs == kept
    assert (kept / "gateway.log").read_text() == "served"
    assert not scratch.exists()


def test_scratch_space_is_removed_with_what_was_written_there() -> None:
    with scratch_dir() as scratch:
        (scratch / "model").mkdir()
        (scratch / "model" / "config.json").write_text("{}")

    assert not scratch.exists()


def test_the_logs_option_names_a_directory_and_is_none_when_not_given() -> None:
    parser = argparse.ArgumentParser()
    add_logs_option(parser)

    assert parser.parse_args(["--logs", "runs/today"]).logs == Path("runs/today")
    assert parser.parse_args([]).logs is None


def test_a_failed_start_shows_the_last_lines_of_each_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "agent.log").write_text("\n".join(f"line {n}" for n in range(50)))
    (tmp_path / "notes.txt").write_text("not a log")

    print_log_tails(tmp_path, lines=2)

    assert capsys.readouterr().err == "--- agent.log (last lines)\nline 48\nline 49\n"
