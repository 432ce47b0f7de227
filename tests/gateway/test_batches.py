"""The Files and Batch APIs and the flex tier through the gateway, driven by the openai SDK."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import openai
import pytest

from gateway.batch_worker import BatchWorker
from gateway.routes.files import too_slow
from spotgate.file_store import FileStore, file_key, line_prefix
from spotgate.openai_batches import BATCH_FILE_EXPIRES_SECONDS
from spotgate.registry import CreatedApiKey, Registry
from spotgate.settings import BatchSettings, LimitStoreSettings
from spotgate.tokens import SigningKey
from stack.emulator import AwsEmulator
from tests.gateway.conftest import FAST_BATCHES, MODEL, Gateway, agents_of, running_gateway
from tests.support.agents import (
    AgentFactory,
    Imds,
    expected_text,
    spot_notice,
    synthetic,
    wait_for,
)

Client = Callable[..., openai.AsyncOpenAI]


def chat_line(custom_id: str, prompt: str, max_tokens: int, **body: Any) -> bytes:
    request = {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        **body,
    }
    line = {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": request,
    }
    return json.dumps(line).encode() + b"\n"


async def ended(client: openai.AsyncOpenAI, batch_id: str) -> openai.types.Batch:
    """The batch once it ended (polled as a client polls)."""
    latest: list[openai.types.Batch] = []

    async def done() -> bool:
        latest[:] = [await client.batches.retrieve(batch_id)]
        return latest[0].status in {"completed", "failed", "cancelled", "expired"}

    await wait_for(done, within=60)
    return latest[0]


async def lines_of(client: openai.AsyncOpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    content = await client.files.content(file_id)
    return [json.loads(line) for line in content.text.splitlines()]


async def test_a_batch_runs_every_request_once_and_a_bad_one_fails_alone(
    batch_gateway: Gateway,
    start_agent: AgentFactory,
    api_key: CreatedApiKey,
    openai_client: Client,
) -> None:
    await agents_of(batch_gateway, start_agent)()
    client = openai_client(base_url=f"{batch_gateway.url}/v1", api_key=api_key.api_key)
    content = b"".join(chat_line(f"req-{n}", f"hello {n}", 4 + n) for n in range(5))
    content += chat_line("bad", "hello", -5)  # a 400 of its own; the others run

    uploaded = await client.files.create(file=("in.jsonl", content), purpose="batch")
    batch = await client.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"job": "nightly"},
    )
    finished = await ended(client, batch.id)

    assert batch.status == "validating"
    assert finished.status == "completed", finished
    assert finished.metadata == {"job": "nightly"}
    assert finished.model == MODEL
    assert finished.request_counts is not None
    assert finished.request_counts.model_dump() == {"total": 6, "completed": 5, "failed": 1}
    outputs = await lines_of(client, finished.output_file_id)
    errors = await lines_of(client, finished.error_file_id)
    assert [line["custom_id"] for line in outputs] == [f"req-{n}" for n in range(5)]
    for n, line in enumerate(outputs):
        response = line["response"]
        assert response["status_code"] == 200
        reply = openai.types.chat.ChatCompletion.model_validate(response["body"])
        assert reply.choices[0].message.content == expected_text(f"hello {n}", 4 + n)
    assert [(line["custom_id"], line["response"]["status_code"]) for line in errors] == [
        ("bad", 400)
    ]
    assert errors[0]["response"]["body"]["error"]["param"] == "max_tokens"
    assert finished.usage is not None
    assert finished.usage.output_tokens == sum(4 + n for n in range(5))
    output_file = await client.files.retrieve(str(finished.output_file_id))
    assert output_file.purpose == "batch_output"
    assert output_file.expires_at is not None  # 30 days on, OpenAI's default
    assert output_file.expires_at - output_file.created_at == BATCH_FILE_EXPIRES_SECONDS
    listed = await client.batches.list()
    assert [b.id for b in listed.data] == [batch.id]


async def test_a_malformed_file_fails_the_batch_with_each_line_named(
    batch_gateway: Gateway, api_key: CreatedApiKey, openai_client: Client
) -> None:
    client = openai_client(base_url=f"{batch_gateway.url}/v1", api_key=api_key.api_key)
    content = chat_line("a", "hi", 4) + b"{not json\n" + chat_line("a", "hi", 4)
    uploaded = await client.files.create(file=("in.jsonl", content), purpose="batch")
    batch = await client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    finished = await ended(client, batch.id)

    assert finished.status == "failed"
    assert finished.errors is not None
    assert finished.errors.data is not None
    assert [(e.code, e.line) for e in finished.errors.data] == [
        ("invalid_json_line", 2),
        ("duplicate_custom_id", 3),
    ]


async def test_a_cancelled_batch_ends_with_each_request_in_one_file(
    batch_gateway: Gateway,
    start_agent: AgentFactory,
    api_key: CreatedApiKey,
    openai_client: Client,
) -> None:
    await agents_of(batch_gateway, start_agent)(tokens_per_second=20.0)
    client = openai_client(base_url=f"{batch_gateway.url}/v1", api_key=api_key.api_key)
    content = b"".join(chat_line(f"req-{n}", "hello", 40) for n in range(60))
    uploaded = await client.files.create(file=("in.jsonl", content), purpose="batch")
    batch = await client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )

    async def started() -> bool:
        return batch_gateway.state.dispatcher.outstanding.total() > 0

    await wait_for(started)
    cancelling = await client.batches.cancel(batch.id)
    finished = await ended(client, batch.id)

    assert cancelling.status == "cancelling"
    assert finished.status == "cancelled"
    ids = [
        line["custom_id"]
        for file_id in (finished.output_file_id, finished.error_file_id)
        for line in await lines_of(client, file_id)
    ]
    assert sorted(ids) == sorted(f"req-{n}" for n in range(60))
    unrun = [line for line in await lines_of(client, finished.error_file_id) if line["error"]]
    assert unrun
    assert all(line["error"]["code"] == "batch_cancelled" for line in unrun)


async def test_a_key_sees_only_its_own_files_and_batches(
    batch_gateway: Gateway, api_key: CreatedApiKey, aws: AwsEmulator, openai_client: Client
) -> None:
    client = openai_client(base_url=f"{batch_gateway.url}/v1", api_key=api_key.api_key)
    uploaded = await client.files.create(
        file=("in.jsonl", chat_line("a", "hi", 4)), purpose="batch"
    )
    batch = await client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    async with Registry.open(aws.settings()) as registry:
        other = await registry.create_key("other")
    stranger = openai_client(
        base_url=f"{batch_gateway.url}/v1", api_key=other.api_key, max_retries=0
    )

    with pytest.raises(openai.NotFoundError):
        await stranger.files.retrieve(uploaded.id)
    with pytest.raises(openai.NotFoundError):
        await stranger.files.content(uploaded.id)
    with pytest.raises(openai.NotFoundError):
        await stranger.files.delete(uploaded.id)
    with pytest.raises(openai.NotFoundError):
        await stranger.batches.retrieve(batch.id)
    with pytest.raises(openai.NotFoundError):
        await stranger.batches.cancel(batch.id)
    with pytest.raises(openai.BadRequestError):  # another key's file is no file of its own
        await stranger.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
    assert (await stranger.files.list()).data == []
    assert (await stranger.batches.list()).data == []
    assert [f.id for f in (await client.files.list(purpose="batch")).data] == [uploaded.id]
    deleted = await client.files.delete(uploaded.id)
    assert deleted.deleted
    with pytest.raises(openai.NotFoundError):
        await client.files.retrieve(uploaded.id)


async def test_bad_uploads_and_batch_requests_are_clear_400s(
    batch_gateway: Gateway, api_key: CreatedApiKey, openai_client: Client
) -> None:
    client = openai_client(
        base_url=f"{batch_gateway.url}/v1", api_key=api_key.api_key, max_retries=0
    )
    with pytest.raises(openai.BadRequestError, match="purpose"):
        await client.files.create(file=("in.jsonl", b"{}"), purpose="assistants")
    uploaded = await client.files.create(
        file=("in.jsonl", chat_line("a", "hi", 4)), purpose="batch"
    )
    with pytest.raises(openai.BadRequestError, match="completion_window"):
        await client.batches.create(
            input_file_id=uploaded.id,
            endpoint="/v1/chat/completions",
            completion_window="1h",  # type: ignore[arg-type]
        )
    with pytest.raises(openai.BadRequestError, match="endpoint"):
        await client.batches.create(
            input_file_id=uploaded.id,
            endpoint="/v1/embeddings",
            completion_window="24h",
        )
    with pytest.raises(openai.BadRequestError, match="metadata"):
        await client.batches.create(
            input_file_id=uploaded.id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
            metadata={f"k{n}": "v" for n in range(17)},
        )
    with pytest.raises(openai.BadRequestError, match="limit"):
        await client.batches.list(limit=101)
    long_id = "file-" + "x" * 5000  # beyond what DynamoDB takes as a key: still a 404
    with pytest.raises(openai.NotFoundError):
        await client.files.retrieve(long_id)
    with pytest.raises(openai.NotFoundError):
        await client.batches.retrieve("batch_" + "x" * 5000)
    assert (await client.files.list(after=long_id)).data


async def test_a_replica_that_stops_mid_batch_hands_it_on_and_no_request_is_lost_or_doubled(
    aws: AwsEmulator,
    gateway_key: SigningKey,
    limit_store: LimitStoreSettings,
    start_agent: AgentFactory,
    api_key: CreatedApiKey,
    openai_client: Client,
) -> None:
    replicas: dict[str, contextlib.AsyncExitStack] = {}
    gateways: dict[str, Gateway] = {}
    issuer: dict[str, str] = {}  # every replica's tokens are the first one's, as behind a balancer
    for name in ("gw-a", "gw-b"):
        replicas[name] = contextlib.AsyncExitStack()
        gateways[name] = await replicas[name].enter_async_context(
            running_gateway(
                aws,
                gateway_key,
                limit_store=limit_store,
                batch=FAST_BATCHES,
                gateway_id=name,
                **issuer,
            )
        )
        issuer.setdefault("token_issuer", gateways[name].url)
    try:
        await agents_of(gateways["gw-a"], start_agent)(tokens_per_second=100.0)
        client = openai_client(base_url=f"{gateways['gw-a'].url}/v1", api_key=api_key.api_key)
        content = b"".join(chat_line(f"req-{n}", f"hello {n}", 20) for n in range(40))
        uploaded = await client.files.create(file=("in.jsonl", content), purpose="batch")
        batch = await client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        holder: list[str] = []

        async def some_requests_done() -> bool:
            async with Registry.open(aws.settings()) as registry:
                stored = await registry.get_batch(api_key.record.key_id, batch.id)
            async with FileStore.open(aws.settings()) as files:
                finished = await files.keys(line_prefix(batch.id))
            holder[:] = [stored.lease_holder] if stored and stored.lease_holder else []
            return bool(holder) and len(finished) >= 5

        await wait_for(some_requests_done)
        await replicas.pop(holder[0]).aclose()  # its lease runs out; the other takes the batch
        async with FileStore.open(aws.settings()) as files:
            left = 40 - len(await files.keys(line_prefix(batch.id)))
        survivor = next(iter(gateways[name] for name in replicas))
        client = openai_client(base_url=f"{survivor.url}/v1", api_key=api_key.api_key)
        finished = await ended(client, batch.id)

        assert left > 0  # the survivor ran these
        assert finished.status == "completed"
        outputs = await lines_of(client, finished.output_file_id)
        assert [line["custom_id"] for line in outputs] == [f"req-{n}" for n in range(40)]
        for n, line in enumerate(outputs):
            body = line["response"]["body"]
            assert body["choices"][0]["message"]["content"] == expected_text(f"hello {n}", 20)
        assert finished.error_file_id is None
    finally:
        for stack in replicas.values():
            await stack.aclose()


@pytest.fixture
async def one_slot_client(
    batch_gateway: Gateway,
    start_agent: AgentFactory,
    api_key: CreatedApiKey,
    openai_client: Client,
) -> openai.AsyncOpenAI:
    """A client of the gateway, whose one agent takes one stream at a time."""
    one_slot = synthetic(20.0, capacity=1, ttft_seconds=0.01)
    await agents_of(batch_gateway, start_agent)(engine=one_slot)
    return openai_client(base_url=f"{batch_gateway.url}/v1", api_key=api_key.api_key)


async def test_a_batch_request_gives_its_agent_to_an_interactive_one_and_resumes_exactly(
    batch_gateway: Gateway, one_slot_client: openai.AsyncOpenAI
) -> None:
    client = one_slot_client
    tokens = 200  # 10 s on the agent's one slot: running when the interactive request comes
    uploaded = await client.files.create(
        file=("in.jsonl", chat_line("only", "hello", tokens)), purpose="batch"
    )
    batch = await client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    dispatcher = batch_gateway.state.dispatcher

    async def agent_busy() -> bool:
        return dispatcher.outstanding.total() > 0

    await wait_for(agent_busy)  # the batch's request holds the agent's one slot
    reply = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "now"}], max_tokens=3
    )
    async with FileStore.open(batch_gateway.state.settings.shared) as files:
        finished_by_reply = await files.keys(line_prefix(batch.id))
    finished = await ended(client, batch.id)

    assert reply.choices[0].message.content == expected_text("now", 3)
    assert finished_by_reply == []  # the interactive reply did not wait for the batch's
    assert batch_gateway.state.metrics.preemptions._value.get() == 1
    assert finished.status == "completed"
    [line] = await lines_of(client, finished.output_file_id)
    body = line["response"]["body"]
    assert body["choices"][0]["message"]["content"] == expected_text("hello", tokens)
    assert body["usage"]["completion_tokens"] == tokens


async def test_a_flex_request_waits_behind_interactive_ones_and_its_reply_names_its_tier(
    batch_gateway: Gateway, one_slot_client: openai.AsyncOpenAI
) -> None:
    client = one_slot_client
    dispatcher = batch_gateway.state.dispatcher

    def ask(prompt: str, tier: Any) -> asyncio.Task[Any]:
        return asyncio.create_task(
            client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": prompt}],
                max_tokens=10,
                service_tier=tier,
            )
        )

    holder = ask("first", "auto")

    async def agent_busy() -> bool:
        return dispatcher.outstanding.total() > 0

    await wait_for(agent_busy)
    flex = ask("flex", "flex")

    async def flex_waits() -> bool:
        return dispatcher.waiting(MODEL) == 1

    await wait_for(flex_waits)
    interactive = ask("interactive", None)

    async def both_wait() -> bool:
        return dispatcher.waiting(MODEL) == 2

    await wait_for(both_wait)
    assert dispatcher.pending() == {MODEL: 1}  # the flex request is no demand on the pool
    finished: list[str] = []
    for name, task in (("flex", flex), ("interactive", interactive)):
        task.add_done_callback(lambda _task, name=name: finished.append(name))
    first, flexed, plain = await asyncio.gather(holder, flex, interactive)

    assert finished == ["interactive", "flex"]  # it came later and went first
    assert (first.service_tier, flexed.service_tier, plain.service_tier) == (
        "default",
        "flex",
        None,
    )
    assert flexed.choices[0].message.content == expected_text("flex", 10)
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=3,
        service_tier="flex",
        stream=True,
    )
    assert {chunk.service_tier async for chunk in stream} == {"flex"}


async def test_a_spot_notice_mid_batch_moves_its_requests_and_each_ends_exactly_once(
    batch_gateway: Gateway,
    start_agent: AgentFactory,
    api_key: CreatedApiKey,
    openai_client: Client,
    imds: Imds,
) -> None:
    start = agents_of(batch_gateway, start_agent)
    noticed = await start(tokens_per_second=40.0)  # the emulated instance the notice reaches
    client = openai_client(base_url=f"{batch_gateway.url}/v1", api_key=api_key.api_key)
    tokens = 1000  # 25 s a request there: each outlasts the notice, and moves
    content = b"".join(chat_line(f"req-{n}", f"spot {n}", tokens) for n in range(12))
    uploaded = await client.files.create(file=("in.jsonl", content), purpose="batch")
    batch = await client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    dispatcher = batch_gateway.state.dispatcher
    noticed_id = noticed.runtime.identity.agent_id  # type: ignore[union-attr]

    async def running_there() -> bool:
        return dispatcher.outstanding[noticed_id] > 0

    await wait_for(running_there)
    await start(tokens_per_second=4000.0, imds_url="http://127.0.0.1:9")  # somewhere to go
    await spot_notice(imds, in_seconds=20)
    finished = await ended(client, batch.id)

    assert finished.status == "completed"
    assert batch_gateway.state.metrics.resumes._value.get() >= 1  # requests moved mid-reply
    outputs = await lines_of(client, finished.output_file_id)
    assert [line["custom_id"] for line in outputs] == [f"req-{n}" for n in range(12)]
    for n, line in enumerate(outputs):
        body = line["response"]["body"]
        assert body["choices"][0]["message"]["content"] == expected_text(f"spot {n}", tokens)
        assert body["usage"]["completion_tokens"] == tokens


async def test_an_interactive_stream_takes_a_running_flex_streams_place_which_resumes_exactly(
    batch_gateway: Gateway, one_slot_client: openai.AsyncOpenAI
) -> None:
    await interactive_beside_flex(one_slot_client, one_slot_client, batch_gateway)
    assert batch_gateway.state.metrics.preemptions._value.get() == 1


FLEX_TOKENS = 100  # 5 s on the agent: running when the interactive request comes


async def interactive_beside_flex(
    flex_client: openai.AsyncOpenAI, client: openai.AsyncOpenAI, flex_gateway: Gateway
) -> None:
    """A flex request runs through `flex_gateway`; an interactive one is answered while it
    runs (preempted), and the flex one then ends exact, each token counted once."""
    flex = asyncio.create_task(
        flex_client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "long flex"}],
            max_tokens=FLEX_TOKENS,
            service_tier="flex",
        )
    )

    async def flex_running() -> bool:
        return flex_gateway.state.dispatcher.outstanding.total() > 0

    await wait_for(flex_running)
    interactive = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "now"}], max_tokens=3
    )

    assert not flex.done()  # the interactive reply did not wait for it
    assert interactive.choices[0].message.content == expected_text("now", 3)
    flexed = await flex
    assert flexed.choices[0].message.content == expected_text("long flex", FLEX_TOKENS)
    assert flexed.usage is not None
    assert flexed.usage.completion_tokens == FLEX_TOKENS  # each token counted once


async def test_an_expired_files_contents_are_deleted_with_its_record(
    batch_gateway: Gateway, api_key: CreatedApiKey, openai_client: Client
) -> None:
    client = openai_client(base_url=f"{batch_gateway.url}/v1", api_key=api_key.api_key)
    kept = await client.files.create(file=("kept.jsonl", chat_line("a", "hi", 4)), purpose="batch")
    state = batch_gateway.state
    owner = api_key.record.key_id
    gone = {**(await state.registry.get_object(owner, kept.id) or {}), "id": "file-gone"}
    await state.registry.put_file(owner, {**gone, "expires_at": int(time.time()) - 1})
    await state.files.put(file_key("file-gone"), b"expired")

    await BatchWorker(state, state.files).sweep_expired_files()

    assert await state.files.get(file_key("file-gone")) is None
    assert await state.files.get(file_key(kept.id)) is not None
    with pytest.raises(openai.NotFoundError):
        await client.files.retrieve("file-gone")


@pytest.mark.parametrize(
    ("received", "elapsed", "slow"),
    [(0, 10.0, False), (0, 10.5, True), (3 * 1024 * 1024, 11.0, False), (2**20, 11.0, True)],
)
def test_an_upload_is_too_slow_past_its_grace_under_the_least_rate(
    received: int, elapsed: float, slow: bool
) -> None:
    assert too_slow(received, elapsed) is slow


async def test_a_key_uploads_one_file_at_a_time_on_a_replica_and_others_still_can(
    batch_gateway: Gateway, api_key: CreatedApiKey, openai_client: Client
) -> None:
    release = asyncio.Event()
    head = (
        b'--b\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        b'--b\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\r\n\r\n'
    )

    async def held_body() -> AsyncIterator[bytes]:
        yield head
        await release.wait()
        yield chat_line("a", "hi", 4) + b"\r\n--b--\r\n"

    headers = {
        "Authorization": f"Bearer {api_key.api_key}",
        "Content-Type": "multipart/form-data; boundary=b",
    }
    other = await batch_gateway.state.registry.create_key("other")
    async with aiohttp.ClientSession() as http:
        first = asyncio.create_task(
            http.post(f"{batch_gateway.url}/v1/files", data=held_body(), headers=headers)
        )

        async def reading() -> bool:
            return api_key.record.key_id in batch_gateway.state.uploading

        await wait_for(reading)
        client = openai_client(
            base_url=f"{batch_gateway.url}/v1", api_key=api_key.api_key, max_retries=0
        )
        with pytest.raises(openai.RateLimitError):
            await client.files.create(file=("x.jsonl", chat_line("b", "hi", 4)), purpose="batch")
        another = openai_client(base_url=f"{batch_gateway.url}/v1", api_key=other.api_key)
        await another.files.create(file=("y.jsonl", chat_line("c", "hi", 4)), purpose="batch")
        release.set()
        async with await first as response:
            assert response.status == 200
    assert not batch_gateway.state.uploading


async def test_downloads_beyond_a_replicas_room_are_told_to_retry(
    batch_gateway: Gateway, api_key: CreatedApiKey, openai_client: Client
) -> None:
    client = openai_client(
        base_url=f"{batch_gateway.url}/v1", api_key=api_key.api_key, max_retries=0
    )
    line = chat_line("a", "hi", 4)
    uploaded = await client.files.create(file=("in.jsonl", line), purpose="batch")
    downloads = batch_gateway.state.downloads
    held = BatchSettings().downloads_per_gateway
    for _ in range(held):  # as slow readers would hold them
        await downloads.acquire()
    try:
        with pytest.raises(openai.RateLimitError):
            await client.files.content(uploaded.id)
    finally:
        for _ in range(held):
            downloads.release()
    assert (await client.files.content(uploaded.id)).content == line
