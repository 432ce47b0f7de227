"""The gateway profile's stages: a sample counts for each stage its stack passes through."""

from __future__ import annotations

import pytest

from loadtest.bench.gateway_profile import stage_shares

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
