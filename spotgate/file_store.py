"""The files' contents in S3 (`SharedSettings.files_bucket`): uploads, batches' results.

Keys: `files/<file id>` for a file's bytes, `batches/<batch id>/<line index>.<out|err>` for each
request's finished line while its batch runs (put again, the same key: a request is written
once however often it runs), gathered into the output and error files when the batch ends.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, Self

from botocore.config import Config
from botocore.exceptions import ClientError

from spotgate.registry import aws_session
from spotgate.settings import SharedSettings

LINE_INDEX_DIGITS = 6
"""A line's index in its key, zero-padded: the keys list in the lines' order."""
SUCCEEDED, FAILED = "out", "err"
"""A finished line's key ends in which file it goes to, so a listing counts both."""


def file_key(file_id: str) -> str:
    """Where a file's bytes are."""
    return f"files/{file_id}"


def line_prefix(batch_id: str) -> str:
    """Where a batch's finished lines are."""
    return f"batches/{batch_id}/"


def line_key(batch_id: str, index: int, *, succeeded: bool) -> str:
    """Where one request's finished line is: its index, and which file it goes to."""
    kind = SUCCEEDED if succeeded else FAILED
    return f"{line_prefix(batch_id)}{index:0{LINE_INDEX_DIGITS}d}.{kind}"


def line_of_key(key: str) -> tuple[int, bool]:
    """A finished line's index, and whether it succeeded, from its key."""
    name = key.rsplit("/", 1)[-1]
    index, _, kind = name.partition(".")
    return int(index), kind == SUCCEEDED


class StoredBytes:
    """An object's length, and its bytes as they come from S3."""

    def __init__(self, length: int, body: Any) -> None:  # aiobotocore's StreamingBody
        self.length = length
        self._body = body

    async def read(self) -> bytes:
        """All of it."""
        data: bytes = await self._body.read()
        return data

    async def chunks(self, size: int) -> AsyncIterator[bytes]:
        """It, `size` bytes at a time."""
        while chunk := await self._body.read(size):
            yield chunk


class FileStore:
    """One S3 client over the files' bucket."""

    def __init__(self, client: Any, bucket: str) -> None:  # aioboto3's S3 client, untyped
        self._client = client
        self.bucket = bucket

    @classmethod
    @asynccontextmanager
    async def open(cls, settings: SharedSettings) -> AsyncIterator[Self]:
        """Open the store's client for the life of the `async with` block."""
        aws = settings.aws
        # An emulator at a plain address serves buckets by path, not by host name.
        config = Config(
            retries={"max_attempts": 3, "mode": "standard"},
            s3={"addressing_style": "path" if aws.endpoint_url else "auto"},
        )
        async with AsyncExitStack() as stack:
            client = await stack.enter_async_context(
                aws_session(aws).client("s3", endpoint_url=aws.endpoint_url, config=config)
            )
            yield cls(client, settings.files_bucket)

    async def create_bucket(self) -> None:
        """Make the bucket if missing (the emulator; in AWS the CDK stack does)."""
        try:
            await self._client.create_bucket(Bucket=self.bucket)
        except ClientError as err:
            code = err.response.get("Error", {}).get("Code")
            if code not in {"BucketAlreadyOwnedByYou", "BucketAlreadyExists"}:
                raise

    async def put(self, key: str, data: bytes) -> None:
        """Store `data` at `key` (replacing what was there)."""
        await self._client.put_object(Bucket=self.bucket, Key=key, Body=data)

    async def get(self, key: str) -> bytes | None:
        """What is stored at `key` (None: nothing)."""
        async with self.reading(key) as stored:
            return None if stored is None else await stored.read()

    @asynccontextmanager
    async def reading(self, key: str) -> AsyncIterator[StoredBytes | None]:
        """What is stored at `key` as it streams from S3, for the block (None: nothing)."""
        try:
            reply = await self._client.get_object(Bucket=self.bucket, Key=key)
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") not in {"NoSuchKey", "404"}:
                raise
            reply = None
        if reply is None:
            yield None
            return
        body = reply["Body"]  # aiobotocore's StreamingBody: read(amt) as the bytes come
        try:
            yield StoredBytes(int(reply["ContentLength"]), body)
        finally:
            body.close()

    async def delete(self, key: str) -> None:
        """Remove what is at `key`, if anything."""
        await self._client.delete_object(Bucket=self.bucket, Key=key)

    async def keys(self, prefix: str) -> list[str]:
        """Every key under `prefix`, in order."""
        found: list[str] = []
        request: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix}
        while True:
            page = await self._client.list_objects_v2(**request)
            found.extend(str(entry["Key"]) for entry in page.get("Contents", []))
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return found
            request["ContinuationToken"] = token

    async def delete_prefix(self, prefix: str) -> None:
        """Remove every key under `prefix`."""
        keys = await self.keys(prefix)
        for start in range(0, len(keys), 1000):
            chunk = [{"Key": key} for key in keys[start : start + 1000]]
            await self._client.delete_objects(Bucket=self.bucket, Delete={"Objects": chunk})
