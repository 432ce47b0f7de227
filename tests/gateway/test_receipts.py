"""Resume receipts: what they prove, to any replica sharing the signing key, and nothing else."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.receipts import ReceiptSigner
from spotgate.protocol import GenerateFrame, Resume
from spotgate.tokens import KeyRing, SigningKey

KEY = SigningKey.generate()
HELD = [5, 7, 11, 13]


def request(content: str = "tell me", **extra: Any) -> GenerateFrame:
    fields: dict[str, Any] = {"messages": [{"role": "user", "content": content}], **extra}
    return GenerateFrame(id="s", model="m", **fields)


def delivered_receipt(signer: ReceiptSigner, key_id: str, frame: GenerateFrame) -> str:
    """The receipt of the last delta a client got, its ids delivered in two frames."""
    chain = signer.chain(key_id, frame)
    chain.extend(HELD[:2])
    chain.receipt()
    chain.extend(HELD[2:])
    return chain.receipt()


def resumed(frame: GenerateFrame, ids: list[int], receipt: str | None) -> GenerateFrame:
    resume = Resume(token_ids=ids, text="…", completion_tokens=len(ids), receipt=receipt)
    return frame.model_copy(update={"resume": resume})


GOOD = delivered_receipt(ReceiptSigner(KeyRing([KEY])), "key-a", request())


@pytest.mark.parametrize(
    ("key_id", "frame", "ids", "receipt", "delivered"),
    [
        pytest.param("key-a", request(), HELD, GOOD, True, id="delivered"),
        # Sampling settings are not the prompt: a continuation may ask for more tokens.
        pytest.param(
            "key-a",
            request(max_tokens=99, temperature=0.0),
            HELD,
            GOOD,
            True,
            id="sampling-is-not-prompt",
        ),
        pytest.param("key-b", request(), HELD, GOOD, False, id="other-key"),
        pytest.param("key-a", request("tell me more"), HELD, GOOD, False, id="other-prompt"),
        pytest.param(
            "key-a", request(prompt="tell me", messages=None), HELD, GOOD, False, id="raw-prompt"
        ),
        pytest.param("key-a", request(), [*HELD, 17], GOOD, False, id="invented-after"),
        pytest.param("key-a", request(), HELD[:-1], GOOD, False, id="fewer"),
        pytest.param("key-a", request(), list(reversed(HELD)), GOOD, False, id="reordered"),
        pytest.param("key-a", request(), HELD, None, False, id="no-receipt"),
        pytest.param("key-a", request(), HELD, GOOD[:-2] + "AA", False, id="forged-mac"),
        pytest.param("key-a", request(), HELD, "r2" + GOOD[2:], False, id="other-version"),
        pytest.param("key-a", request(), HELD, GOOD.rsplit(".", 1)[0], False, id="no-mac"),
        pytest.param(
            "key-a",
            request(),
            HELD,
            "r1.unknown-kid." + GOOD.rsplit(".", 1)[1],
            False,
            id="unknown-kid",
        ),
    ],
)
def test_a_receipt_proves_exactly_the_ids_delivered_to_its_key_for_its_prompt(
    key_id: str, frame: GenerateFrame, ids: list[int], receipt: str | None, delivered: bool
) -> None:
    signer = ReceiptSigner(KeyRing([KEY]))  # another replica, or the same one restarted
    assert signer.delivered(key_id, resumed(frame, ids, receipt)) is delivered


def test_receipts_hold_through_a_rotation_until_their_key_is_removed() -> None:
    ring = KeyRing([KEY])
    signer = ReceiptSigner(ring)
    frame = resumed(request(), HELD, GOOD)
    ring.rotate(SigningKey.generate())
    assert signer.delivered("key-a", frame)  # the old key still verifies
    fresh = delivered_receipt(signer, "key-a", request())
    assert fresh.split(".")[1] == ring.signing_key.kid  # new receipts name the new key
    ring.remove(KEY.kid)
    assert not ReceiptSigner(ring).delivered("key-a", frame)
    assert ReceiptSigner(ring).delivered("key-a", resumed(request(), HELD, fresh))


def test_a_gateway_with_another_signing_key_proves_nothing() -> None:
    assert not ReceiptSigner(KeyRing([SigningKey.generate()])).delivered(
        "key-a", resumed(request(), HELD, GOOD)
    )
