"""Tenants: taken from authenticated identities only, each with a prefix-cache salt of its own."""

from __future__ import annotations

import hashlib

import pytest

from spotgate.protocol import ErrorCode, GenerateFrame
from spotgate.tenancy import (
    agent_tenant,
    cache_salt,
    frame_tenant_refusal,
    shared_prompt_digest,
    tenant_of,
    valid_tenant_name,
)
from spotgate.tokens import GATEWAY_SUBJECT_PREFIX, Claims


def frame(tenant: str | None = None) -> GenerateFrame:
    return GenerateFrame(id="s", model="m", prompt="hi", tenant=tenant)


def claims(sub: str, tnt: str | None = None) -> Claims:
    return Claims(iss="i", aud="a", sub=sub, iat=0, nbf=0, exp=60, jti="j", tnt=tnt)


GATEWAY = f"{GATEWAY_SUBJECT_PREFIX}gw-1"


def test_a_key_is_its_own_tenant_unless_it_names_one_and_no_name_is_a_key() -> None:
    assert tenant_of("abc123", None) == "key:abc123"
    assert tenant_of("abc123", "acme") == tenant_of("def456", "acme") == "tenant:acme"
    # A tenant named like another key's id is still not that key.
    assert tenant_of("abc123", "def456") != tenant_of("def456", None)


@pytest.mark.parametrize(
    ("name", "valid"),
    [("acme", True), ("a.b_c-9", True), ("x" * 64, True), ("x" * 65, False), ("", False),
     ("-lead", False), ("a b", False), ("a:b", False), ("é", False)],
)  # fmt: skip
def test_tenant_names_are_short_and_plain(name: str, valid: bool) -> None:
    assert valid_tenant_name(name) is valid


@pytest.mark.parametrize(
    ("sent", "sender", "served_for"),
    [
        # A gateway's frame carries its client's tenant.
        (frame("key:victim"), claims(GATEWAY), "key:victim"),
        # A gateway that names none: its own, apart from every client's.
        (frame(), claims(GATEWAY), f"key:{GATEWAY}"),
        # A client talking to the agent itself: its token's subject, or the tenant it names.
        (frame(), claims("abc123"), "key:abc123"),
        (frame(), claims("abc123", "acme"), "tenant:acme"),
        # A client's own `tenant` is never taken (and is refused before it gets here).
        (frame("key:victim"), claims("abc123"), "key:abc123"),
    ],
)
def test_the_agent_serves_a_stream_for_an_authenticated_tenant_only(
    sent: GenerateFrame, sender: Claims, served_for: str
) -> None:
    assert agent_tenant(sent, sender) == served_for


def test_only_a_gateway_may_name_a_frames_tenant() -> None:
    refusal = frame_tenant_refusal(frame("key:victim"), from_gateway=False)
    assert refusal is not None
    assert (refusal.code, refusal.param) == (ErrorCode.INVALID_REQUEST, "tenant")
    assert frame_tenant_refusal(frame("key:victim"), from_gateway=True) is None
    assert frame_tenant_refusal(frame(), from_gateway=False) is None


def test_each_tenant_has_a_salt_of_its_own_that_names_nothing() -> None:
    salts = {cache_salt(tenant) for tenant in ("key:a", "key:b", "tenant:a", "tenant:acme")}
    assert len(salts) == 4
    assert cache_salt("key:a") == cache_salt("key:a")
    assert all("key" not in salt and "acme" not in salt for salt in salts)


def test_a_shared_prompt_is_named_by_the_sha256_an_operator_computes() -> None:
    text = "You are a helpful assistant.\nBe brief."
    assert shared_prompt_digest(text) == hashlib.sha256(text.encode()).hexdigest()
