"""Tenants: whose prompts may meet in the gateway's prefix index and in an agent's KV cache.

A tenant is an API key (`key:<key id>`), or the tenant a key was created with
(`spotgate keys create --tenant T`: `tenant:T`), shared by every key that names it. Routing
matches a prompt's prefix only against prompts of its own tenant (gateway/prefix.py), and the
agent gives vLLM a salt per tenant (`cache_salt`), so no tenant learns, from where its stream
lands or how fast its first token comes, what another one sent.

A tenant is only ever taken from an authenticated identity: the key behind a client's
credential at the gateway, which writes it into the `generate` frames it sends to agents; the
token's subject (and `tnt` claim) for a client talking to an agent itself, where a frame that
names a tenant is refused.
"""

from __future__ import annotations

import hashlib
import re

from spotgate.admission import Refusal
from spotgate.protocol import ErrorCode, GenerateFrame
from spotgate.tokens import GATEWAY_SUBJECT_PREFIX, Claims

KEY_TENANT_PREFIX = "key:"
NAMED_TENANT_PREFIX = "tenant:"
TENANT_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""What `--tenant` accepts: letters, digits, `.`, `_`, `-`, at most 64."""


def valid_tenant_name(name: str) -> bool:
    """Whether `name` may be given to a key as its tenant."""
    return TENANT_NAME_PATTERN.fullmatch(name) is not None


def tenant_of(key_id: str, tenant_name: str | None) -> str:
    """The tenant of a key: its named tenant if it has one, else the key itself.

    Prefixed, so that no tenant name can equal another key's id.
    """
    if tenant_name:
        return f"{NAMED_TENANT_PREFIX}{tenant_name}"
    return f"{KEY_TENANT_PREFIX}{key_id}"


def is_gateway(claims: Claims) -> bool:
    """Whether the token is one a gateway presents to agents."""
    return claims.sub.startswith(GATEWAY_SUBJECT_PREFIX)


def frame_tenant_refusal(frame: GenerateFrame, *, from_gateway: bool) -> Refusal | None:
    """A `generate` frame may name its tenant only when a gateway sends it."""
    if frame.tenant is None or from_gateway:
        return None
    return Refusal(
        ErrorCode.INVALID_REQUEST,
        "tenant: set by the gateway from the API key, never by a client",
        "tenant",
    )


def agent_tenant(frame: GenerateFrame, claims: Claims) -> str:
    """The tenant an agent serves a stream for: the gateway's word, or the token's own.

    A gateway's frame carries its client's tenant; one without (a gateway that predates
    tenants) gets the gateway's own, its streams kept apart from every client's.
    """
    if is_gateway(claims) and frame.tenant is not None:
        return frame.tenant
    return tenant_of(claims.sub, claims.tnt)


def cache_salt(tenant: str) -> str:
    """VLLM's `cache_salt` for the tenant: its KV blocks match no other tenant's."""
    return hashlib.sha256(f"spotgate-tenant\x00{tenant}".encode()).hexdigest()[:32]


def shared_prompt_digest(text: str) -> str:
    """How the gateway's settings name a shared system prompt: the SHA-256 of its text, hex.

    `printf %s "$PROMPT" | sha256sum` gives the same.
    """
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
