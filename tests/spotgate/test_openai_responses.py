"""A Responses API request maps onto a `generate` frame, or is refused by name."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from spotgate.openai_responses import ResponsesRequest

REASONING = {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Think."}]}


@pytest.mark.parametrize(
    ("body", "roles"),
    [
        ({"input": [REASONING]}, None),
        ({"input": [REASONING, REASONING]}, None),
        ({"input": [REASONING], "instructions": "Be brief."}, ["system"]),
        ({"input": [REASONING, {"role": "user", "content": "hi"}]}, ["user"]),
    ],
    ids=["reasoning alone", "two reasoning items", "with instructions", "with a message"],
)
def test_reasoning_items_alone_are_refused_as_no_conversation(
    body: dict[str, Any], roles: list[str] | None
) -> None:
    """A 400 naming the input, not a frame with no messages the agent would refuse as a 500."""
    if roles is None:
        with pytest.raises(ValidationError, match="reasoning items alone are no conversation"):
            ResponsesRequest.model_validate({"model": "m", **body})
        return
    request = ResponsesRequest.model_validate({"model": "m", **body})
    frame = request.to_generate_frame("s")
    assert [message.role for message in frame.messages or []] == roles
