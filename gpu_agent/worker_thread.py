"""A thread of its own for an engine's work that grows with a request: off the event loop.

Rendering a chat template, tokenizing a prompt of the most characters allowed and compiling a
JSON schema take from milliseconds to seconds. On the event loop, every other stream's tokens
would wait meanwhile; here they run on one thread, as vLLM's own server tokenizes. The
tokenizer releases the GIL while it encodes, so the loop goes on beside it.

Jobs wait for the thread on the loop (a semaphore), not in a queue of their own: a flood of
requests waits there, in order, and one whose client went away before its turn never runs.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


class WorkerThread:
    """One thread running jobs one at a time, for coroutines on one event loop."""

    def __init__(self, name: str) -> None:
        # At the process's own priority: a thread of lower priority holding the GIL when
        # cores are short would hold the loop back with it.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._turn = asyncio.Semaphore(1)

    async def run(self, job: Callable[[], T]) -> T:
        """`job`'s result (or exception), once the thread is free and has run it."""
        loop = asyncio.get_running_loop()
        await self._turn.acquire()
        try:
            running = self._executor.submit(job)
        except BaseException:
            self._turn.release()
            raise

        def done(_job: Future[T]) -> None:
            # The turn passes when the thread is free, not when a waiter stops waiting.
            with contextlib.suppress(RuntimeError):  # the loop closed first: none waits
                loop.call_soon_threadsafe(self._turn.release)

        running.add_done_callback(done)
        return await asyncio.wrap_future(running, loop=loop)

    def close(self) -> None:
        """Stop the thread once its job (if any) ends; jobs not started never run."""
        self._executor.shutdown(wait=False, cancel_futures=True)
