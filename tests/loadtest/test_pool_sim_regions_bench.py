from __future__ import annotations

from loadtest.bench.pool_sim_regions import region_jobs, region_lines, run_region_job
from loadtest.bench.pool_sim_runs import MARGIN_ROW, REFERENCE_ROW, SEEDS, bundled_traces


def test_each_trace_sets_regions_run_alone_and_together() -> None:
    jobs = region_jobs()
    regions = sorted({(trace_set, regions) for trace_set, regions, _, _ in jobs})
    assert regions == [
        ("aws-16node-3zone", ()),
        ("aws-16node-3zone", ("us-east-2",)),
        ("aws-16node-3zone", ("us-west-2",)),
        ("aws-1node-9zone", ()),
        ("aws-1node-9zone", ("us-east-1",)),
        ("aws-1node-9zone", ("us-east-2",)),
        ("aws-1node-9zone", ("us-west-2",)),
    ]
    assert len(jobs) == len(regions) * 2 * len(SEEDS)  # SpotHedge and spotgate, each seed
    assert [t.zone for t in bundled_traces("aws-1node-9zone", ("us-east-1",))] == [
        "us-east-1a",
        "us-east-1c",
        "us-east-1d",
        "us-east-1f",
    ]


def test_the_table_pairs_spotgate_with_spothedge_on_the_same_zones() -> None:
    one_region = ("aws-16node-3zone", ("us-west-2",))
    result = run_region_job((*one_region, REFERENCE_ROW, SEEDS[0]))
    results = {job: result for job in region_jobs()}  # every run alike: no gain, no cost

    lines = region_lines(results)

    row = next(line for line in lines if line.startswith("| aws-16node-3zone | us-west-2 (2) |"))
    assert row.endswith("| +0.000 | +0.00 | no |")
    assert f"| SpotHedge | {MARGIN_ROW} |" in "\n".join(lines)
    assert any("| all: us-east-2, us-west-2 (3) |" in line for line in lines)
    cost = f"{result.cost_vs_on_demand * 100:.1f} %"
    summary = f"- aws-16node-3zone: {REFERENCE_ROW}: {cost} of on-demand over all 2 regions"
    assert lines[-2].startswith(summary)
