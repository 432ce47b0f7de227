"""The services' limits the battery expects them to enforce, and how they refuse."""

from __future__ import annotations

MAX_FRAME_BYTES = 64 * 1024
AIOHTTP_MAX_FIELD_BYTES = 8190  # aiohttp's parser refuses longer header lines with a plain 400
AIOHTTP_MAX_HEADERS = 128
# Headers aiohttp's parser refuses to see twice in a request (a plain 400, before spotgate).
AIOHTTP_SINGLETON_HEADERS = frozenset(
    {
        "content-length",
        "content-location",
        "content-range",
        "content-type",
        "etag",
        "host",
        "max-forwards",
        "server",
        "transfer-encoding",
        "user-agent",
    }
)
FAILED_AUTH_PER_CLIENT = 20  # the gateway's defaults, which the battery checks
FAILED_AUTH_PER_KEY = 60
DOCUMENTED_CLOSE_CODES = {1007: "invalid UTF-8", 1009: "frame too big"}
