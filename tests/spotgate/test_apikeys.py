from __future__ import annotations

import pytest

from spotgate.apikeys import (
    MalformedApiKey,
    hash_secret,
    looks_like_api_key,
    new_api_key,
    parse_api_key,
    secret_matches,
)


def test_new_key_parses_back_into_its_halves() -> None:
    text, parsed = new_api_key()
    assert looks_like_api_key(text)
    assert parse_api_key(text) == parsed
    assert len(parsed.key_id) == 12


def test_keys_are_unique() -> None:
    assert len({new_api_key()[0] for _ in range(200)}) == 200


@pytest.mark.parametrize(
    "text",
    [
        "",
        "sg-",
        "sg-abc-def",
        "sk-0123456789ab-" + "s" * 43,
        "sg-0123456789AB-" + "s" * 43,
        "sg-0123456789ab-" + "s" * 300,
        "sg-0123456789ab-short",
        "eyJhbGciOi.x.y",
    ],
)
def test_malformed_keys_are_refused(text: str) -> None:
    with pytest.raises(MalformedApiKey):
        parse_api_key(text)


def test_secret_matches_only_the_right_secret() -> None:
    stored = hash_secret("right")
    assert secret_matches(stored, "right")
    assert not secret_matches(stored, "wrong")
    assert not secret_matches(None, "right")
