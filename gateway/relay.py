"""One client stream through the gateway: wait for an agent, relay, resume on failure.

The gateway always asks agents for token ids, keeps the ids and text already sent to the
client, and when the agent's link drops, the agent answers `interrupted` (draining) or
refuses with `no_capacity`, sends the stream to another agent with `resume`: the client's
stream goes on with no token lost and none repeated, and `usage` counts each token once.
A stream that cannot be placed again before its deadline ends with a clear error.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass

from gateway.agent_link import AgentLink, LinkLost, LinkUnavailable
from gateway.dispatch import Dispatcher, NoCapacity, Queued, QueueFull, UnknownModel
from spotgate.logging import get_logger
from spotgate.protocol import (
    DeltaFrame,
    DoneFrame,
    ErrorCode,
    ErrorFrame,
    GenerateFrame,
    QueuedFrame,
    Resume,
    StartFrame,
    Timings,
)

RETRYABLE_AGENT_ERRORS = frozenset({ErrorCode.INTERRUPTED, ErrorCode.NO_CAPACITY})

log = get_logger(__name__)

ClientFrame = QueuedFrame | StartFrame | DeltaFrame | DoneFrame | ErrorFrame


@dataclass
class RelayOutcome:
    """How a relayed stream went, for metrics and limits."""

    agent_id: str | None = None
    resumes: int = 0
    completion_tokens: int = 0
    prompt_tokens: int = 0
    relayed_tokens: int = 0  # sent to the client so far
    queue_ms: float = 0.0
    ttft_ms: float | None = None
    added_ttft_ms: float | None = None  # the gateway's own share of `ttft_ms`, if not queued
    error: ErrorCode | None = None


async def relay_stream(
    frame: GenerateFrame,
    *,
    dispatcher: Dispatcher,
    link_for: Callable[[str], AgentLink | None],
    deadline_seconds: float,
    outcome: RelayOutcome,
) -> AsyncGenerator[ClientFrame, None]:
    """Frames for the client, in its own stream id, from whichever agents serve it."""
    started = time.monotonic()
    ids: list[int] = []
    text: list[str] = []
    excluded: set[str] = set()
    deadline = time.time() + deadline_seconds
    announced_agent: str | None = None
    queued = False
    placements = 0
    queued_at = time.monotonic()
    while True:
        try:
            chosen = None
            async for event in dispatcher.acquire(
                frame.model, session=frame.session, exclude=excluded, deadline=deadline
            ):
                if isinstance(event, Queued):
                    queued = True
                    if not ids:  # a resume waits silently: the client already has a stream
                        yield QueuedFrame(id=frame.id, position=event.position)
                else:
                    chosen = event
        except UnknownModel:
            outcome.error = ErrorCode.INVALID_REQUEST
            yield ErrorFrame(
                id=frame.id,
                code=ErrorCode.INVALID_REQUEST,
                message=f"model '{frame.model}' is not served here",
            )
            return
        except QueueFull:
            outcome.error = ErrorCode.RATE_LIMITED
            yield ErrorFrame(
                id=frame.id,
                code=ErrorCode.RATE_LIMITED,
                message=f"too many requests wait for '{frame.model}'; retry shortly",
                retry_after=1.0,
            )
            return
        except NoCapacity:
            outcome.error = ErrorCode.NO_CAPACITY
            what = "resume the stream" if ids else "serve the request"
            yield ErrorFrame(
                id=frame.id,
                code=ErrorCode.NO_CAPACITY,
                message=f"no agent for '{frame.model}' could {what} in time",
                retry_after=5.0,
            )
            return
        if chosen is None:  # acquire always ends with an agent or an exception
            continue
        if outcome.queue_ms == 0.0:
            outcome.queue_ms = (time.monotonic() - queued_at) * 1000
        link = link_for(chosen.agent_id)
        if link is None:
            excluded.add(chosen.agent_id)
            continue
        agent_frame = frame.model_copy(
            update={
                "id": uuid.uuid4().hex,
                "want_ids": True,
                "resume": Resume(token_ids=ids, text="".join(text), completion_tokens=len(ids))
                if ids
                else None,
            }
        )
        # Counted from the moment it is chosen: streams choosing while this link opens (a
        # fresh agent's first connection) must see the room the agent will have left.
        dispatcher.started(chosen.agent_id)
        try:
            channel = await link.open_stream(agent_frame)
        except LinkUnavailable as err:
            dispatcher.finished(chosen.agent_id)
            log.info("agent unavailable; trying another", agent_id=chosen.agent_id, error=str(err))
            excluded.add(chosen.agent_id)
            continue
        except BaseException:
            dispatcher.finished(chosen.agent_id)
            raise
        placements += 1
        finished = False
        retry = False
        try:
            async for item in channel.items():
                if isinstance(item, StartFrame):
                    if announced_agent != item.agent:
                        if announced_agent is not None:
                            outcome.resumes += 1
                        announced_agent = item.agent
                        outcome.agent_id = item.agent
                        yield StartFrame(id=frame.id, agent=item.agent, engine=item.engine)
                elif isinstance(item, DeltaFrame):
                    if outcome.ttft_ms is None:
                        outcome.ttft_ms = (time.monotonic() - started) * 1000
                        first_try = placements == 1 and not queued
                        if first_try and channel.first_delta_at is not None:
                            agent_ms = (channel.first_delta_at - channel.sent_at) * 1000
                            outcome.added_ttft_ms = outcome.ttft_ms - agent_ms
                    ids.extend(item.ids or ())
                    text.append(item.text)
                    outcome.relayed_tokens += item.n
                    yield DeltaFrame(
                        id=frame.id,
                        text=item.text,
                        n=item.n,
                        ids=item.ids if frame.want_ids else None,
                    )
                elif isinstance(item, DoneFrame):
                    finished = True
                    outcome.completion_tokens = item.usage.completion_tokens
                    outcome.prompt_tokens = item.usage.prompt_tokens
                    total_ms = (time.monotonic() - started) * 1000
                    yield DoneFrame(
                        id=frame.id,
                        finish_reason=item.finish_reason,
                        usage=item.usage,
                        timings=Timings(
                            queue_ms=outcome.queue_ms,
                            ttft_ms=outcome.ttft_ms if outcome.ttft_ms is not None else total_ms,
                            total_ms=total_ms,
                        ),
                    )
                    return
                elif isinstance(item, ErrorFrame):
                    finished = True
                    if item.code in RETRYABLE_AGENT_ERRORS:
                        retry = True
                        break
                    outcome.error = item.code
                    yield ErrorFrame(
                        id=frame.id,
                        code=item.code,
                        message=item.message,
                        retry_after=item.retry_after,
                    )
                    return
                elif isinstance(item, LinkLost):
                    finished = True
                    retry = True
                    break
        finally:
            dispatcher.finished(chosen.agent_id)
            if not finished:  # the client went away mid-stream
                await link.cancel(agent_frame.id)
            else:
                link.forget(agent_frame.id)
        if retry:
            deadline = time.time() + deadline_seconds  # each placement gets its own wait
            log.info(
                "resuming stream",
                stream_id=frame.id,
                failed_agent=chosen.agent_id,
                tokens_so_far=len(ids),
            )
            excluded.add(chosen.agent_id)
