"""`spotgate sim --model`: several models sharing the pool's spot capacity."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli.main import main

TRACES = Path(__file__).parents[2] / "pool_manager" / "sim" / "traces" / "aws-16node-3zone"
SHORT = ["sim", "--traces", str(TRACES), "--windows", "1", "--window-hours", "3"]


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ("chat", "is not NAME=TARGET[:LOAD[:TYPE,TYPE...]]"),
        ("=2", "is not NAME=TARGET"),
        ("chat=2:0.5:p3.2xlarge:4", "is not NAME=TARGET"),
        ("chat=two", "'two' is not a whole number"),
        ("chat=2:-1", "'-1' must be zero or more"),
        ("chat=2:0.5:p3.2xlarge,", "an empty instance type"),
    ],
)
def test_a_malformed_model_spec_exits_2_saying_what_is_wrong(
    spec: str, reason: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main([*SHORT, "--model", spec])
    assert exited.value.code == 2
    assert reason in capsys.readouterr().err


@pytest.mark.parametrize(
    ("specs", "reason"),
    [
        (["chat=2:0.5:g5.xlarge"], "no spot trace for instance type g5.xlarge"),
        (["chat=2", "chat=1"], "--model chat given more than once"),
    ],
)
def test_a_model_the_traces_cannot_place_exits_2(
    specs: list[str], reason: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*SHORT, *[arg for spec in specs for arg in ("--model", spec)]]) == 2
    assert reason in capsys.readouterr().err


def test_each_model_gets_its_own_figures_with_the_default_load(
    capsys: pytest.CaptureFixture[str],
) -> None:
    models = ["--model", "chat=2:0.8:p3.2xlarge", "--model", "batch=1", "--load", "0"]
    assert main([*SHORT, *models, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    chat, batch = result["models"]
    assert (chat["name"], chat["target"], batch["name"], batch["target"]) == ("chat", 2, "batch", 1)
    assert chat["streams_started"] > 0
    assert batch["streams_started"] == 0  # --load 0 is its load
    assert result["launches"] == chat["launches"] + batch["launches"]
    assert main([*SHORT, *models]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert [row.split()[0] for row in rows[1:-1]] == ["spotgate", "chat", "batch"]


def boots_file(tmp_path: Path, warm_seconds: float) -> Path:
    """`spotgate pool boots --json` as it lists a cold boot and a warm start."""
    listed = [
        {"agent_id": "i-1", "kind": "cold", "phases_seconds": {}, "cold_start_seconds": 200.0},
        {
            "agent_id": "i-2",
            "kind": "warm",
            "phases_seconds": {},
            "warm_start_seconds": warm_seconds,
        },
    ]
    path = tmp_path / f"boots-{warm_seconds:.0f}.json"
    path.write_text(json.dumps(listed))
    return path


def test_observed_boots_feed_the_cold_and_the_warm_starts_by_their_kind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    day = ["sim", "--traces", str(TRACES), "--windows", "1", "--window-hours", "24", "--json"]
    warm_pool = [*day, "--warm-pool", "3", "--target", "3"]
    runs = {}
    for warm_seconds in (30.0, 600.0):
        assert main([*warm_pool, "--boots", str(boots_file(tmp_path, warm_seconds))]) == 0
        runs[warm_seconds] = json.loads(capsys.readouterr().out)
    assert runs[30.0]["warm_starts"] > 0
    assert runs[30.0]["availability"] > runs[600.0]["availability"]  # the warm boot counted
    assert runs[30.0]["stopped_hours"] > 0
    # without a warm pool only the cold boot counts: the warm one changes nothing
    plain = [main([*day, "--boots", str(boots_file(tmp_path, w))]) for w in (30.0, 600.0)]
    first, second = (json.loads(out) for out in capsys.readouterr().out.splitlines())
    assert plain == [0, 0]
    assert first == second
    assert first["warm_starts"] == 0


def test_a_boot_of_an_unknown_kind_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    odd = tmp_path / "boots.json"
    odd.write_text(json.dumps([{"kind": "lukewarm", "lukewarm_start_seconds": 5}]))
    assert main([*SHORT, "--boots", str(odd)]) == 2
    assert "not a list of boots" in capsys.readouterr().err


def test_regions_limit_the_placements_and_the_output_names_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main([*SHORT, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["regions"] == ["us-east-2", "us-west-2"]
    assert main([*SHORT, "--regions", "us-west-2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["regions"] == ["us-west-2"]
    assert main([*SHORT, "--regions", "us-west-2"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "regions: us-west-2"


def test_a_region_the_traces_lack_exits_2_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SHORT, "--regions", "us-west-2,us-east-1"]) == 2
    reason = "--regions us-east-1: not a region of these traces (theirs: us-east-2, us-west-2)"
    assert reason in capsys.readouterr().err


def test_an_empty_region_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main([*SHORT, "--regions", "us-west-2,"])
    assert exited.value.code == 2
    assert "'us-west-2,': an empty region" in capsys.readouterr().err


def test_batch_work_says_when_each_policy_got_it_done(capsys: pytest.CaptureFixture[str]) -> None:
    batch = ["--batch-stream-hours", "150", "--batch-window-hours", "3"]
    assert main([*SHORT, "--policy", "spotgate,even-spread", *batch]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-2].startswith("batch work, spotgate: done after ")
    assert lines[-1] == "batch work, even-spread: not done within the span"
    assert main([*SHORT, "--json", *batch]) == 0
    assert json.loads(capsys.readouterr().out)["batch_stream_hours"] == 150
