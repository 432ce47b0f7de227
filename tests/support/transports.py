"""What a server writes to its connections, kept for a test to read."""

from __future__ import annotations

from aiohttp import web


def keep_writes(request: web.Request, into: list[bytes]) -> None:
    """Keep each write to the request's transport from now on in `into`, as it was written."""
    transport = request.transport
    assert transport is not None
    write = transport.write

    def kept(data: bytes | bytearray | memoryview) -> None:
        into.append(bytes(data))
        write(data)

    transport.write = kept  # type: ignore[method-assign]
