"""How the long-lived services (`spotgate gateway`, `spotgate agent`) run as processes."""

from __future__ import annotations

import asyncio
import gc
import socket
from collections.abc import Coroutine
from typing import Any

from spotgate.logging import get_logger

log = get_logger(__name__)


def free_port() -> int:
    """A free loopback TCP port (for local stacks, tests and benchmarks)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_service(main: Coroutine[Any, Any, None]) -> None:
    """Run a service's main coroutine on uvloop where it is installed, asyncio's loop otherwise."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
    else:
        uvloop.run(main)


def freeze_long_lived_objects() -> None:
    """Move everything alive now out of the garbage collector's reach; call once started.

    A service's start leaves ~100k long-lived objects (botocore's service models, pydantic
    schemas, vLLM's modules); every full collection walked them all, a pause of ~50 ms on
    the event loop that landed on whichever streams were starting. Frozen, they are never
    scanned again, and collections only see what serving allocates.
    """
    gc.freeze()
    log.info("startup objects frozen", frozen=gc.get_freeze_count())
