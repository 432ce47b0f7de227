"""The registry-reads benchmark: its DynamoDB arithmetic, and both paths measured end to end."""

from __future__ import annotations

import uvloop

from loadtest.bench.registry_reads import PATHS, item_bytes, page_read_units, render, run


def test_items_are_sized_and_pages_charged_as_dynamodb_does() -> None:
    # Names count, strings by their UTF-8 bytes, numbers by 1 + half their significant digits.
    assert item_bytes({"url": {"S": "ws://é"}}) == 3 + 7
    assert item_bytes({"active": {"N": "12345"}, "ok": {"BOOL": True}}) == 6 + 4 + 2 + 1
    item = {"blob": {"S": "x" * 2044}}  # 2,048 bytes
    assert page_read_units([], scanned=0) == 0.5  # a query that finds nothing still costs
    assert page_read_units([item, item], scanned=2) == 0.5
    assert page_read_units([item, item, item], scanned=3) == 1.0
    # A scan pays for what its filter dropped too.
    assert page_read_units([item], scanned=4) == 1.0


def test_both_read_paths_see_every_drain_and_the_feed_reads_less() -> None:
    results = uvloop.run(run(runs=1, agents=120, gateways=2, seconds=7.0))

    scan, feed = (results[path] for path in PATHS)
    for seen in (scan, feed):
        assert seen.drains >= 1
        assert seen.missed == 0
        assert len(seen.staleness) == seen.drains * 2  # each seen by both gateways
        assert seen.heartbeats > 0
    assert feed.items < scan.items
    table = render(results, runs=1, agents=120, gateways=2)
    assert all(f"| {path} |" in table for path in PATHS)
