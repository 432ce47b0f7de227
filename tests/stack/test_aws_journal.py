"""The emulator's journal: which writes it keeps, and an emulator killed then started again."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from spotgate.file_store import FileStore
from spotgate.process import free_port
from spotgate.registry import Registry
from spotgate.settings import SharedSettings, emulator_settings
from stack.aws_journal import AwsJournal, Kept, Request, is_kept
from stack.emulator import EMULATOR_REGION

KEPT = Kept(frozenset({"keys"}), frozenset({"files"}))
S3_AUTH = {"Authorization": "AWS4-HMAC-SHA256 Credential=x/20261128/us-east-1/s3/aws4_request"}


def dynamodb(operation: str, body: object) -> Request:
    headers = {"X-Amz-Target": f"DynamoDB_20120810.{operation}"}
    return Request("POST", "/", "", headers, json.dumps(body).encode())


@pytest.mark.parametrize(
    ("request_", "kept"),
    [
        (dynamodb("PutItem", {"TableName": "keys"}), True),
        (dynamodb("UpdateItem", {"TableName": "keys"}), True),
        (dynamodb("CreateTable", {"TableName": "keys"}), True),
        (dynamodb("UpdateTimeToLive", {"TableName": "keys"}), True),
        (dynamodb("PutItem", {"TableName": "agents"}), False),
        (dynamodb("GetItem", {"TableName": "keys"}), False),
        (dynamodb("Query", {"TableName": "keys"}), False),
        (dynamodb("BatchWriteItem", {"RequestItems": {"keys": []}}), True),
        (dynamodb("BatchWriteItem", {"RequestItems": {"agents": []}}), False),
        (dynamodb("TransactWriteItems", {"TransactItems": [{"Put": {"TableName": "keys"}}]}), True),
        (dynamodb("TransactWriteItems", {"TransactItems": [{"Put": {"TableName": "x"}}]}), False),
        (Request("POST", "/", "", {"X-Amz-Target": "DynamoDB_20120810.PutItem"}, b"{"), False),
        (Request("PUT", "/files/batches/1.out", "", S3_AUTH, b"line"), True),
        (Request("DELETE", "/files/f", "", S3_AUTH, b""), True),
        (Request("POST", "/files/f", "uploads", S3_AUTH, b""), True),
        (Request("GET", "/files/f", "", S3_AUTH, b""), False),
        (Request("PUT", "/other/f", "", S3_AUTH, b""), False),
        (Request("PUT", "/files/f", "", {}, b""), False),  # not S3: no S3 credential scope
    ],
)
def test_the_journal_keeps_writes_to_what_outlives_a_stack(request_: Request, kept: bool) -> None:
    assert is_kept(KEPT, request_) is kept


def test_a_record_cut_short_ends_the_journal(tmp_path: Path) -> None:
    journal = AwsJournal(tmp_path / "journal", KEPT)
    whole = dynamodb("PutItem", {"TableName": "keys"})
    journal.replay(lambda _environ, _start: [])
    journal.append(whole)
    with journal.path.open("ab") as file:
        file.write(b'{"method": "PUT", "path": "/files/f", "query": "", "headers": {}, "body_')
    assert [request for request, _ in journal.records()] == [whole]

    again = AwsJournal(journal.path, KEPT)
    assert again.replay(lambda _environ, _start: []) == 1
    assert journal.path.read_bytes().endswith(whole.body)  # the cut record is gone


@contextmanager
def emulator(journal: Path) -> Iterator[tuple[subprocess.Popen[str], SharedSettings]]:
    port = free_port()
    command = [sys.executable, "-m", "stack.emulator", "--port", str(port), "--journal", journal]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        yield process, emulator_settings(url, EMULATOR_REGION)
    finally:
        process.kill()
        process.wait()


async def test_keys_and_files_outlive_an_emulator_killed_with_sigkill(tmp_path: Path) -> None:
    path = tmp_path / "journal"
    with emulator(path) as (process, settings):
        async with Registry.open(settings) as registry, FileStore.open(settings) as files:
            await registry.create_tables()
            await files.create_bucket()
            created = await registry.create_key("kept")
            await files.put("batches/b/000001.out", b"a finished line")
            await files.put("gone", b"deleted")
            await files.delete("gone")
        process.kill()
        process.wait()

    with emulator(path) as (_process, settings):
        async with Registry.open(settings) as registry, FileStore.open(settings) as files:
            await registry.create_tables()  # as a new stack does: the kept ones stay
            await files.create_bucket()
            assert (await registry.get_key(created.record.key_id)) == created.record
            assert await files.get("batches/b/000001.out") == b"a finished line"
            assert await files.get("gone") is None
            assert await files.keys("") == ["batches/b/000001.out"]
