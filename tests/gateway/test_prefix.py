"""The prompt's prefix as the router matches it, and the per-agent index of what was sent."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.prefix import PrefixIndex, block_hashes, prompt_prefix, tenant_session
from spotgate.protocol import GenerateFrame
from spotgate.tenancy import shared_prompt_digest

BLOCK_CHARS = 64
TENANT = "key:aaaa"
OTHER_TENANT = "key:bbbb"
SYSTEM = "You are a careful assistant. " * 20
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]


def chat(
    *turns: str, tools: list[dict[str, Any]] | None = None, system: str = SYSTEM
) -> GenerateFrame:
    roles = ("user", "assistant")
    messages = [{"role": "system", "content": system}] + [
        {"role": roles[n % 2], "content": text} for n, text in enumerate(turns)
    ]
    return GenerateFrame.model_validate(
        {"type": "generate", "id": "s", "model": "m", "messages": messages, "tools": tools}
    )


def test_the_next_turn_starts_with_every_whole_block_of_the_turn_before() -> None:
    first = prompt_prefix(chat("What is a spot instance? " * 9), BLOCK_CHARS, tenant=TENANT)
    second = prompt_prefix(
        chat("What is a spot instance? " * 9, "A spare EC2 instance. " * 7, "Why cheaper?"),
        BLOCK_CHARS,
        tenant=TENANT,
    )
    assert len(first.blocks) > 5
    assert second.blocks[: len(first.blocks)] == first.blocks
    assert len(second.blocks) > len(first.blocks)
    assert first.conversation == second.conversation


@pytest.mark.parametrize(
    ("other", "shared_blocks"),
    [
        # Another conversation under the same system prompt shares the system prompt's blocks.
        (chat("Something else entirely " * 9), len(SYSTEM) // BLOCK_CHARS),
        # Tools render before the messages: other tools share nothing.
        (chat("What is a spot instance? " * 9, tools=TOOLS), 0),
        (chat("What is a spot instance? " * 9, system="Be brief. " * 60), 0),
    ],
)
def test_prompts_share_blocks_only_as_far_as_their_rendered_text_agrees(
    other: GenerateFrame, shared_blocks: int
) -> None:
    mine = prompt_prefix(chat("What is a spot instance? " * 9), BLOCK_CHARS, tenant=TENANT)
    theirs = prompt_prefix(other, BLOCK_CHARS, tenant=TENANT)
    common = 0
    for a, b in zip(mine.blocks, theirs.blocks, strict=False):
        if a != b:
            break
        common += 1
    assert common == shared_blocks
    assert mine.conversation != theirs.conversation


def test_a_partial_last_block_is_not_matched_and_a_short_prompt_has_no_blocks() -> None:
    assert block_hashes("x" * (BLOCK_CHARS * 3 - 1), BLOCK_CHARS) == block_hashes(
        "x" * (BLOCK_CHARS * 2), BLOCK_CHARS
    )
    assert len(block_hashes("x" * (BLOCK_CHARS * 3), BLOCK_CHARS)) == 3
    assert block_hashes("short", BLOCK_CHARS) == ()


def test_blocks_are_chained_so_equal_blocks_after_different_text_differ() -> None:
    a = block_hashes("a" * BLOCK_CHARS + "z" * BLOCK_CHARS, BLOCK_CHARS)
    b = block_hashes("b" * BLOCK_CHARS + "z" * BLOCK_CHARS, BLOCK_CHARS)
    assert a[1] != b[1]


def test_raw_prompts_are_keyed_by_their_first_block() -> None:
    def raw(text: str) -> GenerateFrame:
        return GenerateFrame(id="s", model="m", prompt=text)

    preamble = "p" * BLOCK_CHARS
    assert (
        prompt_prefix(raw(preamble + "one"), BLOCK_CHARS, tenant=TENANT).conversation
        == prompt_prefix(raw(preamble + "two"), BLOCK_CHARS, tenant=TENANT).conversation
    )
    assert (
        prompt_prefix(raw("one"), BLOCK_CHARS, tenant=TENANT).conversation
        != prompt_prefix(raw("two"), BLOCK_CHARS, tenant=TENANT).conversation
    )


def test_the_index_counts_leading_blocks_sent_to_each_agent() -> None:
    index = PrefixIndex(blocks_per_agent=100)
    index.record("a", (1, 2, 3, 4))
    assert index.matched_blocks("a", (1, 2, 3, 4, 5)) == 4
    assert index.matched_blocks("a", (1, 2, 9, 4)) == 2  # stops at the first block not sent
    assert index.matched_blocks("a", (9, 1, 2)) == 0
    assert index.matched_blocks("b", (1, 2)) == 0


def test_the_index_is_bounded_and_forgets_tails_first() -> None:
    index = PrefixIndex(blocks_per_agent=6)
    index.record("a", (1, 2, 3, 4))
    index.record("a", (10, 11, 12, 13))  # over the bound: the oldest prompt's tail goes
    assert index.blocks_held() == 6
    assert index.matched_blocks("a", (1, 2, 3, 4)) == 2
    assert index.matched_blocks("a", (10, 11, 12, 13)) == 4
    index.record("a", (1, 2, 3, 4))  # sent again: the most recent now
    assert index.matched_blocks("a", (1, 2, 3, 4)) == 4
    assert index.matched_blocks("a", (10, 11, 12, 13)) == 2


def test_agents_that_leave_are_forgotten() -> None:
    index = PrefixIndex(blocks_per_agent=10)
    for agent_id in ("a", "b", "c"):
        index.record(agent_id, (1, 2, 3))
    index.retain({"b"})
    assert [index.matched_blocks(agent_id, (1, 2, 3)) for agent_id in "abc"] == [0, 3, 0]
    assert index.blocks_held() == 3


def common_blocks(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    common = 0
    for mine, theirs in zip(a, b, strict=False):
        if mine != theirs:
            break
        common += 1
    return common


QUESTION = "What is a spot instance? " * 9
SYSTEM_BLOCKS = len(SYSTEM) // BLOCK_CHARS  # whole blocks inside the system turn's text


@pytest.mark.parametrize(
    ("frame", "shared", "common"),
    [
        # Equal text under two tenants: nothing in common, not even the first block.
        (chat(QUESTION), frozenset(), 0),
        (GenerateFrame(id="s", model="m", prompt="p" * BLOCK_CHARS * 4), frozenset(), 0),
        # A shared system prompt: its whole blocks match across tenants, nothing after.
        (chat(QUESTION), frozenset({shared_prompt_digest(SYSTEM)}), SYSTEM_BLOCKS),
        # Only that very text: another system prompt shares nothing.
        (chat(QUESTION), frozenset({shared_prompt_digest(SYSTEM + ".")}), 0),
        # Tools render first, and may be the tenant's own: a chat with tools shares nothing.
        (chat(QUESTION, tools=TOOLS), frozenset({shared_prompt_digest(SYSTEM)}), 0),
    ],
)
def test_prompts_match_across_tenants_only_as_far_as_a_shared_system_prompt(
    frame: GenerateFrame, shared: frozenset[str], common: int
) -> None:
    mine = prompt_prefix(frame, BLOCK_CHARS, tenant=TENANT, shared_prompt_sha256=shared)
    theirs = prompt_prefix(frame, BLOCK_CHARS, tenant=OTHER_TENANT, shared_prompt_sha256=shared)
    again = prompt_prefix(frame, BLOCK_CHARS, tenant=TENANT, shared_prompt_sha256=shared)
    assert len(mine.blocks) > common
    assert common_blocks(mine.blocks, theirs.blocks) == common
    assert again == mine  # within a tenant every block matches, on any replica
    # A conversation is always the tenant's own: no other tenant's stream follows it.
    assert mine.conversation != theirs.conversation


def test_the_same_session_of_two_tenants_is_two_sessions() -> None:
    assert tenant_session(TENANT, "s1") != tenant_session(OTHER_TENANT, "s1")
    assert tenant_session(TENANT, "s1") == tenant_session(TENANT, "s1")
    assert tenant_session(TENANT, None) is None
