"""A replica's turn at a batch when another replica has taken it over."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator

import openai
import pytest

from gateway.batch_worker import BatchRun
from spotgate.file_store import FileStore, file_key, line_key, line_prefix
from spotgate.openai_batches import BatchCreateRequest, new_batch, output_line
from spotgate.registry import CreatedApiKey, object_id
from spotgate.settings import BatchSettings, LimitStoreSettings
from spotgate.tokens import SigningKey
from stack.emulator import AwsEmulator
from tests.gateway.conftest import Gateway, running_gateway
from tests.gateway.test_batches import Client, chat_line

LINES = 3


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
