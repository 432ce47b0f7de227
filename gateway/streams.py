"""A client's stream through the gateway: admitted (`spotgate.admission`), then relayed.

Shared by the websocket and the OpenAI HTTP routes: `stream_refusal` is the gateway's
admission check, `admitted_frames` a stream's frames for its client (after the key's rate
limits), `start_stream` the same frames sent from their own task, for a websocket.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing, suppress
from dataclasses import dataclass

from gateway.auth import Principal
from gateway.charges import resume_as_prompt
from gateway.ratelimit import prompt_tokens_estimate
from gateway.relay import ClientFrame, DirectSend, RelayOutcome, relay_stream
from gateway.state import GatewayState
from spotgate.admission import (
    GatewayConditions,
    Refusal,
    charged_resume_tokens,
    gateway_refusal,
)
from spotgate.logging import bound_context
from spotgate.protocol import (
    DeltaFrame,
    DoneFrame,
    ErrorCode,
    ErrorFrame,
    GenerateFrame,
    Usage,
    client_delta_json,
)
from spotgate.tenancy import frame_tenant_refusal
from spotgate.wsserver import FrameSocket


@dataclass(eq=False)
class RelayHandle:
    """A client stream relayed by this gateway."""

    task: asyncio.Task[None]

    def end(self, reason: str) -> None:
        """Stop relaying (the client cancelled or went away); a second call changes nothing."""
        # Once: a second cancellation would land in the relay's cleanup (cancelling the
        # agents' streams, giving their slots back, charging the key) and cut it short.
        if not self.task.done() and not self.task.cancelling():
            self.task.cancel()


@dataclass(frozen=True, slots=True)
class SocketDeltas:
    """A websocket client's deltas sent at once (`DirectSend`), each in its own stream id."""

    socket: FrameSocket

    def keeps_up(self) -> bool:
        """Whether the socket takes a frame now (`FrameSocket.keeps_up`)."""
        return self.socket.keeps_up()

    def send_delta(
        self, delta: DeltaFrame, stream_id: str, *, with_ids: bool, receipt: str | None
    ) -> None:
        """Queue the client's frame of the agent's `delta` for this turn's write."""
        self.socket.send_now(
            client_delta_json(delta, stream_id, with_ids=with_ids, receipt=receipt)
        )


def resume_delivered(state: GatewayState, frame: GenerateFrame, principal: Principal) -> bool:
    """Whether the stream's `resume` is what the deployment delivered to the key (receipts)."""
    return state.receipts.delivered(principal.key_id, frame)


def stream_refusal(
    state: GatewayState, frame: GenerateFrame, principal: Principal
) -> Refusal | None:
    """Whether this gateway admits the stream now (`spotgate.admission.gateway_refusal`)."""
    tenant_refusal = frame_tenant_refusal(frame, from_gateway=False)
    if tenant_refusal is not None:
        return tenant_refusal
    dispatcher = state.dispatcher
    conditions = GatewayConditions(
        shutting_down=state.shutting_down,
        max_prompt_chars=state.settings.limits.max_prompt_chars,
        context=dispatcher.view.context_limits(frame.base_model),
        model_known=dispatcher.knows(frame.base_model),
        resume_delivered=resume_delivered(state, frame, principal),
    )
    return gateway_refusal(frame, principal.grant, conditions, state.clock())


async def admitted_frames(
    state: GatewayState,
    frame: GenerateFrame,
    principal: Principal,
    outcome: RelayOutcome,
    direct: DirectSend | None = None,
    wait_seconds: float | None = None,
) -> AsyncGenerator[ClientFrame, None]:
    """A stream's frames for its client: admitted against its key's limits, then relayed.

    `wait_seconds`: how long it may wait for an agent, if not its tier's queue deadline.

    The frame names the key's tenant from here on: routing matches its prompt within it, and
    the agent salts its prefix cache with it. With `direct`, the client's connection, deltas
    may go there at once instead (`relay_stream`).
    """
    named: dict[str, object] = {"tenant": principal.tenant}
    if principal.max_tokens is not None:  # a reply with no max_tokens stops at the key's limit
        named["max_tokens_cap"] = principal.max_tokens
    frame = frame.model_copy(update=named)
    state.dispatcher.weigh(principal.tenant, principal.weight)
    revoked = await state.authenticator.revoked(principal)
    if revoked is not None:
        state.metrics.rejections.labels(reason="unauthorized").inc()
        yield ErrorFrame(id=frame.id, code=ErrorCode.UNAUTHORIZED, message=revoked)
        return
    # A resume the deployment did not deliver to this key is prompt the client wrote.
    resumed_prompt_tokens = charged_resume_tokens(frame, resume_delivered(state, frame, principal))
    admission = await state.limits.admit(
        principal.key_id,
        principal.limits,
        state.clock(),
        prompt_tokens_estimate(frame.prompt_chars()) + resumed_prompt_tokens,
    )
    decision = admission.decision
    if not decision.admitted:
        state.metrics.rejections.labels(reason="rate_limited").inc()
        yield ErrorFrame(
            id=frame.id,
            code=ErrorCode.RATE_LIMITED,
            message=decision.reason,
            retry_after=decision.retry_after,
        )
        return
    queue = state.settings.queue
    state.opened(frame)
    try:
        with bound_context(stream_id=frame.id, key_id=principal.key_id):
            frames = relay_stream(
                frame,
                dispatcher=state.dispatcher,
                link_for=state.link_for,
                deadline_seconds=wait_seconds or queue.tier_deadline_seconds(frame.service_tier),
                stall_seconds=queue.stall_seconds,
                move_early=queue.move_before_break,
                outcome=outcome,
                receipts=state.receipts.chain(principal.key_id, frame) if frame.want_ids else None,
                direct=direct,
            )
            async with aclosing(frames) as relayed:
                async for out in relayed:
                    if resumed_prompt_tokens and isinstance(out, DoneFrame) and out.usage:
                        usage = resume_as_prompt(out.usage, resumed_prompt_tokens)
                        out = out.model_copy(update={"usage": usage})
                    yield out
    finally:
        state.closed(frame)
        state.metrics.record(outcome)
        for agent_id, capped in outcome.capped:  # an agent said it used more than measured
            state.dispatcher.rogues.usage_capped(agent_id, capped)
        # What the client received, at least: a stream cut short may end without a count. A
        # stream the client resumed here counts the tokens it brought: delivered ones were
        # charged where it got them, any others are charged as prompt below.
        brought = len(frame.resume.token_ids) if frame.resume is not None else 0
        completion_tokens = max(outcome.completion_tokens - brought, outcome.relayed_tokens)
        # Replaces the prompt's estimate charged at admission: a stream no agent took (no
        # prefill) gets it back.
        prompt_tokens = outcome.prompt_tokens + (
            resumed_prompt_tokens if outcome.prompt_tokens else 0
        )
        used = prompt_tokens + completion_tokens
        state.usage.record(
            principal.key_id,
            frame.model,
            prompt_tokens,
            completion_tokens,
            state.clock(),
            flex=frame.service_tier == "flex",
        )
        try:
            await state.limits.finish(admission, used, state.clock())
        finally:  # a drain waits for this: the store's client must outlive the call
            state.active_streams -= 1
            if state.active_streams == 0:
                state.idle.set()


def start_stream(
    state: GatewayState, frame: GenerateFrame, principal: Principal, socket: FrameSocket
) -> RelayHandle:
    """Relay a websocket stream in its own task; its frames go to the client's `socket`.

    A stream cancelled by its client still ends with a `done` frame (`cancelled`, with the
    tokens it got), so the client knows where it stopped.
    """
    outcome = RelayOutcome()
    started = time.monotonic()

    async def run() -> None:
        try:
            direct = SocketDeltas(socket)
            relayed = admitted_frames(state, frame, principal, outcome, direct=direct)
            async with aclosing(relayed) as frames:
                async for out in frames:
                    await socket.send(out)
        except asyncio.CancelledError:
            elapsed_ms = (time.monotonic() - started) * 1000
            done = DoneFrame(
                id=frame.id,
                finish_reason="cancelled",
                usage=Usage(
                    prompt_tokens=outcome.prompt_tokens,
                    completion_tokens=outcome.relayed_tokens,
                ),
                timings=outcome.timings(elapsed_ms),
            )
            with suppress(Exception):  # the socket may be what went away
                await socket.send(done)
            raise

    return RelayHandle(asyncio.create_task(run(), name=f"relay {frame.id}"))
