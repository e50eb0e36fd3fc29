"""`app.sdk._ids.fast_uuid7`: the publish path's message ids (uuid_utils since issue 29)."""

from __future__ import annotations

import os
import uuid


def test_ids_are_rfc9562_version_7_strings_in_canonical_form():
    from app.sdk._ids import fast_uuid7

    for _ in range(100):
        text = fast_uuid7()
        u = uuid.UUID(text)
        assert str(u) == text and u.version == 7 and u.variant == uuid.RFC_4122


def test_ids_of_one_process_are_unique_and_in_order_within_a_millisecond():
    from app.sdk._ids import fast_uuid7

    ids = [fast_uuid7() for _ in range(50_000)]  # many share a millisecond
    assert ids == sorted(ids) and len(set(ids)) == len(ids)


def test_a_forked_child_draws_other_ids_than_its_parent():
    from app.sdk._ids import fast_uuid7

    fast_uuid7()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.write(write, " ".join(fast_uuid7() for _ in range(100)).encode())
        os._exit(0)
    os.close(write)
    parent = {fast_uuid7() for _ in range(100)}
    chunks = []
    while chunk := os.read(read, 65536):
        chunks.append(chunk)
    os.close(read)
    os.waitpid(pid, 0)
    child = set(b"".join(chunks).decode().split())
    assert len(child) == 100 and not parent & child
