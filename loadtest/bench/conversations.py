"""The routing benchmarks' workload: multi-turn chats that share a few long system prompts.

Many conversations whose histories grow turn by turn, as chat clients send them; every seed
gives text of its own, so a run finds nothing an earlier one left in a cache.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

# ~4.1 tokens per word of WORDS in the built-in tokenizer (its BPE learnt a small corpus):
# system prompts of ~680 tokens, user turns of ~250; a 5-turn chat's last prompt ~2,000.
SYSTEM_PROMPT_WORDS = 160
USER_TURN_WORDS = 50
SYSTEM_PROMPTS = 3
# What the generated text is made of: common words, each one or a few tokens.
WORD_TEXT = """
spot instance gateway stream token agent model prefix cache route load balance queue
region zone price capacity drain notice resume client server socket frame header body
reply prompt history turn session key limit rate budget latency throughput engine kernel
memory block tensor layer weight vocabulary template message system user assistant tool
weather river mountain garden kitchen window letter market bridge harbor forest island
morning evening quiet bright early later always never often maybe simply quickly slowly
build test deploy measure compare explain describe summarize translate answer consider the
a of and to in is for on with as by at from that this which when where while because
"""
WORDS = tuple(WORD_TEXT.split())


@dataclass(frozen=True)
class Conversation:
    """One chat: the session it may name, its system prompt and its user turns, in order."""

    session: str
    system: str
    user_turns: tuple[str, ...]


def _words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choices(WORDS, k=count))


def workload(seed: int, conversations: int, turns: int) -> list[Conversation]:
    """`conversations` chats of `turns` user turns, sharing SYSTEM_PROMPTS system prompts.

    Every text starts from `seed` (the system prompts name it first), so two seeds share no
    prefix block at all.
    """
    rng = random.Random(seed)  # text, not secrets: the same seed gives the same chats
    systems = [
        f"[{seed:08x}/{n}] You are assistant {n}. {_words(rng, SYSTEM_PROMPT_WORDS)}"
        for n in range(SYSTEM_PROMPTS)
    ]
    return [
        Conversation(
            session=f"{seed:08x}-{index}",
            system=systems[index % SYSTEM_PROMPTS],
            user_turns=tuple(
                f"Question {turn + 1} of chat {index}: {_words(rng, USER_TURN_WORDS)}"
                for turn in range(turns)
            ),
        )
        for index in range(conversations)
    ]


def turn_messages(conversation: Conversation, replies: Sequence[str]) -> list[dict[str, str]]:
    """The messages of the conversation's next turn, after `replies` to its earlier turns.

    As an OpenAI client sends them: the whole history, each reply as the assistant said it.
    """
    messages = [{"role": "system", "content": conversation.system}]
    for question, reply in zip(conversation.user_turns, replies, strict=False):
        messages += [
            {"role": "user", "content": question},
            {"role": "assistant", "content": reply},
        ]
    messages.append({"role": "user", "content": conversation.user_turns[len(replies)]})
    return messages
