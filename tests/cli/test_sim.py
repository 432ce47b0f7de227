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
    assert [row.split()[0] for row in rows[1:]] == ["spotgate", "chat", "batch"]
