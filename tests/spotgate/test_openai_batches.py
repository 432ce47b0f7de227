from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from spotgate.openai_batches import (
    FILE_ERRORS_SHOWN,
    BatchCreateRequest,
    CheckedFile,
    Progress,
    Status,
    Usage,
    batch_as_shown,
    check_input_file,
    new_batch,
    next_status,
    output_line,
    request_line_id,
    unrun_line,
)
from spotgate.settings.shared import MAX_REQUEST_BYTES

CHAT = "/v1/chat/completions"


def line(custom_id: str = "a", url: str = CHAT, model: object = "m", **fields: Any) -> str:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    request = {"custom_id": custom_id, "method": "POST", "url": url, "body": body, **fields}
    return json.dumps(request)


def problems(content: str, max_requests: int = 10) -> list[tuple[str, int | None]]:
    checked = check_input_file(content.encode(), CHAT, max_requests)
    if isinstance(checked, CheckedFile):
        return []
    return [(problem.code, problem.line) for problem in checked]


def test_a_good_file_gives_its_requests_in_order_and_their_one_model() -> None:
    content = "\n".join([line("a"), "", "   ", line("b"), line("c")]) + "\n"

    checked = check_input_file(content.encode(), CHAT, 10)

    assert isinstance(checked, CheckedFile)
    assert [request.custom_id for request in checked.lines] == ["a", "b", "c"]
    assert checked.model == "m"


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("{not json", [("invalid_json_line", 1)]),
        ("[" * 100_000 + "]" * 100_000, [("invalid_json_line", 1)]),  # not a stuck batch
        (line() + "\n" + line("big", "x" * MAX_REQUEST_BYTES), [("line_too_long", 2)]),
        (
            line("a\u2028b").replace("\\u2028", "\u2028") + "\r\n" + line("c"),
            [],
        ),  # a line ends at \n only
        (line() + "\n" + line(), [("duplicate_custom_id", 2)]),
        (line(url="/v1/completions"), [("mismatched_endpoint", 1)]),
        (line(method="GET"), [("invalid_request", 1)]),
        (line(model=None), [("invalid_request", 1)]),
        (line(model=""), [("invalid_request", 1)]),
        (json.dumps({"custom_id": "a", "method": "POST", "url": CHAT}), [("invalid_request", 1)]),
        (line(custom_id=""), [("invalid_request", 1)]),
        (line("a", extra=1), [("invalid_request", 1)]),
        (json.dumps([1, 2]), [("invalid_request", 1)]),
        ("", [("empty_file", None)]),
        ("\n\n", [("empty_file", None)]),
        (line("a") + "\n" + line("b", model="other"), [("mismatched_model", None)]),
        ("\n".join(line(str(n)) for n in range(11)), [("too_many_requests", None)]),
        (
            "{bad\n" + line("a") + "\n" + line("a"),
            [("invalid_json_line", 1), ("duplicate_custom_id", 3)],
        ),
    ],
)
def test_what_is_wrong_with_a_file_is_named_by_line(
    content: str, expected: list[tuple[str, int | None]]
) -> None:
    assert problems(content) == expected


def test_a_file_that_is_not_text_and_one_with_many_problems_say_so_briefly() -> None:
    assert [p.code for p in check_input_file(b"\xff\xfe", CHAT, 10)] == ["invalid_file"]  # type: ignore[union-attr]
    many = "\n".join("{bad" for _ in range(FILE_ERRORS_SHOWN * 2))
    assert len(problems(many, 10_000)) == FILE_ERRORS_SHOWN


DONE_ALL = Progress(total=3, completed=2, failed=1)
HALF = Progress(total=3, completed=1)


@pytest.mark.parametrize(
    ("status", "progress", "cancel", "expired", "expected"),
    [
        ("in_progress", HALF, False, False, "in_progress"),
        ("in_progress", DONE_ALL, False, False, "finalizing"),
        ("in_progress", HALF, True, False, "cancelling"),
        ("in_progress", DONE_ALL, True, False, "cancelling"),  # asked first: cancelled wins
        ("in_progress", HALF, False, True, "expired"),
        ("cancelling", HALF, True, False, "cancelled"),
        ("finalizing", DONE_ALL, True, True, "completed"),
        ("validating", HALF, True, False, "validating"),
        ("completed", DONE_ALL, True, True, "completed"),
        ("failed", HALF, True, False, "failed"),
    ],
)
def test_the_next_status_of_a_batch(
    status: Status, progress: Progress, cancel: bool, expired: bool, expected: Status
) -> None:
    assert (
        next_status(status, progress=progress, cancel_requested=cancel, expired=expired) == expected
    )


def request(**fields: Any) -> dict[str, Any]:
    return {"input_file_id": "file-1", "endpoint": CHAT, "completion_window": "24h", **fields}


@pytest.mark.parametrize(
    "fields",
    [
        {"completion_window": "1h"},
        {"endpoint": "/v1/embeddings"},
        {"input_file_id": ""},
        {"metadata": {f"k{n}": "v" for n in range(17)}},
        {"metadata": {"k" * 65: "v"}},
        {"metadata": {"k": "v" * 513}},
        {"output_expires_after": {"anchor": "created_at", "seconds": 60}},
        {"surprise": True},
    ],
)
def test_a_batch_request_outside_openais_limits_is_refused(fields: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        BatchCreateRequest.model_validate(request(**fields))


def test_a_new_batch_expires_a_day_after_it_was_made_and_shows_cancelling_once_asked() -> None:
    body = new_batch("batch_1", BatchCreateRequest.model_validate(request()), 1_000, 3600)

    assert body["status"] == "validating"
    assert body["expires_at"] == 1_000 + 24 * 3600
    assert "output_expires_after" not in batch_as_shown(body, None)
    shown = batch_as_shown({**body, "status": "in_progress"}, 1_500)
    assert (shown["status"], shown["cancelling_at"]) == ("cancelling", 1_500)
    assert batch_as_shown({**body, "status": "completed"}, 1_500)["status"] == "completed"


def test_a_request_run_again_gets_the_same_line_id() -> None:
    first = output_line("batch_1", 3, "c", 200, {"ok": 1})
    again = output_line("batch_1", 3, "c", 200, {"ok": 2})

    assert first["id"] == again["id"] == request_line_id("batch_1", 3)
    assert first["id"] != request_line_id("batch_1", 4)
    assert first["response"]["request_id"] == first["id"]
    unrun = unrun_line("batch_1", 5, "e", "expired")
    assert (unrun["response"], unrun["error"]["code"]) == (None, "batch_expired")


def test_usage_adds_chat_and_responses_bodies() -> None:
    usage = Usage()
    usage.add({"usage": {"prompt_tokens": 3, "completion_tokens": 5}})
    usage.add(
        {
            "usage": {
                "input_tokens": 2,
                "output_tokens": 4,
                "output_tokens_details": {"reasoning_tokens": 1},
            }
        }
    )
    usage.add({"error": {"message": "no"}})

    assert usage.body()["total_tokens"] == 14
    assert usage.body()["output_tokens_details"] == {"reasoning_tokens": 1}
