"""LiteLLM's SDK as a client: run by LiteLLM's own virtualenv (`make` builds it), not by ours.

LiteLLM pins versions our services cannot share (botocore), so the tests start this file with
that environment's Python: one `litellm.acompletion` request as JSON on stdin, its reply (a
list of chunks when streamed) as JSON on stdout.
"""

import asyncio
import json
import sys
from typing import Any

import litellm  # type: ignore[import-not-found]


async def main() -> None:
    """Send the request read from stdin; print the reply."""
    request: dict[str, Any] = json.load(sys.stdin)
    if request.get("stream"):
        reply = [chunk.model_dump() async for chunk in await litellm.acompletion(**request)]
    else:
        reply = (await litellm.acompletion(**request)).model_dump()
    json.dump(reply, sys.stdout)


if __name__ == "__main__":
    asyncio.run(main())
