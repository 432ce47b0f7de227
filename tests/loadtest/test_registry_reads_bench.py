"""The registry-reads benchmark: its DynamoDB arithmetic, and both paths measured end to end."""

from __future__ import annotations

import uvloop

from loadtest.bench.registry_reads import (
    PATHS,
    REFRESH_SECONDS,
    item_bytes,
    page_read_units,
    render,
    run,
)


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


AGENTS = 30  # both paths' reads grow with the pool alike: their ratio needs no bigger one


def test_both_read_paths_see_every_drain_within_a_refresh_and_the_feed_reads_less() -> None:
    results = uvloop.run(run(agents=AGENTS, gateways=3, seconds=8.0))

    scan, feed = (results[path] for path in PATHS)
    assert (scan.readers, feed.readers) == (1, 3)  # a scan is one gateway's cost, times 3
    for seen in (scan, feed):
        assert seen.drains == 2
        assert seen.missed == 0
        assert len(seen.staleness) == seen.drains * seen.readers
        assert max(seen.staleness) < REFRESH_SECONDS
        assert seen.heartbeats > AGENTS  # every agent, once at least
    assert feed.per_second(feed.items) < scan.per_second(scan.items)
    assert feed.per_second(feed.read_units) < scan.per_second(scan.read_units)
    table = render(results, agents=AGENTS)
    assert all(f"| {path} |" in table for path in PATHS)
    assert "staleness goal met" in table
