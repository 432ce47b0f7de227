"""The gateway profile's stages: a sample counts for each stage its stack passes through."""

from __future__ import annotations

import pytest

from loadtest.bench.gateway_profile import stage_shares, stream_cost
from loadtest.bench.harness import Sample

LOOP = ";".join(
    [
        "<module> (gateway/__main__.py:7)",
        "run (uvloop/__init__.py:92)",
        "Runner.run (asyncio/runners.py:118)",
    ]
)
READER = f"{LOOP};AgentLink._read (gateway/agent_link.py:422)"
PARSE = "AgentLink._deliver (gateway/agent_link.py:437);parse_frame (spotgate/protocol/codec.py:97)"
TAKE = "StreamChannel.push (gateway/agent_link.py:166);_Relay._take_now (gateway/relay.py:241)"
RAW = "\n".join(
    [
        f"{READER};{PARSE} 3",
        f"{READER};{TAKE} 5",
        f"{LOOP};start_stream.<locals>.run (gateway/streams.py:174) 1",
        f"{LOOP} 1",
    ]
)


def test_a_sample_counts_for_every_stage_its_stack_passes_through() -> None:
    total, shares, top = stage_shares(RAW)

    assert total == 10
    assert shares["agent frames read (the link's reader)"] == pytest.approx(80.0)
    assert shares["· parsed (parse_frame)"] == pytest.approx(30.0)
    assert shares["· sent to the client at once (take_now)"] == pytest.approx(50.0)
    assert shares["streams' relays (their tasks)"] == pytest.approx(10.0)
    assert shares["event loop and sockets (no Python frame)"] == pytest.approx(10.0)
    assert top[0] == ("_Relay._take_now (gateway/relay.py:241)", pytest.approx(50.0))


SYSTEM_SHARE = 0.4


@pytest.mark.parametrize(
    ("stream_us", "token_us"),
    [(270.0, 6.5), (700.0, 9.0), (0.0, 12.0)],
)
def test_the_cost_split_recovers_a_stream_and_a_token_from_runs_of_two_reply_lengths(
    stream_us: float, token_us: float
) -> None:
    def run(streams: int, tokens_per_stream: int) -> Sample:
        tokens = streams * tokens_per_stream
        cpu_seconds = (streams * stream_us + tokens * token_us) / 1e6
        return Sample(
            total_tokens=tokens,
            server_cpu_seconds=cpu_seconds,
            server_system_cpu_seconds=cpu_seconds * SYSTEM_SHARE,
            ttfts_seconds=[0.05] * streams,
        )

    cost = stream_cost([run(5000, 32), run(5000, 256)])

    assert cost.stream_us == pytest.approx(stream_us, abs=1e-6)
    assert cost.token_us == pytest.approx(token_us)
    assert cost.stream_system_us == pytest.approx(stream_us * SYSTEM_SHARE, abs=1e-6)
    assert cost.token_system_us == pytest.approx(token_us * SYSTEM_SHARE)
    assert cost.tokens_per_cpu_second(32) == pytest.approx(32e6 / (stream_us + 32 * token_us))


def test_runs_of_one_reply_length_cannot_split_the_cost() -> None:
    same = Sample(total_tokens=32_000, server_cpu_seconds=0.5, ttfts_seconds=[0.05] * 1000)

    with pytest.raises(ValueError, match="two reply lengths"):
        stream_cost([same, same])
