"""Hypothesis strategies of hostile input: websocket frames, HTTP bodies, header text."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

from loadtest.hostile.client import MODEL
from loadtest.hostile.limits import MAX_FRAME_BYTES

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=12,
)
FRAME_FIELDS = (
    "id",
    "model",
    "messages",
    "prompt",
    "max_tokens",
    "temperature",
    "top_p",
    "stop",
    "seed",
    "session",
    "want_ids",
    "resume",
    "token",
)
FRAME_LIKE = st.fixed_dictionaries(
    {"type": st.sampled_from(["generate", "cancel", "auth", "ping", "delta", "done", "x"])},
    optional={
        name: JSON_VALUES | st.sampled_from([MODEL, "s1", 1, -1, 10**30, "\ud800", [], {}])
        for name in FRAME_FIELDS
    },
)


def _invalid_utf8(data: bytes) -> bytes:
    return b"\xff\xfe" + data + b"\xc3"


WS_PAYLOADS: st.SearchStrategy[tuple[str | bytes, bool]] = st.one_of(
    FRAME_LIKE.map(lambda frame: (json.dumps(frame), True)),
    JSON_VALUES.map(lambda value: (json.dumps(value), True)),
    st.text(max_size=200).map(lambda text: (text, True)),
    st.integers(MAX_FRAME_BYTES - 200, MAX_FRAME_BYTES + 4096).map(
        lambda n: (
            json.dumps({"type": "generate", "id": "h", "model": MODEL, "prompt": "x" * n}),
            True,
        )
    ),
    st.integers(10, 30_000).map(lambda depth: ("[" * depth + "]" * depth, True)),
    st.binary(max_size=200).map(lambda data: (_invalid_utf8(data), True)),
    st.binary(max_size=200).map(lambda data: (data, False)),
)


MESSAGE_LIKE = st.fixed_dictionaries(
    {},
    optional={
        "role": st.sampled_from(["user", "system", "assistant", "tool", "root"]) | JSON_VALUES,
        "content": st.text(max_size=100) | JSON_VALUES,
    },
)
REQUEST_LIKE = st.fixed_dictionaries(
    {},
    optional={
        "model": st.sampled_from([MODEL, "unknown"]) | JSON_VALUES,
        "messages": st.lists(MESSAGE_LIKE, max_size=3) | JSON_VALUES,
        "prompt": st.text(max_size=100) | JSON_VALUES,
        "max_tokens": st.integers(-5, 10**7) | JSON_VALUES,
        "stream": st.booleans() | JSON_VALUES,
        "temperature": st.floats() | JSON_VALUES,
        "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}) | JSON_VALUES,
        "stop": JSON_VALUES,
        "n": JSON_VALUES,
    },
)
HTTP_BODIES: st.SearchStrategy[bytes] = st.one_of(
    REQUEST_LIKE.map(lambda body: json.dumps(body).encode()),
    JSON_VALUES.map(lambda value: json.dumps(value).encode()),
    st.binary(max_size=500),
    st.text(max_size=500).map(str.encode),
    st.integers(10, 100_000).map(lambda depth: b"[" * depth + b"]" * depth),
    st.sampled_from([1_000_000, 4 * 1024 * 1024 + 1]).map(
        lambda n: b'{"model":"' + b"x" * n + b'"}'
    ),
)
LATIN1_TEXT = st.text(
    alphabet=st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"),
    max_size=300,
)
HEADER_NAMES = st.text(alphabet="abcdefghijklmnopqrstuvwxyzXY-", min_size=1, max_size=20)


def hypothesis_settings(examples: int) -> settings:
    """Generation only (no shrinking: a failure is reported as found), no example database."""
    return settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
