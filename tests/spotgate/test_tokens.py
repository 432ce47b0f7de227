from __future__ import annotations

import base64
import hashlib
import hmac
import json

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from pydantic import SecretStr

from spotgate.admission import Grant
from spotgate.settings import TokenSettings
from spotgate.tokens import (
    AGENT_AUDIENCE,
    MAX_TOKEN_CHARS,
    BadAudience,
    BadIssuer,
    BadSignature,
    KeyFormatError,
    KeyRing,
    MalformedToken,
    SigningKey,
    TokenError,
    TokenExpired,
    TokenNotYetValid,
    UnknownKid,
    VerifyKey,
    WrongAlgorithm,
    issue,
    jwk_thumbprint,
    load_signing_keys_pem,
    signing_keys_from_settings,
    verify,
)

ISSUER = "https://gw.example"
NOW = 1_800_000_000.0


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def b64json(value: object) -> str:
    return b64(json.dumps(value).encode())


@pytest.fixture
def ring() -> KeyRing:
    return KeyRing([SigningKey.generate()])


def check(ring: KeyRing, token: str, now: float = NOW):
    return verify(ring, token, issuer=ISSUER, now=now)


def test_issued_token_verifies_with_its_claims(ring: KeyRing) -> None:
    issued = issue(
        ring,
        subject="k1",
        issuer=ISSUER,
        now=NOW,
        ttl_seconds=90,
        models=["m"],
        max_tokens=64,
        tenant="acme",
    )

    claims = check(ring, issued.token)

    assert claims == issued.claims
    assert (claims.sub, claims.aud, claims.iss) == ("k1", AGENT_AUDIENCE, ISSUER)
    assert claims.exp == int(NOW) + 90 == issued.expires_at
    assert claims.mdl == ("m",)
    assert claims.mtk == 64
    assert claims.tnt == "acme"
    assert claims.allows_model("m")
    assert not claims.allows_model("n")
    assert jwt.get_unverified_header(issued.token)["kid"] == ring.signing_key.kid


def test_each_token_has_its_own_jti(ring: KeyRing) -> None:
    first = issue(ring, subject="k", issuer=ISSUER, now=NOW)
    second = issue(ring, subject="k", issuer=ISSUER, now=NOW)
    assert first.claims.jti != second.claims.jti


@pytest.mark.parametrize("ttl", [0, 15 * 60 + 1])
def test_issue_refuses_lifetimes_outside_bounds(ring: KeyRing, ttl: int) -> None:
    with pytest.raises(ValueError, match="ttl_seconds"):
        issue(ring, subject="k", issuer=ISSUER, now=NOW, ttl_seconds=ttl)


def test_alg_none_is_refused(ring: KeyRing) -> None:
    issued = issue(ring, subject="k", issuer=ISSUER, now=NOW)
    header = {"alg": "none", "typ": "JWT", "kid": ring.signing_key.kid}
    token = f"{b64json(header)}.{b64json(issued.claims.to_payload())}."
    with pytest.raises(WrongAlgorithm):
        check(ring, token)


def test_hs256_signed_with_the_public_key_is_refused(ring: KeyRing) -> None:
    issued = issue(ring, subject="k", issuer=ISSUER, now=NOW)
    public_pem = ring.signing_key.verify_key.to_pem().encode()
    header = {"alg": "HS256", "typ": "JWT", "kid": ring.signing_key.kid}
    signing_input = f"{b64json(header)}.{b64json(issued.claims.to_payload())}"
    for secret in (public_pem, base64.urlsafe_b64decode(ring.jwks()["keys"][0]["x"] + "=")):
        signature = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
        with pytest.raises(WrongAlgorithm):
            check(ring, f"{signing_input}.{b64(signature)}")


def test_expired_token_is_refused_after_leeway(ring: KeyRing) -> None:
    issued = issue(ring, subject="k", issuer=ISSUER, now=NOW, ttl_seconds=60)
    assert check(ring, issued.token, now=NOW + 64)  # within the 5 s leeway
    with pytest.raises(TokenExpired):
        check(ring, issued.token, now=NOW + 65)


def test_token_from_the_future_is_refused(ring: KeyRing) -> None:
    issued = issue(ring, subject="k", issuer=ISSUER, now=NOW + 60)
    assert check(ring, issue(ring, subject="k", issuer=ISSUER, now=NOW + 4).token)
    with pytest.raises(TokenNotYetValid):
        check(ring, issued.token)


def test_future_nbf_signed_by_us_is_refused(ring: KeyRing) -> None:
    payload = issue(ring, subject="k", issuer=ISSUER, now=NOW).claims.to_payload()
    payload["nbf"] = int(NOW) + 120
    payload["exp"] = int(NOW) + 180
    token = jwt.encode(
        payload,
        ring.signing_key.private_key,
        algorithm="EdDSA",
        headers={"kid": ring.signing_key.kid},
    )
    with pytest.raises(TokenNotYetValid):
        check(ring, token)


def test_wrong_audience_and_issuer_are_refused(ring: KeyRing) -> None:
    wrong_aud = issue(ring, subject="k", issuer=ISSUER, now=NOW, audience="someone-else")
    wrong_iss = issue(ring, subject="k", issuer="https://evil.example", now=NOW)
    with pytest.raises(BadAudience):
        check(ring, wrong_aud.token)
    with pytest.raises(BadIssuer):
        check(ring, wrong_iss.token)


def test_unknown_kid_is_refused(ring: KeyRing) -> None:
    stranger = KeyRing([SigningKey.generate()])
    token = issue(stranger, subject="k", issuer=ISSUER, now=NOW).token
    with pytest.raises(UnknownKid):
        check(ring, token)


def test_kid_pointing_at_a_trusted_key_does_not_pass_a_foreign_signature(ring: KeyRing) -> None:
    stranger = SigningKey.generate()
    payload = issue(ring, subject="k", issuer=ISSUER, now=NOW).claims.to_payload()
    token = jwt.encode(
        payload, stranger.private_key, algorithm="EdDSA", headers={"kid": ring.signing_key.kid}
    )
    with pytest.raises(BadSignature):
        check(ring, token)


def test_tampered_payload_is_refused(ring: KeyRing) -> None:
    issued = issue(ring, subject="k", issuer=ISSUER, now=NOW, max_tokens=10)
    header, _payload, signature = issued.token.split(".")
    forged = {**issued.claims.to_payload(), "mtk": 1_000_000, "sub": "admin"}
    with pytest.raises(BadSignature):
        check(ring, f"{header}.{b64json(forged)}.{signature}")


@pytest.mark.parametrize("cut", [1, 10, 40, 87])
def test_truncated_token_is_refused(ring: KeyRing, cut: int) -> None:
    token = issue(ring, subject="k", issuer=ISSUER, now=NOW).token
    with pytest.raises(TokenError):
        check(ring, token[:-cut])


@pytest.mark.parametrize(
    "token",
    [
        "",
        "abc",
        "a.b",
        "a.b.c.d",
        "....",
        "eyJ.eyJ.sig",
        "x" * (MAX_TOKEN_CHARS + 1),
        b64(b"[" * 5000) + ".e30.sig",  # nesting bomb in the header
        b64(b"\xff\xfe") + ".e30.sig",  # header not UTF-8
        "é.é.é",
    ],
)
def test_garbage_is_malformed(ring: KeyRing, token: str) -> None:
    with pytest.raises(MalformedToken):
        check(ring, token)


def test_missing_or_mistyped_claims_are_malformed(ring: KeyRing) -> None:
    base = issue(ring, subject="k", issuer=ISSUER, now=NOW).claims.to_payload()
    key = ring.signing_key
    for change in (
        {"sub": None},
        {"exp": "soon"},
        {"iat": True},
        {"mdl": "m"},
        {"mtk": 0},
        {"tnt": ""},
    ):
        payload = {name: value for name, value in {**base, **change}.items() if value is not None}
        token = jwt.encode(payload, key.private_key, algorithm="EdDSA", headers={"kid": key.kid})
        with pytest.raises(MalformedToken):
            check(ring, token)


def test_an_empty_model_list_is_refused_not_read_as_every_model(ring: KeyRing) -> None:
    # `spotgate.admission.model_allowed` reads no models as every model: a token must not
    # say "no models" and be taken to allow them all.
    with pytest.raises(ValueError, match="models"):
        issue(ring, subject="k", issuer=ISSUER, now=NOW, models=[])
    payload = {**issue(ring, subject="k", issuer=ISSUER, now=NOW).claims.to_payload(), "mdl": []}
    key = ring.signing_key
    token = jwt.encode(payload, key.private_key, algorithm="EdDSA", headers={"kid": key.kid})
    with pytest.raises(MalformedToken, match="mdl"):
        check(ring, token)


def test_a_token_grants_its_models_max_tokens_and_expiry(ring: KeyRing) -> None:
    limited = issue(ring, subject="k", issuer=ISSUER, now=NOW, models=["m"], max_tokens=64)
    assert limited.claims.grant == Grant(frozenset({"m"}), 64, float(limited.expires_at))
    unlimited = issue(ring, subject="k", issuer=ISSUER, now=NOW)
    assert unlimited.claims.grant == Grant(frozenset(), None, float(unlimited.expires_at))


def test_overlong_lifetime_signed_by_us_is_refused(ring: KeyRing) -> None:
    payload = issue(ring, subject="k", issuer=ISSUER, now=NOW).claims.to_payload()
    payload["exp"] = int(NOW) + 24 * 3600
    key = ring.signing_key
    token = jwt.encode(payload, key.private_key, algorithm="EdDSA", headers={"kid": key.kid})
    with pytest.raises(MalformedToken, match="lifetime"):
        check(ring, token)


def test_rotation_keeps_old_tokens_valid_until_the_old_key_is_removed(ring: KeyRing) -> None:
    old_key = ring.signing_key
    old_token = issue(ring, subject="k", issuer=ISSUER, now=NOW).token

    ring.rotate(SigningKey.generate())
    new_token = issue(ring, subject="k", issuer=ISSUER, now=NOW).token

    assert ring.signing_key.kid != old_key.kid
    assert jwt.get_unverified_header(new_token)["kid"] == ring.signing_key.kid
    assert check(ring, old_token).sub == "k"
    assert check(ring, new_token).sub == "k"

    ring.remove(old_key.kid)

    with pytest.raises(UnknownKid):
        check(ring, old_token)
    assert check(ring, new_token).sub == "k"


def test_jwks_round_trip_gives_a_verify_only_ring(ring: KeyRing) -> None:
    ring.rotate(SigningKey.generate())
    token = issue(ring, subject="k", issuer=ISSUER, now=NOW).token

    public = KeyRing.from_jwks(json.loads(json.dumps(ring.jwks())))

    assert sorted(public.kids()) == sorted(ring.kids())
    assert check(public, token).sub == "k"
    assert all("d" not in jwk for jwk in ring.jwks()["keys"])  # no private part published
    with pytest.raises(LookupError):
        _ = public.signing_key


def test_merge_trusts_keys_of_a_refreshed_jwks(ring: KeyRing) -> None:
    verifier = KeyRing()
    token = issue(ring, subject="k", issuer=ISSUER, now=NOW).token
    with pytest.raises(UnknownKid):
        check(verifier, token)

    verifier.merge(KeyRing.from_jwks(ring.jwks()))

    assert check(verifier, token).sub == "k"


def test_kid_is_the_rfc7638_thumbprint() -> None:
    # RFC 8037 appendix A.3: the Ed25519 example key's thumbprint.
    x = "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"
    assert jwk_thumbprint(x) == "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k"
    assert VerifyKey.from_jwk({"kty": "OKP", "crv": "Ed25519", "x": x}).kid == jwk_thumbprint(x)


@pytest.mark.parametrize(
    "jwk",
    [
        {"kty": "RSA", "n": "x", "e": "AQAB"},
        {"kty": "OKP", "crv": "X25519", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"},
        {"kty": "OKP", "crv": "Ed25519", "x": "c2hvcnQ"},
        {"kty": "OKP", "crv": "Ed25519"},
        # kid injection: a kid that is not the key's thumbprint
        {
            "kty": "OKP",
            "crv": "Ed25519",
            "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo",
            "kid": "../../etc/passwd",
        },
    ],
)
def test_bad_jwks_entries_are_refused(jwk: dict[str, str]) -> None:
    with pytest.raises(KeyFormatError):
        VerifyKey.from_jwk(jwk)


def test_pem_with_several_keys_signs_with_the_last() -> None:
    first, second = SigningKey.generate(), SigningKey.generate()

    loaded = load_signing_keys_pem(first.to_pem() + "\n" + second.to_pem())

    assert [key.kid for key in loaded] == [first.kid, second.kid]
    assert KeyRing(loaded).signing_key.kid == second.kid


def test_pinned_public_pem_verifies(ring: KeyRing) -> None:
    token = issue(ring, subject="k", issuer=ISSUER, now=NOW).token
    pinned = KeyRing(verify_keys=[VerifyKey.from_pem(ring.signing_key.verify_key.to_pem())])
    assert check(pinned, token).sub == "k"


def test_non_ed25519_pem_is_refused() -> None:
    rsa_pem = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    with pytest.raises(KeyFormatError, match="not an Ed25519"):
        load_signing_keys_pem(rsa_pem)
    with pytest.raises(KeyFormatError, match="no PEM"):
        load_signing_keys_pem("not a key")


def test_signing_keys_come_from_a_file_or_pem_text(tmp_path) -> None:
    first, second = SigningKey.generate(), SigningKey.generate()
    pem = first.to_pem() + second.to_pem()
    key_file = tmp_path / "keys.pem"
    key_file.write_text(pem)

    from_file = signing_keys_from_settings(TokenSettings(signing_key_file=key_file))
    from_text = signing_keys_from_settings(TokenSettings(signing_key_pem=SecretStr(pem)))

    assert [key.kid for key in from_file or []] == [first.kid, second.kid]
    assert [key.kid for key in from_text or []] == [first.kid, second.kid]
    assert signing_keys_from_settings(TokenSettings()) is None
    with pytest.raises(KeyFormatError, match="cannot read"):
        signing_keys_from_settings(TokenSettings(signing_key_file=tmp_path / "missing.pem"))
