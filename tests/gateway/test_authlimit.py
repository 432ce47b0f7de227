"""Failed authentications per client address and per key id: a pure policy over a clock."""

from __future__ import annotations

import pytest

from gateway import authlimit
from gateway.authlimit import FailedAuthLimiter

NOW = 1_800_000_000.0


def fail(
    limiter: FailedAuthLimiter, times: int, client: str, key_id: str | None, now: float = NOW
) -> None:
    for _ in range(times):
        limiter.failed(client, key_id, now)


def test_a_client_is_refused_after_its_budget_and_others_are_not() -> None:
    limiter = FailedAuthLimiter(per_client_per_minute=5, per_key_per_minute=100)
    fail(limiter, 4, "10.0.0.1", None)
    assert limiter.check("10.0.0.1", None, NOW).admitted
    fail(limiter, 1, "10.0.0.1", None)

    refused = limiter.check("10.0.0.1", None, NOW)
    assert not refused.admitted
    assert "this client" in refused.reason
    assert refused.retry_after == pytest.approx(60 / 5)  # one attempt back per 12 s
    assert limiter.check("10.0.0.2", None, NOW).admitted
    assert limiter.check("10.0.0.1", None, NOW + 12).admitted


def test_a_key_id_is_refused_after_failures_from_many_clients() -> None:
    limiter = FailedAuthLimiter(per_client_per_minute=5, per_key_per_minute=10)
    for n in range(10):
        limiter.failed(f"10.0.1.{n}", "0123456789ab", NOW)

    refused = limiter.check("10.9.9.9", "0123456789ab", NOW)
    assert not refused.admitted
    assert "this API key" in refused.reason
    assert limiter.check("10.9.9.9", "ba9876543210", NOW).admitted
    assert limiter.check("10.9.9.9", None, NOW).admitted


def test_buckets_are_bounded_and_refilled_ones_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(authlimit, "MAX_TRACKED_BUCKETS", 100)
    limiter = FailedAuthLimiter(per_client_per_minute=5, per_key_per_minute=5)
    for n in range(100):
        limiter.failed(f"10.1.0.{n}", None, NOW)
    assert limiter.tracked == 100

    limiter.failed("10.2.0.1", None, NOW + 60)  # the first hundred refilled by now
    assert limiter.tracked == 1

    for n in range(150):  # none refills in time: the oldest are dropped instead
        limiter.failed(f"10.3.0.{n}", None, NOW + 61)
    assert limiter.tracked <= 100
    fail(limiter, 5, "10.4.0.1", None, NOW + 61)
    assert not limiter.check("10.4.0.1", None, NOW + 61).admitted
