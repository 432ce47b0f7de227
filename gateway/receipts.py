"""Resume receipts: proof that the deployment itself delivered a stream's tokens to a key.

A client that resumes a stream (its gateway went away, or it continues a reply cut at its
token limit) sends back the token ids it holds. Ids the deployment delivered to that key, for
that very prompt, were charged when they were generated and are not charged again; anything
else a client puts in a `resume` is text it wrote, and is charged as prompt.

The proof is stateless, so any replica checks it, after a restart too: every delta a
`want_ids` client receives carries a receipt, an HMAC over the key id, the prompt and every
token id the client holds so far. Its secret is derived (HKDF) from the gateway's token
signing key, which every replica shares and rotation replaces; a receipt names the key it was
made with (its `kid`), and verifies while that key is in the ring.

What a receipt does not stop: the same key resuming the same prompt's delivered tokens again.
Each such request pays its prompt and every new token, and its resumed tokens hit its own
prefix cache, so it costs the engine little more than any other request of that key.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Iterable
from typing import TYPE_CHECKING

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from spotgate.protocol import GenerateFrame
from spotgate.tokens import KeyRing, SigningKey

if TYPE_CHECKING:
    from hashlib import _Hash

RECEIPT_VERSION = "r1"
RECEIPT_KDF_INFO = b"spotgate resume receipt r1"
TOKEN_ID_BYTES = 4  # every token id fits (MAX_TOKEN_ID is 2**31 - 1)


def prompt_digest(frame: GenerateFrame) -> bytes:
    """SHA-256 of what the model reads before its reply: the model, messages or prompt, tools."""
    shown = frame.model_dump(mode="json", include={"model", "messages", "prompt", "tools"})
    canonical = json.dumps(shown, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).digest()


def _receipt_secret(key: SigningKey) -> bytes:
    raw = key.private_key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=RECEIPT_KDF_INFO).derive(raw)


def _ids_bytes(ids: Iterable[int]) -> bytes:
    return b"".join(token_id.to_bytes(TOKEN_ID_BYTES, "big") for token_id in ids)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


class ReceiptChain:
    """The receipts of one stream's deltas: each covers every token id the client holds."""

    def __init__(self, secret: bytes, kid: str, key_id: str, prompt: bytes) -> None:
        self._secret = secret
        self._kid = kid
        self._ids: _Hash = hashlib.sha256()
        self._bound = _bound_fields(key_id, prompt)

    def extend(self, ids: Iterable[int]) -> None:
        """The client now holds these ids too, after the ones before."""
        self._ids.update(_ids_bytes(ids))

    def receipt(self) -> str:
        """The receipt for every id the client holds so far."""
        mac = hmac.new(self._secret, self._bound + self._ids.copy().digest(), hashlib.sha256)
        return f"{RECEIPT_VERSION}.{self._kid}.{_b64(mac.digest())}"


def _bound_fields(key_id: str, prompt: bytes) -> bytes:
    key = key_id.encode()
    return RECEIPT_VERSION.encode() + len(key).to_bytes(2, "big") + key + prompt


class ReceiptSigner:
    """Makes and checks resume receipts with secrets derived from the ring's signing keys."""

    def __init__(self, ring: KeyRing) -> None:
        self._ring = ring
        self._secrets: dict[str, bytes] = {}

    def _secret(self, kid: str) -> bytes | None:
        key = self._ring.private_key(kid)
        if key is None:
            return None
        secret = self._secrets.get(kid)
        if secret is None:
            secret = self._secrets[kid] = _receipt_secret(key)
        return secret

    def chain(self, key_id: str, frame: GenerateFrame) -> ReceiptChain:
        """A new chain for a stream of `key_id` (with the newest key), over `frame`'s prompt."""
        key = self._ring.signing_key
        secret = self._secrets.get(key.kid) or _receipt_secret(key)
        self._secrets[key.kid] = secret
        return ReceiptChain(secret, key.kid, key_id, prompt_digest(frame))

    def delivered(self, key_id: str, frame: GenerateFrame) -> bool:
        """Whether `frame.resume` holds exactly what this deployment delivered to `key_id`."""
        resume = frame.resume
        if resume is None or resume.receipt is None:
            return False
        version, _, rest = resume.receipt.partition(".")
        kid, _, mac = rest.partition(".")
        secret = self._secret(kid) if version == RECEIPT_VERSION and mac else None
        if secret is None:
            return False
        expected = ReceiptChain(secret, kid, key_id, prompt_digest(frame))
        expected.extend(resume.token_ids)
        return hmac.compare_digest(expected.receipt(), resume.receipt)
