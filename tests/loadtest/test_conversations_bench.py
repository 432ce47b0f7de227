"""The routing benchmarks' workload: chats sharing a few system prompts, text of each seed's own."""

from __future__ import annotations

from loadtest.bench.conversations import SYSTEM_PROMPTS, turn_messages, workload


def test_conversations_share_a_few_system_prompts_and_nothing_else() -> None:
    chats = workload(seed=1, conversations=7, turns=4)

    assert len({chat.system for chat in chats}) == SYSTEM_PROMPTS
    assert chats[0].system == chats[SYSTEM_PROMPTS].system != chats[1].system
    assert all(len(chat.user_turns) == 4 for chat in chats)
    turns = [turn for chat in chats for turn in chat.user_turns]
    assert len(set(turns)) == len(turns)
    assert len({chat.session for chat in chats}) == len(chats)


def test_every_seed_has_text_of_its_own_and_the_same_seed_the_same_text() -> None:
    one = workload(seed=1, conversations=4, turns=3)
    other = workload(seed=2, conversations=4, turns=3)

    assert workload(seed=1, conversations=4, turns=3) == one
    # No prompt of one seed starts as one of the other's: their first cache blocks differ.
    assert {chat.system[:16] for chat in one}.isdisjoint(chat.system[:16] for chat in other)
    assert {t for chat in one for t in chat.user_turns}.isdisjoint(
        t for chat in other for t in chat.user_turns
    )
    assert {chat.session for chat in one}.isdisjoint(chat.session for chat in other)


def test_each_turn_sends_the_whole_history_with_the_replies_so_far() -> None:
    (chat,) = workload(seed=3, conversations=1, turns=3)
    replies = ["first reply", "second reply"]

    turns = [turn_messages(chat, replies[:k]) for k in range(3)]

    assert turns[0] == [
        {"role": "system", "content": chat.system},
        {"role": "user", "content": chat.user_turns[0]},
    ]
    for k in (1, 2):  # the previous turn, its reply, then the next question
        assert turns[k][: len(turns[k - 1])] == turns[k - 1]
        assert turns[k][len(turns[k - 1]) :] == [
            {"role": "assistant", "content": replies[k - 1]},
            {"role": "user", "content": chat.user_turns[k]},
        ]
