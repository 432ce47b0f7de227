"""The batch-and-fair-share benchmark's pure parts: its keys and its tables."""

from __future__ import annotations

from loadtest.bench.batch_share import LIGHT_TENANTS, WindowSample, _keys, render


def test_light_keys_come_in_pairs_of_their_own_tenant_and_the_heavy_ones() -> None:
    keys = {key.name: key.tenant for key in _keys()}
    assert keys["heavy"] == "heavy"
    assert all(keys[f"light-{n}"] is None for n in range(LIGHT_TENANTS))
    assert all(keys[f"fifo-light-{n}"] == "heavy" for n in range(LIGHT_TENANTS))


def test_the_tables_set_each_mode_beside_its_baseline_with_the_ratios() -> None:
    windows = {
        False: [WindowSample([0.1] * 100, None), WindowSample([0.1] * 98 + [0.2] * 2, None)],
        True: [WindowSample([0.1] * 98 + [0.3] * 2, 0.95), WindowSample([0.1] * 100, 0.9)],
    }
    fair = {False: [[0.2] * 30, [0.3] * 30], True: [[5.0] * 30, [6.0] * 30]}

    across = {True: [[0.4] * 30, [0.5] * 30], False: [[9.0] * 30, [9.0] * 30]}

    section = render(windows, fair, across, 30.0, 2)

    assert "| interactive alone | 100 / 100 | 150 / 200 | 200 |" in section
    assert "| interactive beside the batch | 100 / 100 | 200 / 300 | 200 |" in section
    assert "median 1.75×, worst 3.00× (goal ≤ 1.2×)" in section  # 0.3/0.1 and 0.1/0.2
    assert "median 92%, worst 90%" in section
    assert "| first come, first served | 5,500 / 6,000 | 5,500 / 6,000 | 60 |" in section
    assert "median 0.05× (250 against 5,500 ms)" in section
    assert "| two, turns shared through the limit store | 450 / 500 | 450 / 500 | 60 |" in section
    assert "| two, each alone (no limit store) | 9,000 / 9,000 | 9,000 / 9,000 | 60 |" in section
