"""Ids and keys a stream needs, made without a system call each.

`os.urandom` is a system call, and a stream drew three random values (its agent stream's id,
its concurrency lease, its handle key). Each is made here from 32 random bytes drawn once per
process (a forked child draws its own) and a count.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import secrets

_SECRET_BYTES = 32


class _Source:
    """A process's random secret and its count of what was made from it."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.secret = secrets.token_bytes(_SECRET_BYTES)
        self.prefix = secrets.token_hex(8)  # ids of other processes start otherwise
        self.count = itertools.count()


_source = _Source()


def _current() -> _Source:
    """The calling process's source; a forked child draws its own at its first use.

    Not in an at-fork hook: that would run Python between a fork and its exec (subprocess's
    `preexec_fn`), where only system calls are safe.
    """
    global _source
    if _source.pid != os.getpid():
        _source = _Source()
    return _source


def unique_id() -> str:
    """An id no other call, nor any other process (but with 2^-64 odds), makes."""
    source = _current()
    return f"{source.prefix}{next(source.count):x}"


def secret_key(size: int) -> bytes:
    """`size` (≤ 64) bytes no one without the process's secret can tell from random ones.

    A keyed BLAKE2b of a count: a pseudorandom function's outputs, each used once.
    """
    source = _current()
    count = next(source.count).to_bytes(8, "big")
    return hashlib.blake2b(count, key=source.secret, digest_size=size).digest()
