"""What only a test may do to a store: rewrite or remove an object behind the store's back.

The store itself never overwrites or deletes (objects are immutable); these plant the damage
that readers, relays, actors and audits must detect. They go around :class:`ObjectStore`'s
API on purpose, through its fsspec filesystem.
"""

from __future__ import annotations

import os

from fsspec.implementations.local import LocalFileSystem

from aurora_store.bucket.objectstore import ObjectStore


def overwrite(store: ObjectStore, key: str, data: bytes) -> None:
    """Write ``data`` under ``key`` unconditionally (a corrupted or replaced object)."""
    if isinstance(store.fs, LocalFileSystem):  # the one filesystem here with real directories
        os.makedirs(os.path.dirname(store.path(key)), exist_ok=True)
    store.fs.pipe_file(store.path(key), data)


def delete(store: ObjectStore, key: str) -> None:
    """Remove the object ``key`` (a lost object)."""
    store.fs.rm_file(store.path(key))
