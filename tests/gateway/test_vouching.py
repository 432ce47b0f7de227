"""The gateway trusts an agent only as far as the pool manager vouches, and charges only
what it relayed and measured."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace
from typing import Any

import pytest

from gateway.charges import (
    TEMPLATE_BASE_TOKENS,
    Capped,
    RogueReason,
    charged_usage,
    prompt_token_bound,
    resume_as_prompt,
)
from gateway.vouching import (
    LAUNCH_RECHECK_SECONDS,
    LaunchBook,
    Vouched,
    vouch,
)
from gpu_agent.synthetic_engine import SyntheticEngine
from loadtest.hostile.rogue_agent import INFLATED_TOKENS, REPLY_IDS, rogue_agent
from pool_manager.launches import vouch_for_agent
from spotgate.protocol import GenerateFrame, Usage
from spotgate.registry import AgentRecord, AgentState, CreatedApiKey, LaunchRecord
from spotgate.settings import AgentSettings
from spotgate.tokens import SigningKey
from stack.emulator import AwsEmulator
from tests.gateway.conftest import MODEL, Gateway, replicas
from tests.support.agents import AgentFactory, wait_for
from tests.support.clocks import FakeClock
from tests.support.metrics import metric_value, scrape
from tests.support.tokenizers import auto_tokenizer
from tests.support.wsclient import connect, generate, ids_of, run_streams

ROW = AgentRecord(
    agent_id="a", url="http://10.0.0.5:8000", model="m", state=AgentState.READY, capacity=32
)
LAUNCHED = LaunchRecord(agent_id="a", model="m", instance_type="g6.xlarge", capacity=64)


@pytest.mark.parametrize(
    ("row", "launch", "vouched"),
    [
        (ROW, LAUNCHED, Vouched(ROW)),  # as launched: taken at its word
        (ROW, None, Vouched(None, (RogueReason.UNKNOWN_AGENT,))),  # never launched
        (replace(ROW, model="other"), LAUNCHED, Vouched(None, (RogueReason.OTHER_MODEL,))),
        (
            replace(ROW, capacity=1_000_000, active=5),
            LAUNCHED,
            Vouched(replace(ROW, capacity=64, active=5), (RogueReason.CAPACITY,)),
        ),
        (  # a load it cannot have is held within its capacity
            replace(ROW, active=-3),
            LAUNCHED,
            Vouched(replace(ROW, active=0)),
        ),
        (  # the launcher knew its URL: any other is not routed
            ROW,
            replace(LAUNCHED, url="http://10.0.0.9:8000"),
            Vouched(None, (RogueReason.OTHER_URL,)),
        ),
        (ROW, replace(LAUNCHED, url=ROW.url), Vouched(ROW)),
        (  # a gone row stays in the view, unrouted, whatever it says
            replace(ROW, state=AgentState.GONE, capacity=1_000_000),
            None,
            Vouched(replace(ROW, state=AgentState.GONE, capacity=1_000_000)),
        ),
    ],
)
def test_a_row_is_routed_only_as_far_as_its_launch_record_vouches(
    row: AgentRecord, launch: LaunchRecord | None, vouched: Vouched
) -> None:
    assert vouch(row, launch) == vouched


class Launches:
    """A registry's launch records, counting the reads."""

    def __init__(self, *records: LaunchRecord) -> None:
        self.records = {record.agent_id: record for record in records}
        self.asked: list[list[str]] = []

    async def get_launches(self, agent_ids: Collection[str]) -> dict[str, LaunchRecord]:
        self.asked.append(sorted(agent_ids))
        return {i: self.records[i] for i in agent_ids if i in self.records}


async def test_launch_records_are_read_once_and_a_missing_one_again_after_a_while() -> None:
    clock = FakeClock(100.0)
    book, reader = LaunchBook(clock), Launches(LAUNCHED)
    assert await book.launches(reader, ["a", "b"]) == {"a": LAUNCHED}
    assert await book.launches(reader, ["a", "b"]) == {"a": LAUNCHED}
    assert reader.asked == [["a", "b"]]  # nothing read again: "b" was just looked for

    reader.records["b"] = replace(LAUNCHED, agent_id="b")  # its launcher writes it
    clock.now += LAUNCH_RECHECK_SECONDS
    assert set(await book.launches(reader, ["a", "b"])) == {"a", "b"}
    assert reader.asked == [["a", "b"], ["b"]]


PROMPT_BOUND = 2_000


@pytest.mark.parametrize(
    ("reported", "held", "charged", "capped"),
    [
        (
            Usage(prompt_tokens=40, completion_tokens=7),
            7,
            Usage(prompt_tokens=40, completion_tokens=7),
            (),
        ),
        (  # an agent may say less than it was sent (a stop string ends a reply early)
            Usage(prompt_tokens=40, completion_tokens=5),
            7,
            Usage(prompt_tokens=40, completion_tokens=5),
            (),
        ),
        (
            Usage(prompt_tokens=INFLATED_TOKENS, completion_tokens=INFLATED_TOKENS),
            3,
            Usage(prompt_tokens=PROMPT_BOUND, completion_tokens=3),
            (
                Capped(RogueReason.PROMPT_TOKENS, INFLATED_TOKENS, PROMPT_BOUND),
                Capped(RogueReason.COMPLETION_TOKENS, INFLATED_TOKENS, 3),
            ),
        ),
    ],
)  # fmt: skip
def test_a_key_is_charged_no_more_than_the_gateway_relayed_and_measured(
    reported: Usage, held: int, charged: Usage, capped: tuple[Capped, ...]
) -> None:
    assert charged_usage(reported, prompt_bound=PROMPT_BOUND, held_tokens=held) == (
        charged,
        capped,
    )


FRAMES = [
    GenerateFrame(id="s", model="m", prompt="Grüße, 世界! " * 50),
    GenerateFrame(
        id="s",
        model="m",
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Zürich ☃ " * 200},
            {"role": "assistant", "content": "Yes."},
            {"role": "user", "content": "and?"},
        ],
    ),
]


@pytest.mark.parametrize("frame", FRAMES)
def test_the_prompt_bound_holds_what_an_engine_counts_and_little_more(
    frame: GenerateFrame,
) -> None:
    engine = SyntheticEngine(AgentSettings(engine="synthetic", served_model_name="m"))
    counted = (
        engine.text_prompt_ids(frame.prompt)
        if frame.prompt is not None
        else engine.chat_prompt_ids(frame.messages or [])
    )
    bound = prompt_token_bound(frame)
    assert len(counted) <= bound  # one token per UTF-8 byte: the most any tokenizer makes
    assert bound <= 2 * len(counted) + TEMPLATE_BASE_TOKENS + 32 * 4


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather of a city, now.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "array", "items": {"type": "object"}},
            },
            "required": ["city"],
        },
    },
}
CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Zürich ☃: the weather? " * 20},
    {"role": "assistant", "content": "Cold."},
    {"role": "user", "content": "And tomorrow?"},
]


@pytest.mark.parametrize("family", ["qwen3", "llama3", "gemma3"])
@pytest.mark.parametrize("tools", [None, [WEATHER_TOOL]])
def test_no_published_chat_template_makes_more_prompt_tokens_than_the_bound(
    family: str, tools: list[Any] | None
) -> None:
    tokenizer = auto_tokenizer(family)
    text = tokenizer.apply_chat_template(
        CHAT, tools=tools, add_generation_prompt=True, tokenize=False
    )
    counted = len(tokenizer(text, add_special_tokens=False)["input_ids"])
    frame = GenerateFrame.model_validate(
        {"id": "s", "model": "m", "messages": CHAT, **({"tools": tools} if tools else {})}
    )
    assert counted <= prompt_token_bound(frame)  # an honest agent is never capped


def rogues(exposition: str, reason: RogueReason) -> float:
    return metric_value(exposition, "spotgate_gateway_rogue_agents_total", reason=reason.value)


async def test_a_rogue_row_draws_no_stream_from_either_replica_and_bills_nothing_unrelayed(
    aws: AwsEmulator,
    gateway_key: SigningKey,
    start_agent: AgentFactory,
    api_key: CreatedApiKey,
) -> None:
    async with (
        replicas(aws, gateway_key, 2, start_agent) as gateways,
        rogue_agent("rogue-unlaunched") as unlaunched,
        rogue_agent("rogue-launched") as launched,
    ):
        registry = gateways[0].state.registry
        # Never launched, a million streams of room, for the model the real agent serves.
        await unlaunched.register(registry, MODEL)
        # Launched for a model of its own at 4 streams, it says a million and bills 10M.
        await vouch_for_agent(
            registry, agent_id=launched.agent_id, model="rogue-model", url=launched.url, capacity=4
        )
        await launched.register(registry, "rogue-model")

        async def both_judged() -> bool:
            views = [gateway.state.dispatcher.view for gateway in gateways]
            return all(view.record(launched.agent_id) is not None for view in views)

        await wait_for(both_judged)
        for gateway in gateways:
            view = gateway.state.dispatcher.view
            assert view.record(unlaunched.agent_id) is None
            launched_row = view.record(launched.agent_id)
            assert launched_row is not None
            assert launched_row.capacity == 4

        streams = [generate(f"victim-{n}", MODEL, max_tokens=4) for n in range(8)]
        for gateway in gateways:
            async with connect(gateway.ws_url, api_key.api_key) as ws:
                served = await run_streams(ws, *streams)
            assert all(frames[-1]["type"] == "done" for frames in served.values())
        assert unlaunched.served == []

        async with connect(gateways[1].ws_url, api_key.api_key) as ws:
            billed_frame = generate("billed", "rogue-model", "hi", want_ids=True)
            frames = (await run_streams(ws, billed_frame))["billed"]
        assert len(launched.served) == 1
        assert ids_of(frames) == list(REPLY_IDS)
        done = frames[-1]
        bound = prompt_token_bound(GenerateFrame.model_validate(generate("b", "rogue-model", "hi")))
        assert done["usage"] == {"prompt_tokens": bound, "completion_tokens": len(REPLY_IDS)}

        for gateway in gateways:
            await gateway.state.usage.flush(gateway.state.registry)
        rows = await registry.read_usage(api_key.record.key_id, 0.0)
        billed = [row.counts for row in rows if row.model == "rogue-model"]
        assert [(c.prompt_tokens, c.completion_tokens) for c in billed] == [(bound, len(REPLY_IDS))]

        first, second = [await scrape(f"{g.ops_url}/metrics") for g in gateways]
        for exposition in (first, second):  # each replica judged the rows, once each
            assert rogues(exposition, RogueReason.UNKNOWN_AGENT) == 1
            assert rogues(exposition, RogueReason.CAPACITY) == 1
        assert rogues(second, RogueReason.PROMPT_TOKENS) == 1
        assert rogues(second, RogueReason.COMPLETION_TOKENS) == 1


async def test_an_agent_at_another_url_than_it_was_launched_at_is_not_routed(
    gateway: Gateway, start_agent: AgentFactory
) -> None:
    async with rogue_agent("moved") as rogue:
        registry = gateway.state.registry
        await vouch_for_agent(registry, agent_id=rogue.agent_id, model=MODEL, url=rogue.url)
        rogue.url = "http://127.0.0.1:9"  # its row points elsewhere (another agent's port)
        await rogue.register(registry, MODEL)

        async def judged() -> bool:
            exposition = await scrape(f"{gateway.ops_url}/metrics")
            return rogues(exposition, RogueReason.OTHER_URL) == 1

        await wait_for(judged)
        assert gateway.state.dispatcher.view.record(rogue.agent_id) is None


@pytest.mark.parametrize(
    ("reported", "resumed_prompt_tokens", "told"),
    [
        pytest.param((5, 40), 0, (5, 40), id="resume-delivered-nothing-moves"),
        pytest.param((5, 40), 30, (35, 10), id="invented-ids-are-prompt"),
        pytest.param((5, 20), 30, (25, 0), id="never-below-zero"),
    ],
)
def test_a_resume_charged_as_prompt_is_what_the_client_is_told(
    reported: tuple[int, int], resumed_prompt_tokens: int, told: tuple[int, int]
) -> None:
    usage = Usage(prompt_tokens=reported[0], completion_tokens=reported[1])

    shown = resume_as_prompt(usage, resumed_prompt_tokens)

    assert (shown.prompt_tokens, shown.completion_tokens) == told
