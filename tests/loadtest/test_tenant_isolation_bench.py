"""The tenant-isolation benchmark's pure parts: its modes, whose each chat is, its table."""

from __future__ import annotations

from loadtest.bench.conversations import SYSTEM_PROMPTS, workload
from loadtest.bench.routing_modes import ModeSample
from loadtest.bench.tenant_isolation import (
    SHARED_PROMPTS_NOTE,
    dealt,
    render,
    shared_digests,
    tenant_modes,
)
from spotgate.tenancy import shared_prompt_digest


def test_modes_are_one_tenant_then_each_count_isolated_and_with_shared_prompts() -> None:
    assert [mode.name for mode in tenant_modes([4, 16])] == [
        "one tenant",
        "4 tenants",
        "4 tenants, shared system prompts",
        "16 tenants",
        "16 tenants, shared system prompts",
    ]


def test_conversations_are_dealt_over_the_tenants_in_turn() -> None:
    chats = workload(seed=5, conversations=8, turns=2)
    owners = dealt(chats, 4)
    assert [owners[chat.session] for chat in chats] == [0, 1, 2, 3, 0, 1, 2, 3]
    # Under one system prompt, chats of different tenants: what isolation keeps apart.
    same_prompt = [owners[chat.session] for chat in chats if chat.system == chats[0].system]
    assert len(set(same_prompt)) > 1


def test_the_shared_gateway_names_every_system_prompt_of_every_run() -> None:
    digests = shared_digests([1, 2], conversations=16, turns=3)
    systems = {chat.system for seed in (1, 2) for chat in workload(seed, 16, 3)}
    assert len(systems) == 2 * SYSTEM_PROMPTS
    assert set(digests) == {shared_prompt_digest(system) for system in systems}


def sample(hit: float, ttft_ms: float) -> ModeSample:
    return ModeSample(
        tokens_per_second=50.0,
        total_tokens=500,
        wall_seconds=10.0,
        ttfts_seconds=[ttft_ms / 1000] * 10,
        prompt_tokens=[700],
        queried_tokens=1000.0,
        hit_tokens=hit * 1000,
    )


def test_the_table_has_a_row_per_mode_and_the_cost_against_one_tenant() -> None:
    results = {
        "one tenant": [sample(0.8, 200)],
        "4 tenants": [sample(0.6, 300)],
        "4 tenants, shared system prompts": [sample(0.6, 290)],
    }
    section = render(2, [4], results, "sizes", "Pinned.", "python -m x --runs 1")
    assert "Command: `python -m x --runs 1`." in section
    assert "| one tenant | 80.0% |" in section
    assert "| 4 tenants | 60.0% |" in section
    assert "- 4 tenants: hit rate -20.0 points, TTFT p50 +50%." in section
    assert section.endswith(SHARED_PROMPTS_NOTE)
