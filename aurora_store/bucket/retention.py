"""A run's retention records, read from its bucket (the format is :mod:`aurora_store.format.retention`)."""

from __future__ import annotations

from aurora_store.bucket.objectstore import ObjectStore
from aurora_store.errors import StoreError
from aurora_store.format import retention
from aurora_store.format.retention import Retired


def records(store: ObjectStore) -> tuple[list[str], Retired, list[str]]:
    """The run's retention records: their keys, the versions they retire together, and the ones that
    could not be read (``key: why``; they retire nothing)."""
    keys, bad = [], []
    retired = Retired()
    for key in store.list_keys(retention.DIR):
        try:
            record = retention.decode(store.get(key, max_bytes=retention.MAX_RECORD_BYTES), key)
        except StoreError as exc:
            bad.append(f"{key}: {exc}")
            continue
        keys.append(key)
        retired = retired | record.retired
    return keys, retired, bad
