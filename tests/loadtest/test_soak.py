"""The soak: how growth is judged, and a minute of it that loses nothing and leaks nothing."""

from __future__ import annotations

from loadtest.soak import BYTES_PER_MB, NOT_JUDGED, STEADY, Samples, judge, soak

MINUTE_SECONDS = 60.0


def series(rss_mb: list[float], fds: list[int], first_seconds: float = 0.0) -> Samples:
    """Samples a minute apart, starting at `first_seconds`."""
    return Samples(
        seconds=[first_seconds + n * MINUTE_SECONDS for n in range(len(rss_mb))],
        rss=[int(mb * BYTES_PER_MB) for mb in rss_mb],
        fds=fds,
    )


def test_noise_is_steady_and_a_trend_is_growth() -> None:
    duration = 8 * MINUTE_SECONDS
    noisy = series(
        [100, 130, 101, 99, 103, 100, 98, 102, 101], [20, 25, 21, 20, 22, 20, 21, 20, 21]
    )
    leaking = series(
        [100, 110, 120, 130, 140, 150, 160, 170, 180], [20, 22, 24, 26, 28, 30, 32, 34, 36]
    )
    late = series([90, 91, 90], [17, 17, 17], first_seconds=6 * MINUTE_SECONDS)

    assert judge("noisy", noisy, duration, MINUTE_SECONDS).verdict == STEADY
    assert judge("leaking", leaking, duration, MINUTE_SECONDS).verdict == "grew: RSS +21%"
    assert judge("late", late, duration, MINUTE_SECONDS).verdict == NOT_JUDGED


async def test_mixed_traffic_with_interruptions_loses_nothing_and_leaks_nothing() -> None:
    # The full-size soak's clients in half the time of two minutes at half of them: as many
    # streams, three spot notices, and a sample a second (twenty in each third judged).
    result = await soak(
        minutes=1.0,
        agents=2,
        ws_streams=8,
        sse_streams=4,
        interrupt_every_seconds=15.0,
        sample_seconds=1.0,
    )
    for tally in (result.websocket, result.sse):
        assert tally.started > 0, tally
        assert tally.lost == 0, tally
        assert tally.exact + tally.failed.total() == tally.started, tally
    assert result.tokens.issued > 0, result.tokens
    assert not result.tokens.failed, result.tokens
    assert result.interruptions >= 2
    assert result.verdict("gateway") == STEADY, result.verdicts
    assert result.verdict("pool-manager") == STEADY, result.verdicts
