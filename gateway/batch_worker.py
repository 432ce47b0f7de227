"""Each replica's worker of the deployment's batches: one at a time, on spare capacity.

A replica takes a batch not ended whose lease has run out (`Registry.take_lease`), and
renews the lease with every save of the batch's object; one that dies hands the batch on
when its lease runs out. Each request's finished line is stored as it finishes, under its
index (`spotgate.file_store.line_key`): a request run again after a crash replaces its own
line, so each `custom_id` ends in the output once. Requests run in the flex tier: an agent
goes to them only when no interactive stream waits for one. What status follows which
is `spotgate.openai_batches.next_status`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from typing import Any

from gateway.auth import Principal, principal_of
from gateway.batch_requests import RequestResult, run_request
from gateway.state import GatewayState
from spotgate.file_store import FileStore, file_key, line_key, line_of_key, line_prefix
from spotgate.logging import get_logger
from spotgate.openai_batches import (
    BATCH_FILE_EXPIRES_SECONDS,
    OUTPUT_PURPOSE,
    CheckedFile,
    Progress,
    RequestLine,
    Status,
    Usage,
    check_input_file,
    file_object,
    next_status,
    output_line,
    unrun_line,
)
from spotgate.openai_replies import error_body
from spotgate.protocol import ErrorCode
from spotgate.registry import BatchBacklog, StoredObject, object_id
from spotgate.tasks import ended

log = get_logger(__name__)

RETRY_WAIT_SECONDS = 1.0
"""A request told to wait, without saying how long, runs again after this."""
LINE_READS = 64
"""How many finished lines the end of a batch reads from S3 at once."""
FILE_SWEEP_SECONDS = 3600.0
"""How often each replica deletes the contents of files past their expiry (and their records):
DynamoDB's TTL would take the records, up to two days late, and leave the contents."""


class BatchWorker:
    """Finds batches no live replica works, and works them one at a time."""

    def __init__(
        self, state: GatewayState, files: FileStore, clock: Callable[[], float] = time.time
    ) -> None:
        self._state = state
        self._files = files
        self._clock = clock

    async def run_forever(self) -> None:
        """Look for batches every `poll_seconds`, or at once when one is created here."""
        state = self._state
        settings = state.settings.batch
        swept_at = float("-inf")
        while True:
            try:
                if self._clock() - swept_at >= FILE_SWEEP_SECONDS:
                    swept_at = self._clock()
                    await self.sweep_expired_files()
                for owner, batch_id in await state.registry.open_batches():
                    stored = await state.registry.take_lease(
                        owner, batch_id, state.gateway_id, settings.lease_seconds
                    )
                    if stored is not None:
                        await BatchRun(self._state, self._files, stored, self._clock).run()
            except asyncio.CancelledError:
                raise
            except Exception as err:  # the batch stays; its lease runs out and it is retried
                log.warning("batch work failed", error=str(err), kind=type(err).__name__)
            state.batch_created.clear()
            with suppress(TimeoutError):
                async with asyncio.timeout(settings.poll_seconds):
                    await state.batch_created.wait()

    async def sweep_expired_files(self) -> None:
        """Delete the contents and records of files past their expiry."""
        for owner, file_id in await self._state.registry.expired_files():
            await self._files.delete(file_key(file_id))
            await self._state.registry.delete_object(owner, file_id)


class LeaseLost(Exception):
    """Another replica took the batch: this one stops working it at once."""


class BatchRun:
    """One replica's turn at one batch, from its status to its end or the lease's loss."""

    def __init__(
        self,
        state: GatewayState,
        files: FileStore,
        stored: StoredObject,
        clock: Callable[[], float],
    ) -> None:
        self._state = state
        self._files = files
        self._owner = stored.owner
        self._body = dict(stored.body)
        self._cancel_requested = stored.cancel_requested_at is not None
        self._clock = clock
        self._done: dict[int, bool] = {}  # finished lines: index → whether it succeeded
        self._stop = asyncio.Event()  # requests stop: a cancel, the window's end, or the lease
        self._lease_lost = False
        self._served: list[float] = []  # finished requests' seconds on an agent

    @property
    def _id(self) -> str:
        return str(self._body["id"])

    @property
    def _expires_at(self) -> int | None:
        """When the batch's completion window ends (epoch seconds)."""
        expires_at = self._body.get("expires_at")
        return expires_at if isinstance(expires_at, int) else None

    def _progress(self, total: int) -> Progress:
        completed = sum(self._done.values())
        return Progress(total, completed, len(self._done) - completed)

    async def run(self) -> None:
        """Work the batch until it ends or another replica takes it."""
        try:
            await self._run()
        finally:
            self._withdraw_backlog()

    def _withdraw_backlog(self) -> None:
        self._state.batch_backlogs.pop(str(self._body.get("model")), None)

    async def _run(self) -> None:
        try:
            checked = await self._checked_input()
            if checked is None:
                return
            if self._body["status"] == "validating":
                self._body.update(status="in_progress", in_progress_at=int(self._clock()))
                self._body.update(model=checked.model)
            for key in await self._files.keys(line_prefix(self._id)):
                index, succeeded = line_of_key(key)
                self._done[index] = succeeded
            if self._body["status"] == "in_progress":
                await self._run_requests(checked)
            await self._finish(checked)
        except LeaseLost:
            log.info("batch taken by another replica", batch=self._id)

    async def _save(self, *, ended: bool = False) -> None:
        """Save the object, renew the lease, and hear of a cancel; `LeaseLost` if taken."""
        settings = self._state.settings.batch
        stored = await self._state.registry.save_batch(
            self._owner, self._body, self._state.gateway_id, settings.lease_seconds, ended=ended
        )
        if stored is None:
            self._lease_lost = True
            self._stop.set()
            raise LeaseLost(self._id)
        self._cancel_requested = stored.cancel_requested_at is not None

    async def _checked_input(self) -> CheckedFile | None:
        """The input file's requests; None when it cannot run (the batch failed)."""
        content = await self._input()
        if content is None:
            problems = [{"code": "missing_file", "message": "the input file is gone", "line": None}]
        else:
            limit = self._state.settings.batch.max_requests
            # Up to 200 MB of JSON lines: read off the event loop, which relays every stream.
            checked = await asyncio.to_thread(
                check_input_file, content, str(self._body["endpoint"]), limit
            )
            if not isinstance(checked, list):
                self._body["request_counts"] = Progress(len(checked.lines)).counts()
                return checked
            problems = [problem.body() for problem in checked]
        now = int(self._clock())
        self._body.update(status="failed", failed_at=now)
        self._body.update(errors={"object": "list", "data": problems})
        await self._save(ended=True)
        return None

    async def _input(self) -> bytes | None:
        file_id = str(self._body["input_file_id"])
        if await self._state.registry.get_object(self._owner, file_id) is None:
            return None
        return await self._files.get(file_key(file_id))

    async def _principal(self) -> Principal | None:
        record = await self._state.registry.get_key(self._owner)
        if record is None or record.disabled:
            return None
        return principal_of(record, self._state.settings.max_streams_per_key)

    async def _run_requests(self, checked: CheckedFile) -> None:
        """Run every request not finished, a few at a time, on capacity nothing else awaits."""
        state = self._state
        settings = state.settings.batch
        principal = await self._principal()
        width = settings.streams_per_gateway
        if principal is not None:
            width = max(1, min(width, principal.limits.max_concurrent))
        slots = asyncio.Semaphore(width)
        running: set[asyncio.Task[None]] = set()
        stopping = asyncio.create_task(self._stop.wait())
        self._publish_backlog(len(checked.lines))
        try:
            async with self._lease_kept(len(checked.lines)):
                for index, line in enumerate(checked.lines):
                    if index in self._done:
                        continue
                    if self._should_end() or not await self._slot(slots):
                        break
                    task = asyncio.create_task(self._run_one(principal, index, line, slots.release))
                    running.add(task)
                    task.add_done_callback(running.discard)
                while running and not self._stop.is_set():
                    # A cancel or a lost lease is heard at once, not when a request ends.
                    await asyncio.wait({*running, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            await ended(running)
            self._withdraw_backlog()  # none left to run in this turn: before the batch ends
        if self._lease_lost:
            raise LeaseLost(self._id)

    @asynccontextmanager
    async def _lease_kept(self, total: int) -> AsyncIterator[None]:
        """Renew the lease and save progress in the background while the body runs."""
        saver = asyncio.create_task(self._save_every(total), name=f"save {self._id}")
        try:
            yield
        finally:
            await ended({saver})

    def _publish_backlog(self, total: int) -> None:
        """The work left, for the pool manager: spot capacity if it would miss its window."""
        expires_at = self._expires_at
        if expires_at is None:
            return
        served = self._served
        per_request = (
            sum(served) / len(served)
            if served
            else self._state.settings.batch.request_seconds_estimate
        )
        left = total - len(self._done)
        backlog = BatchBacklog(left * per_request, float(expires_at))
        self._state.batch_backlogs[str(self._body["model"])] = backlog

    def _should_end(self) -> bool:
        return self._cancel_requested or self._expired()

    def _expired(self) -> bool:
        expires_at = self._expires_at
        return expires_at is not None and self._clock() >= expires_at

    async def _save_every(self, total: int) -> None:
        """Save progress and renew the lease a third of its length apart; stop on a cancel."""
        lease_seconds = self._state.settings.batch.lease_seconds
        saved_at = time.monotonic()
        while True:
            await asyncio.sleep(lease_seconds / 3)
            if self._body["status"] == "in_progress":
                self._body["request_counts"] = self._progress(total).counts()
                self._publish_backlog(total)
            try:
                async with asyncio.timeout(lease_seconds / 3):  # a hung call is a failed one
                    await self._save()
            except LeaseLost:
                return
            except Exception as err:  # the table is out of reach: try again until the lease ends
                log.warning("batch not saved", batch=self._id, error=str(err))
                if time.monotonic() - saved_at >= lease_seconds * 2 / 3:  # stop before it ends
                    self._lease_lost = True
                    self._stop.set()  # another replica may take it now: stop before it starts
                    return
                continue
            saved_at = time.monotonic()
            if self._body["status"] == "in_progress" and self._should_end():
                self._stop.set()
                return

    async def _slot(self, slots: asyncio.Semaphore) -> bool:
        """Wait for one of the batch's places to run a request in; False: the batch stops."""
        taking = asyncio.create_task(slots.acquire())
        stopping = asyncio.create_task(self._stop.wait())
        await asyncio.wait({taking, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not taking.done():
            taking.cancel()
            return False
        if self._stop.is_set():
            slots.release()
            return False
        return True

    async def _run_one(
        self,
        principal: Principal | None,
        index: int,
        request: RequestLine,
        release: Callable[[], None],
    ) -> None:
        try:
            while not self._stop.is_set():
                result = await self._request(principal, request.body)
                if result.final:
                    succeeded = result.status < 400
                    line = output_line(
                        self._id, index, request.custom_id, result.status, result.body
                    )
                    key = line_key(self._id, index, succeeded=succeeded)
                    await self._files.put(key, json.dumps(line).encode())
                    self._done[index] = succeeded
                    self._served.append(result.served_seconds)
                    return
                with suppress(TimeoutError):
                    async with asyncio.timeout(result.retry_after or RETRY_WAIT_SECONDS):
                        await self._stop.wait()
        except Exception as err:  # the line stays unfinished: the batch's next turn runs it
            log.warning("batch request failed", batch=self._id, line=index, error=repr(err))
        finally:
            release()

    async def _request(self, principal: Principal | None, body: dict[str, Any]) -> RequestResult:
        if principal is None:
            message = "the batch's API key is disabled"
            return RequestResult(401, error_body(ErrorCode.UNAUTHORIZED, message))
        endpoint = str(self._body["endpoint"])
        expires_at = self._expires_at
        window = expires_at - self._clock() if expires_at is not None else None
        wait_seconds = max(
            RETRY_WAIT_SECONDS, window or self._state.settings.queue.flex_deadline_seconds
        )
        return await run_request(self._state, principal, endpoint, body, wait_seconds)

    async def _finish(self, checked: CheckedFile) -> None:
        """End the batch: its output and error files, then its last status."""
        progress = self._progress(len(checked.lines))
        status: Status = self._body["status"]
        status = next_status(
            status,
            progress=progress,
            cancel_requested=self._cancel_requested,
            expired=self._expired(),
        )
        now = int(self._clock())
        if status == "cancelling":
            self._body.update(status="cancelling", cancelling_at=now)
            status = "cancelled"
        elif status == "finalizing":
            self._body.update(status="finalizing", finalizing_at=now)
            status = "completed"
        elif status == "in_progress":
            return  # stopped for another reason: the next turn goes on
        self._allocate_files(progress)
        await self._save()
        async with self._lease_kept(progress.total):
            await self._write_files(checked, status)
        self._body["request_counts"] = progress.counts()
        self._body.update(status=status, **{f"{status}_at": int(self._clock())})
        await self._save(ended=True)
        await self._files.delete_prefix(line_prefix(self._id))

    async def _finished_lines(self) -> dict[int, bytes]:
        """Every finished line's stored JSON by index, read `LINE_READS` at a time.

        A line gone means another replica ended the batch and deleted them: `LeaseLost`, so
        no shorter file replaces the one it wrote.
        """
        indexes = sorted(self._done)
        lines: dict[int, bytes] = {}
        for start in range(0, len(indexes), LINE_READS):
            chunk = indexes[start : start + LINE_READS]
            keys = [line_key(self._id, index, succeeded=self._done[index]) for index in chunk]
            read = await asyncio.gather(*map(self._files.get, keys))
            for index, data in zip(chunk, read, strict=True):
                if data is None or self._lease_lost:
                    raise LeaseLost(self._id)
                lines[index] = data
        return lines

    def _allocate_files(self, progress: Progress) -> None:
        """The output's and errors' file ids, chosen once and saved before they are written.

        A replica that dies on the way leaves them to the next, which writes the same files.
        """
        now = self._clock()
        if self._body.get("output_file_id") is None and progress.completed:
            self._body["output_file_id"] = object_id("file-", now)
        unrun = progress.total - progress.finished
        if self._body.get("error_file_id") is None and (progress.failed or unrun):
            self._body["error_file_id"] = object_id("file-", now)

    async def _write_files(self, checked: CheckedFile, status: Status) -> None:
        """Write the output and error files from the finished lines, in the input's order."""
        outputs: list[bytes] = []
        errors: list[bytes] = []
        usage = Usage()
        finished = await self._finished_lines()
        for index, line in enumerate(checked.lines):
            data = finished.get(index)
            if data is None:
                unrun = unrun_line(self._id, index, line.custom_id, status)
                errors.append(json.dumps(unrun).encode())
                continue
            (outputs if self._done[index] else errors).append(data)
            response = json.loads(data).get("response") or {}
            usage.add(response.get("body") or {})
        self._body["usage"] = usage.body()
        if self._lease_lost:  # lost while reading: the replica holding it writes them
            raise LeaseLost(self._id)
        now = self._clock()
        for field, lines, name in (
            ("output_file_id", outputs, "output"),
            ("error_file_id", errors, "error"),
        ):
            file_id = self._body.get(field)
            if file_id is None:
                continue
            content = b"".join(line + b"\n" for line in lines)
            await self._files.put(file_key(str(file_id)), content)
            body = file_object(
                str(file_id),
                len(content),
                f"batch_{self._id}_{name}.jsonl",
                OUTPUT_PURPOSE,
                now,
                self._output_expiry(now),
            )
            await self._state.registry.put_file(self._owner, body)

    def _output_expiry(self, now: float) -> int:
        """When the output and error files expire: 30 days on, unless the batch said."""
        after = self._body.get("output_expires_after")  # seconds
        seconds = after if isinstance(after, int) else BATCH_FILE_EXPIRES_SECONDS
        return int(now) + seconds
