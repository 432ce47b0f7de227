"""Ids and keys made from a process's secret: none repeats, in this process or a forked one."""

from __future__ import annotations

import os

import pytest

from gateway.unique import secret_key, unique_id


def test_ids_and_keys_never_repeat() -> None:
    ids = {unique_id() for _ in range(10_000)}
    keys = {secret_key(32) for _ in range(10_000)}

    assert len(ids) == len(keys) == 10_000
    assert {len(key) for key in keys} == {32}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_process_makes_other_ids_and_keys_than_its_parent() -> None:
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # the child: its first id and key, to the parent
        os.close(read_end)
        os.write(write_end, f"{unique_id()} {secret_key(16).hex()}".encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        child_id, child_key = pipe.read().split()
    os.waitpid(child, 0)

    parent_id, parent_key = unique_id(), secret_key(16).hex()

    assert child_id[:16] != parent_id[:16]  # the count alone would make the same ones
    assert child_key != parent_key
