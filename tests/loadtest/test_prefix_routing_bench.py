"""The prefix-routing benchmark's pure parts: its workload, its metrics reading, its table."""

from __future__ import annotations

from loadtest.bench.harness import metric_value
from loadtest.bench.prefix_routing import (
    HIT_COUNTER,
    MODES,
    QUERIED_COUNTER,
    SYSTEM_PROMPTS,
    Calibration,
    ModeSample,
    PoolRun,
    Setup,
    placement,
    render,
    turn_messages,
    workload,
)


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


def test_counters_are_summed_over_labels_and_read_as_zero_when_absent() -> None:
    text = "\n".join(
        [
            f"# HELP {QUERIED_COUNTER} prompt tokens looked up",
            f"# TYPE {QUERIED_COUNTER} counter",
            f"{QUERIED_COUNTER} 1200.0",
            'spotgate_gateway_agents{state="ready"} 2.0',
            'spotgate_gateway_agents{state="gone"} 1.0',
        ]
    )

    assert metric_value(text, QUERIED_COUNTER) == 1200
    assert metric_value(text, HIT_COUNTER) == 0
    assert metric_value(text, 'spotgate_gateway_agents{state="ready"}') == 2
    assert metric_value(text, "spotgate_gateway_agents") == 3


def _sample(ttft_ms: float, queried: float, hit: float) -> ModeSample:
    return ModeSample(
        tokens_per_second=50.0,
        total_tokens=500,
        wall_seconds=10.0,
        ttfts_seconds=[ttft_ms / 1000] * 40,
        prompt_tokens=[700, 1900],
        queried_tokens=queried,
        hit_tokens=hit,
    )


SETUP = Setup(
    agents=2, runs=2, conversations=16, turns=5, concurrency=4, max_tokens=24, placement="."
)
CALIBRATION = Calibration(
    fresh_tokens=2000, fresh_ttft_seconds=0.8, new_tokens=300, cached_ttft_seconds=0.2
)


def test_the_table_has_a_row_per_mode_and_judges_the_goal_from_it() -> None:
    results = {
        "least load": [_sample(900, 1000, 400), _sample(1000, 1000, 500)],
        "explicit sessions": [_sample(500, 1000, 800), _sample(520, 1000, 800)],
        "prefix-aware": [_sample(600, 1000, 850), _sample(600, 1000, 790)],
    }

    table = render([PoolRun(SETUP, results, CALIBRATION)])

    assert "| least load | 45.0% | 40.0%, 50.0% | 900 | 1000 | 50.0 | 80 | 0 |" in table
    assert "| prefix-aware | 82.0% | 85.0%, 79.0% | 600 |" in table
    assert "82.0% vs 80.0% (1.02×): **met**" in table
    assert "600 vs 900 ms (0.67×, -33%): **met**" in table
    assert "### 2 agents" in table
    assert "Prompts of 700–1,900 tokens" in table
    assert "2,000-token prompt's TTFT was 800 ms" in table


def test_without_the_agents_counters_the_hit_rate_is_not_judged() -> None:
    results = {mode.name: [_sample(700, 0, 0)] for mode in MODES}

    table = render([PoolRun(SETUP, results, CALIBRATION)])

    assert "| least load | — | — | 700 |" in table
    assert "**not judged**" in table
    assert "700 vs 700 ms (1.00×, +0%): **not met**" in table


def test_agents_get_a_cpu_each_and_share_when_there_are_more_agents_than_cpus() -> None:
    assert placement(2, [0, 1])[0] == [0, 1]
    cpus, sentence = placement(3, [4, 5])
    assert cpus == [4, 5, 4]
    assert "agent 3 to CPU 4 (agents share CPUs" in sentence
