"""LiteLLM's SDK as a client: run by LiteLLM's own virtualenv (`make` builds it), not by ours.

LiteLLM pins versions our services cannot share (botocore), so the tests start this file with
that environment's Python: a list of `litellm.acompletion` requests as JSON on stdin, sent at
once, and their replies in the same order (each a list of chunks when streamed) as JSON on
stdout. One process for them all: importing LiteLLM takes seconds of CPU.
"""

import asyncio
import json
import sys
from typing import Any

import litellm  # type: ignore[import-not-found]


async def reply(request: dict[str, Any]) -> Any:
    """LiteLLM's reply to one request, as JSON data."""
    if request.get("stream"):
        return [chunk.model_dump() async for chunk in await litellm.acompletion(**request)]
    return (await litellm.acompletion(**request)).model_dump()


async def main() -> None:
    """Send the requests read from stdin together; print their replies."""
    requests: list[dict[str, Any]] = json.load(sys.stdin)
    json.dump(await asyncio.gather(*(reply(request) for request in requests)), sys.stdout)


if __name__ == "__main__":
    asyncio.run(main())
