from __future__ import annotations

from typing import Any

import pytest

from spotgate.admission import (
    AgentConditions,
    GatewayConditions,
    Grant,
    Refusal,
    agent_refusal,
    agent_stream_refusal,
    agent_unavailable,
    charged_resume_tokens,
    gateway_refusal,
    model_allowed,
)
from spotgate.context import ContextLimits
from spotgate.protocol import ErrorCode, GenerateFrame, Resume

NOW = 1_800_000_000.0
MAX_PROMPT_CHARS = 100
CONTEXT = ContextLimits(max_model_len=64, max_token_chars=4)
GATEWAY = GatewayConditions(shutting_down=False, max_prompt_chars=MAX_PROMPT_CHARS, context=None)
UNKNOWN_MODEL = GatewayConditions(False, MAX_PROMPT_CHARS, None, model_known=False)
NOT_FOUND = Refusal(
    ErrorCode.MODEL_NOT_FOUND,
    "model 'x' is not served here; GET /v1/models lists those that are",
    param="model",
)
KEY = Grant(models=frozenset({"m"}), max_tokens=32)
ANY_KEY = Grant()
TOKEN = Grant(models=frozenset({"m"}), max_tokens=32, expires_at=NOW + 60)
READY = AgentConditions(phase="ready", accepting=True, engine_loaded=True, token_leeway_seconds=5.0)

EXPIRED = Refusal(ErrorCode.UNAUTHORIZED, "token expired; send an 'auth' frame with a fresh one")
SHUTTING_DOWN = Refusal(ErrorCode.GOING_AWAY, "this gateway is shutting down; reconnect to retry")


def frame(model: str = "m", prompt: str = "hi", **fields: Any) -> GenerateFrame:
    return GenerateFrame(id="s1", model=model, prompt=prompt, **fields)


def forbidden(model: str) -> Refusal:
    return Refusal(ErrorCode.FORBIDDEN, f"this key may not use model '{model}'")


def over_cap(asked: int, cap: int) -> Refusal:
    return Refusal(
        ErrorCode.INVALID_REQUEST, f"max_tokens {asked} exceeds this key's limit of {cap}"
    )


def too_long(chars: int, param: str = "prompt", fields: str = "") -> Refusal:
    told = f" ({fields})" if fields else ""
    return Refusal(
        ErrorCode.INVALID_REQUEST,
        f"prompt of {chars} characters{told} exceeds the limit of {MAX_PROMPT_CHARS}",
        param=param,
    )


def context_exceeded(prompt_tokens: int, max_tokens: int) -> Refusal:
    return Refusal(
        ErrorCode.CONTEXT_LENGTH_EXCEEDED,
        "This model's maximum context length is 64 tokens. However, you requested at least "
        f"{prompt_tokens + max_tokens} tokens (at least {prompt_tokens} in the prompt, "
        f"{max_tokens} in the completion). Please reduce the length of the prompt or of "
        "max_tokens.",
    )


# --- the model a key may use ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("models", "model", "allowed"),
    [
        (frozenset(), "anything", True),  # no models: every model
        (frozenset({"m"}), "m", True),
        (frozenset({"m"}), "n", False),
        (frozenset({"m", "n"}), "n", True),
        (("m",), "m", True),  # a token's `mdl` tuple
        (("m",), "M", False),  # names are exact
    ],
)
def test_model_allowed_empty_means_every_model(
    models: frozenset[str] | tuple[str, ...], model: str, allowed: bool
) -> None:
    assert model_allowed(models, model) is allowed


# --- the gateway ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_frame", "grant", "gateway", "now", "expected"),
    [
        pytest.param(frame(), KEY, GATEWAY, NOW, None, id="admitted"),
        pytest.param(
            frame(),
            KEY,
            GatewayConditions(shutting_down=True, max_prompt_chars=100, context=None),
            NOW,
            SHUTTING_DOWN,
            id="shutting-down",
        ),
        # the model a key may use
        pytest.param(frame("n"), KEY, GATEWAY, NOW, forbidden("n"), id="model-not-granted"),
        pytest.param(frame("n"), ANY_KEY, GATEWAY, NOW, None, id="no-models-means-every-model"),
        # max_tokens against the key's cap
        pytest.param(frame(max_tokens=32), KEY, GATEWAY, NOW, None, id="max-tokens-at-cap"),
        pytest.param(
            frame(max_tokens=33), KEY, GATEWAY, NOW, over_cap(33, 32), id="max-tokens-over-cap"
        ),
        pytest.param(frame(), KEY, GATEWAY, NOW, None, id="no-max-tokens-is-capped-later"),
        pytest.param(frame(max_tokens=10**6), ANY_KEY, GATEWAY, NOW, None, id="no-cap"),
        # prompt characters
        pytest.param(frame(prompt="x" * 100), KEY, GATEWAY, NOW, None, id="prompt-at-limit"),
        pytest.param(frame(prompt="x" * 101), KEY, GATEWAY, NOW, too_long(101), id="prompt-over"),
        pytest.param(
            frame(prompt=None, messages=[{"role": "user", "content": "x" * 101}]),
            KEY,
            GATEWAY,
            NOW,
            too_long(101, "messages"),
            id="chat-prompt-over",
        ),
        # a client may continue a stream it holds part of (the agent checks the ids)
        pytest.param(
            frame(resume=Resume(token_ids=[7], text="a", completion_tokens=1)),
            KEY,
            GATEWAY,
            NOW,
            None,
            id="resume-from-a-client",
        ),
        # token expiry: refused at exactly `now`
        pytest.param(frame(), TOKEN, GATEWAY, NOW + 59.999, None, id="token-before-expiry"),
        pytest.param(frame(), TOKEN, GATEWAY, NOW + 60, EXPIRED, id="token-expires-at-now"),
        pytest.param(frame(), KEY, GATEWAY, NOW + 10**9, None, id="api-key-never-expires"),
        # context length, from the prompt's length alone (4 chars per token at most)
        pytest.param(
            frame(prompt="x" * 40, max_tokens=54),
            ANY_KEY,
            GatewayConditions(False, MAX_PROMPT_CHARS, CONTEXT),
            NOW,
            None,
            id="context-just-fits",
        ),
        pytest.param(
            frame(prompt="x" * 40, max_tokens=55),
            ANY_KEY,
            GatewayConditions(False, MAX_PROMPT_CHARS, CONTEXT),
            NOW,
            context_exceeded(10, 55),
            id="context-exceeded",
        ),
        pytest.param(
            frame(prompt="x" * 40, max_tokens=55), ANY_KEY, GATEWAY, NOW, None, id="context-unknown"
        ),
        # the order of the checks: the first refusal is the one sent
        pytest.param(
            frame("n"),
            TOKEN,
            GatewayConditions(True, MAX_PROMPT_CHARS, None),
            NOW + 60,
            SHUTTING_DOWN,
            id="shutting-down-before-expiry",
        ),
        pytest.param(frame("n"), TOKEN, GATEWAY, NOW + 60, EXPIRED, id="expiry-before-model"),
        pytest.param(
            frame("n", max_tokens=33), KEY, GATEWAY, NOW, forbidden("n"), id="model-before-cap"
        ),
        pytest.param(
            frame(prompt="x" * 101, max_tokens=33),
            KEY,
            GATEWAY,
            NOW,
            over_cap(33, 32),
            id="cap-before-prompt",
        ),
        # a model nobody serves or is configured to: OpenAI's 404, after the request's own checks
        pytest.param(frame("x"), ANY_KEY, UNKNOWN_MODEL, NOW, NOT_FOUND, id="unknown-model"),
        pytest.param(frame("n"), KEY, UNKNOWN_MODEL, NOW, forbidden("n"), id="key-before-model"),
        pytest.param(
            frame("x", prompt="x" * 101),
            ANY_KEY,
            UNKNOWN_MODEL,
            NOW,
            too_long(101),
            id="prompt-before-model",
        ),
        pytest.param(
            frame(prompt="x" * 101, resume=Resume(token_ids=[], text="", completion_tokens=0)),
            KEY,
            GATEWAY,
            NOW,
            too_long(101),
            id="prompt-before-resume",
        ),
        pytest.param(
            frame(
                prompt="x" * 40,
                max_tokens=55,
                resume=Resume(token_ids=[1], text="a", completion_tokens=1),
            ),
            ANY_KEY,
            GatewayConditions(False, MAX_PROMPT_CHARS, CONTEXT),
            NOW,
            context_exceeded(10, 55),
            id="a-resumed-stream-is-checked-like-any-other",
        ),
    ],
)
def test_gateway_refusal(
    request_frame: GenerateFrame,
    grant: Grant,
    gateway: GatewayConditions,
    now: float,
    expected: Refusal | None,
) -> None:
    assert gateway_refusal(request_frame, grant, gateway, now) == expected


# --- an agent, when a stream arrives on its socket ------------------------------------------


@pytest.mark.parametrize(
    ("grant", "agent", "now", "expected"),
    [
        pytest.param(TOKEN, READY, NOW, None, id="admitted"),
        # the agent's leeway: refused at exactly expiry + leeway
        pytest.param(TOKEN, READY, NOW + 64.999, None, id="within-leeway"),
        pytest.param(TOKEN, READY, NOW + 65, EXPIRED, id="expires-at-leeway"),
        pytest.param(
            TOKEN,
            AgentConditions("ready", True, True, token_leeway_seconds=0.0),
            NOW + 60,
            EXPIRED,
            id="no-leeway-expires-at-exp",
        ),
        pytest.param(
            TOKEN,
            AgentConditions("draining", False, True, 5.0),
            NOW,
            Refusal(ErrorCode.NO_CAPACITY, "this agent is draining; try another"),
            id="not-accepting",
        ),
        pytest.param(
            TOKEN,
            AgentConditions("loading", True, False, 5.0),
            NOW,
            Refusal(ErrorCode.NO_CAPACITY, "this agent is loading; try another"),
            id="engine-not-loaded",
        ),
        pytest.param(
            TOKEN,
            AgentConditions("draining", False, True, 5.0),
            NOW + 65,
            EXPIRED,
            id="expiry-before-availability",
        ),
        pytest.param(
            TOKEN,
            AgentConditions("ready", True, True, 5.0, streams=3, capacity=4),
            NOW,
            None,
            id="room-for-one-more",
        ),
        pytest.param(
            TOKEN,
            AgentConditions("ready", True, True, 5.0, streams=4, capacity=4),
            NOW,
            Refusal(
                ErrorCode.NO_CAPACITY, "this agent serves its capacity of 4 streams; try another"
            ),
            id="at-capacity-over-all-gateways",
        ),
    ],
)
def test_agent_refusal(
    grant: Grant, agent: AgentConditions, now: float, expected: Refusal | None
) -> None:
    assert agent_refusal(grant, agent, now) == expected


@pytest.mark.parametrize(
    ("agent", "expected"),
    [
        (READY, None),
        (
            AgentConditions("starting", False, False),
            Refusal(ErrorCode.NO_CAPACITY, "this agent is starting; try another"),
        ),
    ],
)
def test_agent_unavailable(agent: AgentConditions, expected: Refusal | None) -> None:
    assert agent_unavailable(agent) == expected


# --- an agent, before its engine sees a stream -------------------------------------------


@pytest.mark.parametrize(
    ("request_frame", "grant", "expected"),
    [
        pytest.param(frame(), TOKEN, None, id="admitted"),
        pytest.param(
            frame("other"),
            ANY_KEY,
            Refusal(
                ErrorCode.INVALID_REQUEST,
                "model 'other' is not served here; this agent serves 'm'",
            ),
            id="model-not-served-here",
        ),
        pytest.param(
            frame("other"),
            Grant(models=frozenset({"m"})),
            Refusal(
                ErrorCode.INVALID_REQUEST,
                "model 'other' is not served here; this agent serves 'm'",
            ),
            id="not-served-before-not-granted",
        ),
        pytest.param(
            frame(), Grant(models=frozenset({"n"})), forbidden("m"), id="model-not-granted"
        ),
        pytest.param(frame(), ANY_KEY, None, id="no-models-means-every-model"),
        pytest.param(frame(max_tokens=32), TOKEN, None, id="max-tokens-at-cap"),
        pytest.param(frame(max_tokens=33), TOKEN, over_cap(33, 32), id="max-tokens-over-cap"),
        pytest.param(frame(prompt="x" * 100), TOKEN, None, id="prompt-at-limit"),
        pytest.param(frame(prompt="x" * 101), TOKEN, too_long(101), id="prompt-over"),
        pytest.param(
            frame(resume=Resume(token_ids=[1], text="a", completion_tokens=1)),
            TOKEN,
            None,
            id="resume-from-the-gateway",
        ),
        # an agent's stream check leaves expiry to the socket (and the token's verification)
        pytest.param(frame(), Grant(expires_at=NOW - 1), None, id="expiry-not-checked-here"),
        pytest.param(frame("m:sql"), TOKEN, None, id="an-adapter-it-serves"),
        pytest.param(
            frame("m:sql"), Grant(models=frozenset({"m"})), None, id="a-granted-models-adapter"
        ),
        pytest.param(
            frame("m:legal"),
            TOKEN,
            Refusal(
                ErrorCode.MODEL_NOT_FOUND,
                "model 'm:legal': no adapter 'legal' of 'm' is served here; its adapters: sql",
                param="model",
            ),
            id="an-adapter-it-does-not-serve",
        ),
        pytest.param(
            frame("m:sql"),
            Grant(models=frozenset({"m:legal"})),
            forbidden("m:sql"),
            id="another-adapter-granted",
        ),
    ],
)
def test_agent_stream_refusal(
    request_frame: GenerateFrame, grant: Grant, expected: Refusal | None
) -> None:
    refusal = agent_stream_refusal(
        request_frame,
        grant,
        served_model="m",
        max_prompt_chars=MAX_PROMPT_CHARS,
        adapters=("sql",),
    )
    assert refusal == expected


# --- a client's resume: free when delivered, prompt otherwise --------------------------------

HELD = Resume(token_ids=[1, 2, 3], text="x" * 60, completion_tokens=3)


@pytest.mark.parametrize(
    ("resume", "delivered", "tokens", "refusal"),
    [
        (None, False, 0, None),
        (HELD, True, 0, None),  # charged where it was delivered; its text is no prompt
        (HELD, False, 3, None),  # 2 + 60 characters: within the limit
        (
            HELD.model_copy(update={"text": "x" * 99}),
            False,
            3,
            Refusal(
                ErrorCode.INVALID_REQUEST,
                "prompt of 101 characters, with the resume's text (which this deployment did "
                f"not deliver to this key), exceeds the limit of {MAX_PROMPT_CHARS}",
                param="resume",
            ),
        ),
        (HELD.model_copy(update={"text": "x" * 99}), True, 0, None),
    ],
)
def test_a_resume_the_deployment_did_not_deliver_is_charged_and_limited_as_prompt(
    resume: Resume | None, delivered: bool, tokens: int, refusal: Refusal | None
) -> None:
    sent = frame(resume=resume)
    assert charged_resume_tokens(sent, delivered) == tokens
    conditions = GatewayConditions(False, MAX_PROMPT_CHARS, None, resume_delivered=delivered)
    assert gateway_refusal(sent, ANY_KEY, conditions, NOW) == refusal
