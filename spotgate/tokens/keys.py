"""Ed25519 keys for tokens: signing and verify keys, PEM and JWK forms, the rotating key ring.

The newest signing key of a ring signs; every key a ring holds verifies, so keys rotate
without refusing a token in flight. A key's `kid` is its RFC 7638 thumbprint.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from spotgate.settings import TokenSettings

ALGORITHM = "EdDSA"

_ED25519_KEY_BYTES = 32


class KeyFormatError(ValueError):
    """A PEM, JWK or JWKS document does not hold a usable Ed25519 key."""


def b64url(data: bytes) -> str:
    """`data` as unpadded base64url, as JOSE writes it."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_decode(text: str) -> bytes:
    """Bytes of unpadded base64url text."""
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def jwk_thumbprint(x: str) -> str:
    """RFC 7638 thumbprint of an Ed25519 public JWK (`x` is its base64url public key)."""
    canonical = json.dumps(
        {"crv": "Ed25519", "kty": "OKP", "x": x}, separators=(",", ":"), sort_keys=True
    )
    return b64url(hashlib.sha256(canonical.encode("ascii")).digest())


@dataclass(frozen=True, slots=True)
class VerifyKey:
    """An Ed25519 public key and its RFC 7638 `kid`."""

    kid: str
    public_key: Ed25519PublicKey

    @classmethod
    def from_public_key(cls, public_key: Ed25519PublicKey) -> VerifyKey:
        """Wrap a public key, computing its `kid`."""
        raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        return cls(kid=jwk_thumbprint(b64url(raw)), public_key=public_key)

    @classmethod
    def from_jwk(cls, jwk: Mapping[str, Any]) -> VerifyKey:
        """Read an OKP/Ed25519 JWK; a `kid` that is not the key's own thumbprint is refused."""
        if jwk.get("kty") != "OKP" or jwk.get("crv") != "Ed25519":
            raise KeyFormatError("JWK is not an Ed25519 (OKP) key")
        x = jwk.get("x")
        if not isinstance(x, str):
            raise KeyFormatError("JWK has no 'x' member")
        try:
            raw = b64url_decode(x)
        except (binascii.Error, ValueError) as err:
            raise KeyFormatError("JWK 'x' is not base64url") from err
        if len(raw) != _ED25519_KEY_BYTES:
            raise KeyFormatError(f"JWK 'x' must be {_ED25519_KEY_BYTES} bytes, got {len(raw)}")
        key = cls.from_public_key(Ed25519PublicKey.from_public_bytes(raw))
        if "kid" in jwk and jwk["kid"] != key.kid:
            raise KeyFormatError("JWK 'kid' is not the key's RFC 7638 thumbprint")
        return key

    @classmethod
    def from_pem(cls, pem: str | bytes) -> VerifyKey:
        """Read a PEM `PUBLIC KEY` (SubjectPublicKeyInfo) holding an Ed25519 key."""
        data = pem.encode() if isinstance(pem, str) else pem
        try:
            public_key = serialization.load_pem_public_key(data)
        except (ValueError, UnsupportedAlgorithm) as err:
            raise KeyFormatError("not a PEM public key") from err
        if not isinstance(public_key, Ed25519PublicKey):
            raise KeyFormatError("PEM public key is not Ed25519")
        return cls.from_public_key(public_key)

    def to_jwk(self) -> dict[str, str]:
        """The public JWK as published in the JWKS."""
        raw = self.public_key.public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        return {
            "kty": "OKP",
            "crv": "Ed25519",
            "x": b64url(raw),
            "kid": self.kid,
            "alg": ALGORITHM,
            "use": "sig",
        }

    def to_pem(self) -> str:
        """The public key as PEM, for pinning in agent settings."""
        return self.public_key.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ).decode("ascii")


@dataclass(frozen=True, slots=True)
class SigningKey:
    """An Ed25519 private key with its public half."""

    private_key: Ed25519PrivateKey
    verify_key: VerifyKey

    @property
    def kid(self) -> str:
        """The RFC 7638 thumbprint of the public key."""
        return self.verify_key.kid

    @classmethod
    def generate(cls) -> SigningKey:
        """A fresh random key."""
        return cls.from_private_key(Ed25519PrivateKey.generate())

    @classmethod
    def from_private_key(cls, private_key: Ed25519PrivateKey) -> SigningKey:
        """Wrap a private key."""
        return cls(private_key, VerifyKey.from_public_key(private_key.public_key()))

    def to_pem(self) -> str:
        """PKCS#8 PEM, unencrypted: store it only where secrets belong."""
        return self.private_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ).decode("ascii")


_PEM_BLOCK_END = "-----END PRIVATE KEY-----"


def load_signing_keys_pem(text: str | bytes) -> list[SigningKey]:
    """Read one or more PEM private keys, oldest first: the last one signs (rotation)."""
    data = text.decode() if isinstance(text, bytes) else text
    blocks = [block + _PEM_BLOCK_END for block in data.split(_PEM_BLOCK_END)[:-1]]
    if not blocks:
        raise KeyFormatError("no PEM private key found")
    keys = []
    for index, block in enumerate(blocks):
        try:
            private_key = serialization.load_pem_private_key(block.strip().encode(), None)
        except (ValueError, TypeError, UnsupportedAlgorithm) as err:
            raise KeyFormatError(f"PEM block {index + 1} is not an unencrypted key") from err
        if not isinstance(private_key, Ed25519PrivateKey):
            raise KeyFormatError(f"PEM block {index + 1} is not an Ed25519 key")
        keys.append(SigningKey.from_private_key(private_key))
    return keys


def signing_keys_from_settings(token: TokenSettings) -> list[SigningKey] | None:
    """The signing keys a PEM file or PEM text setting names; None when neither is set.

    Secrets Manager (`signing_key_secret_id`) needs an AWS call and is read by the gateway.
    """
    if token.signing_key_file is not None:
        try:
            text = token.signing_key_file.read_text()
        except OSError as err:
            raise KeyFormatError(f"cannot read {token.signing_key_file}: {err.strerror}") from err
        return load_signing_keys_pem(text)
    if token.signing_key_pem is not None:
        return load_signing_keys_pem(token.signing_key_pem.get_secret_value())
    return None


class KeyRing:
    """Keys that verify tokens, the newest signing one signs; several coexist during rotation."""

    def __init__(
        self, signing_keys: Sequence[SigningKey] = (), verify_keys: Iterable[VerifyKey] = ()
    ) -> None:
        self._signing: list[SigningKey] = list(signing_keys)
        self._verify: dict[str, VerifyKey] = {key.kid: key for key in verify_keys}
        for key in self._signing:
            self._verify[key.kid] = key.verify_key

    @classmethod
    def from_jwks(cls, document: Mapping[str, Any]) -> KeyRing:
        """A verify-only ring from a JWKS document; keys of other types are skipped."""
        entries = document.get("keys")
        if not isinstance(entries, list):
            raise KeyFormatError("JWKS has no 'keys' list")
        keys = [
            VerifyKey.from_jwk(entry)
            for entry in entries
            if isinstance(entry, Mapping) and entry.get("kty") == "OKP"
        ]
        return cls(verify_keys=keys)

    @property
    def signing_key(self) -> SigningKey:
        """The key new tokens are signed with (the newest)."""
        if not self._signing:
            raise LookupError("this key ring holds no private key")
        return self._signing[-1]

    def private_key(self, kid: str) -> SigningKey | None:
        """The private key named `kid`, if the ring holds it."""
        return next((key for key in self._signing if key.kid == kid), None)

    def rotate(self, key: SigningKey) -> None:
        """Make `key` the signing key; older keys still verify until removed."""
        self._signing.append(key)
        self._verify[key.kid] = key.verify_key

    def remove(self, kid: str) -> None:
        """Stop trusting `kid`: tokens it signed fail with `UnknownKid` from now on."""
        self._verify.pop(kid, None)
        self._signing = [key for key in self._signing if key.kid != kid]

    def merge(self, other: KeyRing) -> None:
        """Trust every verify key of `other` too (a refreshed JWKS)."""
        self._verify.update(other._verify)

    def get(self, kid: str) -> VerifyKey | None:
        """The verify key named `kid`, if trusted."""
        return self._verify.get(kid)

    def kids(self) -> list[str]:
        """Every trusted `kid`."""
        return list(self._verify)

    def jwks(self) -> dict[str, list[dict[str, str]]]:
        """The JWKS document (`/.well-known/jwks.json`)."""
        return {"keys": [key.to_jwk() for key in self._verify.values()]}
