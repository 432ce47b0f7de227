from __future__ import annotations

import pytest

from gateway.ratelimit import Limits, RateLimiter, prompt_tokens_estimate


def test_requests_per_minute_refill_continuously() -> None:
    limiter = RateLimiter()
    limits = Limits(rpm=60)
    for _ in range(60):
        assert limiter.admit("k", limits, now=0.0).admitted
        limiter.finish("k", 0, now=0.0)

    refused = limiter.admit("k", limits, now=0.0)
    assert not refused.admitted
    assert "60 requests per minute" in refused.reason
    assert refused.retry_after == pytest.approx(1.0)
    assert limiter.admit("k", limits, now=1.0).admitted


def test_tokens_are_charged_at_the_end_and_the_debt_must_be_repaid() -> None:
    limiter = RateLimiter()
    limits = Limits(tpm=600)
    assert limiter.admit("k", limits, now=0.0).admitted
    limiter.finish("k", 900, now=0.0)  # overdrew by 300 tokens

    refused = limiter.admit("k", limits, now=0.0)
    assert not refused.admitted
    assert refused.retry_after == pytest.approx(30.0)  # 300 tokens at 10 per second
    assert not limiter.admit("k", limits, now=29.0).admitted
    assert limiter.admit("k", limits, now=30.0).admitted


def test_a_prompt_is_charged_at_admission_and_settled_at_the_end() -> None:
    limiter = RateLimiter()
    limits = Limits(tpm=600)
    assert limiter.admit("k", limits, now=0.0, tokens=900).admitted  # the bucket was full
    refused = limiter.admit("k", limits, now=0.0, tokens=10)  # sees the first prompt
    assert not refused.admitted
    assert refused.retry_after == pytest.approx(30.0)
    limiter.finish("k", -900, now=0.0)  # no agent took it: the estimate comes back
    assert limiter.admit("k", limits, now=0.0).admitted


@pytest.mark.parametrize(("chars", "tokens"), [(0, 0), (1, 1), (4, 1), (5, 2), (400_000, 100_000)])
def test_a_prompt_is_estimated_at_four_characters_a_token(chars: int, tokens: int) -> None:
    assert prompt_tokens_estimate(chars) == tokens


def test_concurrent_streams_are_capped_and_released() -> None:
    limiter = RateLimiter()
    limits = Limits(max_concurrent=2)
    assert limiter.admit("k", limits, now=0.0).admitted
    assert limiter.admit("k", limits, now=0.0).admitted
    assert not limiter.admit("k", limits, now=0.0).admitted
    limiter.finish("k", 10, now=0.0)
    assert limiter.admit("k", limits, now=0.0).admitted


def test_keys_are_independent_and_unlimited_by_default() -> None:
    limiter = RateLimiter()
    assert limiter.admit("a", Limits(rpm=1), now=0.0).admitted
    assert not limiter.admit("a", Limits(rpm=1), now=0.0).admitted
    assert limiter.admit("b", Limits(rpm=1), now=0.0).admitted
    for _ in range(1000):
        assert limiter.admit("free", Limits(max_concurrent=10_000), now=0.0).admitted
