"""Whether a stream is admitted: the rules of the gateway and of the agents, written once.

Pure functions over plain data: no I/O, no clock (callers pass `now`). A credential's rights
are a `Grant`, which both the gateway's `Principal` and the agent's token `Claims` produce;
what the service knows about itself when the stream arrives is a `GatewayConditions` or an
`AgentConditions`. Each check answers None (admitted) or the `Refusal` the client is sent.

The gateway checks everything it can before a stream is queued (`gateway_refusal`). An agent
checks twice: when a stream arrives on a socket (`agent_refusal`: a live token, an agent
taking streams), then before its engine sees it (`agent_stream_refusal`: the model it
serves, the key's limits, the prompt's size).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from spotgate.context import ContextLimits, early_refusal
from spotgate.protocol import ErrorCode, GenerateFrame, split_model


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a stream is not admitted: the `error` code and message, and the field at fault."""

    code: ErrorCode
    message: str
    param: str | None = None


@dataclass(frozen=True, slots=True)
class Grant:
    """What a credential allows: its models (empty: every one), a max_tokens cap, an expiry."""

    models: frozenset[str] = frozenset()
    max_tokens: int | None = None
    expires_at: float | None = None  # epoch seconds; None: an API key, which does not expire


@dataclass(frozen=True, slots=True)
class GatewayConditions:
    """What the gateway knows when a stream arrives."""

    shutting_down: bool
    max_prompt_chars: int
    context: ContextLimits | None  # the most the model's agents hold; None: none has said
    model_known: bool = True  # configured, or served by an agent in the registry
    resume_delivered: bool = False
    """The stream's `resume` holds only what this deployment delivered to the key (its
    receipt checks out); any other resume is charged, and limited, as prompt."""


@dataclass(frozen=True, slots=True)
class AgentConditions:
    """What an agent knows about itself when a stream arrives."""

    phase: str
    accepting: bool
    engine_loaded: bool
    token_leeway_seconds: float = 0.0
    streams: int = 0
    """Streams the agent serves now, over every gateway link and client."""
    capacity: int | None = None
    """The most it serves at once (its engine's `max_num_seqs`); None: no engine yet."""


def model_allowed(models: Collection[str], model: str) -> bool:
    """Whether a credential limited to `models` may use `model` (no models: every one).

    An adapter of a model the credential may use is allowed too.
    """
    return not models or model in models or split_model(model)[0] in models


def expiry_refusal(grant: Grant, now: float, leeway_seconds: float = 0.0) -> Refusal | None:
    """Refused once the credential's expiry (plus `leeway_seconds`) is not after `now`."""
    if grant.expires_at is not None and grant.expires_at + leeway_seconds <= now:
        return Refusal(
            ErrorCode.UNAUTHORIZED, "token expired; send an 'auth' frame with a fresh one"
        )
    return None


def grant_refusal(frame: GenerateFrame, grant: Grant) -> Refusal | None:
    """The key's own limits: the models it may use, the most max_tokens it may ask for."""
    if not model_allowed(grant.models, frame.model):
        return Refusal(ErrorCode.FORBIDDEN, f"this key may not use model '{frame.model}'")
    if (
        grant.max_tokens is not None
        and frame.max_tokens is not None
        and frame.max_tokens > grant.max_tokens
    ):
        return Refusal(
            ErrorCode.INVALID_REQUEST,
            f"max_tokens {frame.max_tokens} exceeds this key's limit of {grant.max_tokens}",
        )
    return None


def prompt_refusal(frame: GenerateFrame, max_prompt_chars: int) -> Refusal | None:
    """Refused when the prompt has more than `max_prompt_chars` characters, all fields told.

    Tools and schemas count as the messages do; `param` is the field with the most of them.
    """
    fields = frame.prompt_chars_by_field()
    chars = sum(fields.values())
    if chars <= max_prompt_chars:
        return None
    largest = max(fields, key=lambda field: fields[field])
    parts = ", ".join(f"{field} {count}" for field, count in fields.items() if count)
    told = f" ({parts})" if len(fields) > 1 else ""
    return Refusal(
        ErrorCode.INVALID_REQUEST,
        f"prompt of {chars} characters{told} exceeds the limit of {max_prompt_chars}",
        param=largest,
    )


def charged_resume_tokens(frame: GenerateFrame, delivered: bool) -> int:
    """Resumed tokens charged as prompt: all of a resume the deployment did not deliver."""
    if frame.resume is None or delivered:
        return 0
    return len(frame.resume.token_ids)


def charged_resume_refusal(
    frame: GenerateFrame, delivered: bool, max_prompt_chars: int
) -> Refusal | None:
    """Refused when a resume charged as prompt takes the prompt past `max_prompt_chars`."""
    if frame.resume is None or delivered:
        return None
    chars = frame.prompt_chars() + len(frame.resume.text)
    if chars > max_prompt_chars:
        return Refusal(
            ErrorCode.INVALID_REQUEST,
            f"prompt of {chars} characters, with the resume's text (which this deployment did "
            f"not deliver to this key), exceeds the limit of {max_prompt_chars}",
            param="resume",
        )
    return None


def gateway_refusal(
    frame: GenerateFrame, grant: Grant, gateway: GatewayConditions, now: float
) -> Refusal | None:
    """The gateway's check of a client's stream, before it is queued for an agent."""
    if gateway.shutting_down:
        return Refusal(ErrorCode.GOING_AWAY, "this gateway is shutting down; reconnect to retry")
    refusal = (
        expiry_refusal(grant, now)
        or grant_refusal(frame, grant)
        or prompt_refusal(frame, gateway.max_prompt_chars)
        or charged_resume_refusal(frame, gateway.resume_delivered, gateway.max_prompt_chars)
    )
    if refusal is not None:
        return refusal
    if not gateway.model_known:
        return unknown_model(frame)
    too_long = early_refusal(frame, gateway.context) if gateway.context is not None else None
    if too_long is not None:
        return Refusal(ErrorCode.CONTEXT_LENGTH_EXCEEDED, too_long)
    return None


def unknown_model(frame: GenerateFrame) -> Refusal:
    """OpenAI's 404 for a model no agent serves and none is configured to."""
    return Refusal(
        ErrorCode.MODEL_NOT_FOUND,
        f"model '{frame.model}' is not served here; GET /v1/models lists those that are",
        param="model",
    )


def agent_unavailable(agent: AgentConditions) -> Refusal | None:
    """Refused unless the agent takes new streams, has its engine loaded and has room.

    The agent is the authority on its capacity: several gateways route to it, and none of
    them knows what the others have sent.
    """
    if not (agent.accepting and agent.engine_loaded):
        return Refusal(ErrorCode.NO_CAPACITY, f"this agent is {agent.phase}; try another")
    if agent.capacity is not None and agent.streams >= agent.capacity:
        return Refusal(
            ErrorCode.NO_CAPACITY,
            f"this agent serves its capacity of {agent.capacity} streams; try another",
        )
    return None


def agent_refusal(grant: Grant, agent: AgentConditions, now: float) -> Refusal | None:
    """The agent's check of a stream arriving on a socket: a live token, an agent taking it."""
    return expiry_refusal(grant, now, agent.token_leeway_seconds) or agent_unavailable(agent)


def agent_stream_refusal(
    frame: GenerateFrame,
    grant: Grant,
    *,
    served_model: str,
    max_prompt_chars: int,
    adapters: Collection[str] = (),
) -> Refusal | None:
    """The agent's check before its engine sees a stream: model, adapter, key, prompt."""
    if frame.base_model != served_model:
        return Refusal(
            ErrorCode.INVALID_REQUEST,
            f"model '{frame.model}' is not served here; this agent serves '{served_model}'",
        )
    adapter = frame.adapter
    if adapter is not None and adapter not in adapters:
        served = ", ".join(sorted(adapters)) or "none"
        return Refusal(
            ErrorCode.MODEL_NOT_FOUND,
            f"model '{frame.model}': no adapter '{adapter}' of '{served_model}' is served here; "
            f"its adapters: {served}",
            param="model",
        )
    return grant_refusal(frame, grant) or prompt_refusal(frame, max_prompt_chars)
