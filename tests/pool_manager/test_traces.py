from __future__ import annotations

import json
from pathlib import Path

import pytest

from pool_manager.sim.traces import (
    BUNDLED_TRACES_DIR,
    TraceError,
    in_regions,
    load_trace,
    load_traces,
    trace_regions,
)


def write(directory: Path, name: str, data: list[int], gap: float = 300) -> Path:
    path = directory / name
    path.write_text(json.dumps({"metadata": {"gap_seconds": gap}, "data": data}))
    return path


def test_zone_and_instance_type_come_from_the_file_name(tmp_path: Path) -> None:
    trace = load_trace(write(tmp_path, "us-east-2b_v100_1.json", [3, 0, 16]))
    assert (trace.zone, trace.instance_type) == ("us-east-2b", "p3.2xlarge")
    assert trace.duration_seconds == 900
    assert [trace.capacity_at(s) for s in (0, 299, 300, 600, 5000)] == [3, 3, 0, 16, 16]


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("not json", "not a spot trace"),
        ('{"data": [1]}', "not a spot trace"),
        ('{"metadata": {"gap_seconds": 0}, "data": [1]}', "positive gap_seconds"),
        ('{"metadata": {"gap_seconds": 300}, "data": [1, -1]}', "non-negative"),
        ('{"metadata": {"gap_seconds": 300}, "data": []}', "non-negative"),
    ],
)
def test_bad_trace_files_are_refused_with_the_reason(
    tmp_path: Path, content: str, reason: str
) -> None:
    path = tmp_path / "zone_v100_1.json"
    path.write_text(content)
    with pytest.raises(TraceError, match=reason):
        load_trace(path)


def test_a_directory_without_traces_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"no \*\.json"):
        load_traces(tmp_path)
    with pytest.raises(TraceError, match="no such directory"):
        load_traces(tmp_path / "missing")


def test_bundled_traces_are_the_published_sets() -> None:
    three = load_traces(BUNDLED_TRACES_DIR / "aws-16node-3zone")
    nine = load_traces(BUNDLED_TRACES_DIR / "aws-1node-9zone")
    assert [t.zone for t in three] == ["us-east-2b", "us-west-2a", "us-west-2c"]
    assert len(nine) == 9
    assert max(max(t.capacity) for t in three) == 16
    assert max(max(t.capacity) for t in nine) == 1


def test_a_zones_region_is_its_name_less_the_zone_letter() -> None:
    nine = load_traces(BUNDLED_TRACES_DIR / "aws-1node-9zone")
    assert trace_regions(nine) == ("us-east-1", "us-east-2", "us-west-2")
    assert {t.zone: t.region for t in nine}["us-east-1f"] == "us-east-1"


def test_the_traces_of_some_regions_are_those_regions_zones_only() -> None:
    nine = load_traces(BUNDLED_TRACES_DIR / "aws-1node-9zone")
    west_and_ohio = in_regions(nine, {"us-west-2", "us-east-2"})
    assert [t.zone for t in west_and_ohio] == [
        "us-east-2a",
        "us-east-2b",
        "us-west-2a",
        "us-west-2b",
        "us-west-2c",
    ]
    with pytest.raises(TraceError, match=r"eu-west-1: not a region of these traces \(theirs: us-e"):
        in_regions(nine, {"us-east-1", "eu-west-1"})
