"""Hypothesis HTTP bodies and headers: no 5xx, every 4xx OpenAI's JSON error."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from loadtest.hostile.client import chat_body, fresh_address, http_call
from loadtest.hostile.limits import (
    AIOHTTP_MAX_FIELD_BYTES,
    AIOHTTP_MAX_HEADERS,
    AIOHTTP_SINGLETON_HEADERS,
)
from loadtest.hostile.report import Row
from loadtest.hostile.strategies import HEADER_NAMES, HTTP_BODIES, LATIN1_TEXT, hypothesis_settings


def fuzz_bodies(target: str, url: str, paths: list[str], credential: str, examples: int) -> Row:
    """Hypothesis bodies, authenticated, to each path: no 5xx, every 4xx a JSON error."""
    row = Row(
        target,
        f"HTTP bodies (hypothesis) to {', '.join(paths)}: JSON of wrong shapes, "
        "binary, text, nesting depth, 1 MB and 4 MiB + 1",
    )
    source = fresh_address()
    headers = [("Authorization", f"Bearer {credential}"), ("Content-Type", "application/json")]

    @hypothesis_settings(examples)
    @given(HTTP_BODIES, st.sampled_from(paths))
    def run(body: bytes, path: str) -> None:
        reply = http_call(url, path, headers=headers, body=body, source=source)
        row.record(f"{reply.outcome()}", reply.problem())

    run()
    return row


def fuzz_headers(target: str, url: str, path: str, credential: str, examples: int) -> Row:
    """Hypothesis headers with a valid body: Authorization variants, huge and many headers."""
    row = Row(
        target,
        f"HTTP headers (hypothesis) to {path}: Authorization variants, "
        "Content-Type, values up to 20 KB, up to 200 headers",
    )
    authorizations = st.one_of(
        st.just(f"Bearer {credential}"),
        st.sampled_from(
            [
                "",
                "Bearer",
                "Bearer  ",
                f"bearer {credential}",
                "Basic dXNlcjpwYXNz",
                "Bearer sg-",
                f"Bearer {credential}x",
                "Bearer " + "A" * 9000,
            ]
        ),
        LATIN1_TEXT.map(lambda text: f"Bearer {text}"),
        LATIN1_TEXT,
    )
    content_types = st.sampled_from(["application/json", "text/plain", "", "multipart/form-data"])

    @hypothesis_settings(examples)
    @given(
        authorizations,
        content_types | LATIN1_TEXT,
        st.lists(st.tuples(HEADER_NAMES, LATIN1_TEXT), max_size=200),
        st.integers(0, 20_000),
    )
    def run(authorization: str, content_type: str, extra: list[tuple[str, str]], huge: int) -> None:
        headers = [
            ("Authorization", authorization.strip()),
            ("Content-Type", content_type.strip()),
            ("X-Huge", "v" * huge),
            *((name, value.strip()) for name, value in extra),
        ]
        sent = ["host", *(name.lower() for name, _value in headers), "content-length"]
        repeated = {name for name in AIOHTTP_SINGLETON_HEADERS if sent.count(name) > 1}
        beyond_parser = (
            len(headers) + 3 > AIOHTTP_MAX_HEADERS
            or bool(repeated)
            # A request smuggling guard: both lengths say how long the body is.
            or "transfer-encoding" in sent
            or any(len(name) + len(value) + 2 > AIOHTTP_MAX_FIELD_BYTES for name, value in headers)
        )
        reply = http_call(url, path, headers=headers, body=chat_body(4))
        outcome = reply.outcome()
        if beyond_parser and reply.status == 400 and reply.error is None:
            outcome = (
                "400 from aiohttp's parser (request beyond its limits, a repeated header, "
                "or Transfer-Encoding beside Content-Length)"
            )
        row.record(outcome, reply.problem(parser_limit_exceeded=beyond_parser))

    run()
    return row
