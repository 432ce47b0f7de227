"""A replica's turn at a batch: taken over by another, and the work left it publishes."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator

import openai
import pytest

from gateway.batch_worker import BatchRun
from spotgate.file_store import FileStore, file_key, line_key, line_prefix
from spotgate.openai_batches import BatchCreateRequest, new_batch, output_line
from spotgate.registry import BatchBacklog, CreatedApiKey, Demand, object_id
from spotgate.settings import BatchSettings, LimitStoreSettings
from spotgate.tokens import SigningKey
from stack.emulator import AwsEmulator
from tests.gateway.conftest import MODEL, Gateway, agents_of, running_gateway
from tests.gateway.test_batches import Client, chat_line, ended
from tests.support.agents import AgentFactory, synthetic, wait_for

LINES = 3
BACKLOG_LINES = 6


@pytest.fixture
async def idle_worker_gateway(
    aws: AwsEmulator, gateway_key: SigningKey, limit_store: LimitStoreSettings
) -> AsyncIterator[Gateway]:
    """A gateway whose worker looked for batches once, at its start: the test works them."""
    batch = BatchSettings(poll_seconds=3600.0, lease_seconds=30.0)
    async with running_gateway(aws, gateway_key, limit_store=limit_store, batch=batch) as running:
        yield running


class LinesTakenWhileRead(FileStore):
    """S3, where another replica ends the batch (and deletes its lines) during the first read."""

    batch_id = ""

    async def get(self, key: str) -> bytes | None:
        """The object, read after the other replica deleted the batch's lines."""
        if self.batch_id and key.startswith(line_prefix(self.batch_id)):
            await self.delete_prefix(line_prefix(self.batch_id))
            self.batch_id = ""
        return await super().get(key)


async def test_a_replica_whose_lines_another_ended_writes_no_shorter_output_over_its_file(
    aws: AwsEmulator,
    idle_worker_gateway: Gateway,
    api_key: CreatedApiKey,
    openai_client: Client,
) -> None:
    client = openai_client(base_url=f"{idle_worker_gateway.url}/v1", api_key=api_key.api_key)
    content = b"".join(chat_line(f"req-{n}", "hi", 4) for n in range(LINES))
    uploaded = await client.files.create(file=("in.jsonl", content), purpose="batch")
    state = idle_worker_gateway.state
    owner = api_key.record.key_id
    batch_id = object_id("batch_", time.time())
    request = BatchCreateRequest(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    body = {**new_batch(batch_id, request, int(time.time())), "status": "finalizing"}
    body["output_file_id"] = object_id("file-", time.time())
    await state.registry.create_batch(owner, body)
    for index in range(LINES):
        line = output_line(batch_id, index, f"req-{index}", 200, {"choices": []})
        await state.files.put(line_key(batch_id, index, succeeded=True), json.dumps(line).encode())
    written = b"the output the other replica wrote\n"
    await state.files.put(file_key(body["output_file_id"]), written)
    stored = await state.registry.take_lease(owner, batch_id, state.gateway_id, 30.0)
    assert stored is not None

    async with LinesTakenWhileRead.open(aws.settings()) as files:
        files.batch_id = batch_id
        await BatchRun(state, files, stored, time.time).run()

    assert await state.files.get(file_key(body["output_file_id"])) == written
    with pytest.raises(openai.NotFoundError):  # nor a record of a file cut short
        await client.files.retrieve(body["output_file_id"])


async def test_a_running_batch_publishes_its_work_left_and_withdraws_it_at_its_end(
    batch_gateway: Gateway,
    start_agent: AgentFactory,
    api_key: CreatedApiKey,
    openai_client: Client,
) -> None:
    # One stream at a time, 1 s each: the batch outlasts many of the demand's publishes.
    await agents_of(batch_gateway, start_agent)(engine=synthetic(20.0, capacity=1))
    client = openai_client(base_url=f"{batch_gateway.url}/v1", api_key=api_key.api_key)
    content = b"".join(chat_line(f"req-{n}", f"hello {n}", 20) for n in range(BACKLOG_LINES))
    uploaded = await client.files.create(file=("in.jsonl", content), purpose="batch")
    batch = await client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    registry = batch_gateway.state.registry
    published: list[BatchBacklog] = []

    async def backlog_published() -> bool:
        backlog = (await registry.read_demand()).get(MODEL, Demand()).backlog
        published[:] = [backlog] if backlog is not None else []
        return bool(published)

    await wait_for(backlog_published)
    finished = await ended(client, batch.id)

    assert published[0].due_at == finished.expires_at
    assert (
        0 < published[0].stream_seconds <= BACKLOG_LINES * BatchSettings().request_seconds_estimate
    )
    assert finished.status == "completed"
    assert MODEL not in batch_gateway.state.batch_backlogs

    async def withdrawn() -> bool:
        return (await registry.read_demand()).get(MODEL, Demand()).backlog is None

    await wait_for(withdrawn)
