"""Run-level files (config.json, tokenizer files, ...): immutable objects under ``files/<name>``.

A run's weights live in its versions; the files a loader needs beside them are attached
once per run. Like every object in the store they are written once: re-putting the same
bytes is a no-op, other bytes are a ConflictError. Every manifest lists the attachments
present at publish time with their SHA-256, so a signature covers them.
"""

from __future__ import annotations

import hashlib

from aurora_store.bucket.objectstore import ObjectStore
from aurora_store.errors import CorruptError, StoreError
from aurora_store.format.keys import FILES_DIR, TMP_PREFIX, check_file_name, file_key, is_file_name
from aurora_store.format.manifest import Segment

MAX_NAME = 255
MAX_BYTES = 1 << 30
"""Largest attachment :meth:`Attachments.get` reads (tokenizer files are tens of MiB at most)."""


def check_name(name: str) -> str:
    """``name`` if it is a plain file name of ``[A-Za-z0-9._-]`` (what manifests allow), else a StoreError."""
    if not isinstance(name, str) or not name:
        raise StoreError(f"attachment name must be a non-empty string, got {name!r}")
    if len(name) > MAX_NAME:
        raise StoreError(f"attachment name {name[:40]!r}... is {len(name)} characters, over {MAX_NAME}")
    if name.startswith(TMP_PREFIX):
        raise StoreError(f"attachment name {name!r} is reserved for the store's temporary files")
    try:
        return check_file_name(name, "attachment")
    except CorruptError as exc:
        raise StoreError(str(exc)) from None


class Attachments:
    """The attached files of the run under ``store``."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self._refs: dict[str, Segment] = {}

    def put(self, name: str, data: bytes) -> bool:
        """Attach ``data`` as ``name``; True if written, False if identical bytes were already there."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise StoreError(f"attachment {name!r}: data must be bytes, got {type(data).__name__}")
        data = bytes(data)
        return self.store.put_immutable(file_key(check_name(name)), data, verify=lambda existing: existing == data)

    def names(self) -> list[str]:
        """Names of the run's attached files, sorted. A key no :meth:`put` could have written is never listed."""
        out = []
        for key in self.store.list_keys(FILES_DIR):
            parts = key.split("/")
            if len(parts) == 2 and parts[0] == FILES_DIR and is_file_name(parts[1]) and len(parts[1]) <= MAX_NAME:
                out.append(parts[1])
        return sorted(out)

    def get(self, name: str, *, max_bytes: int = MAX_BYTES) -> bytes:
        """The bytes of attachment ``name`` (MissingError if the run has none by that name)."""
        return self.store.get(file_key(check_name(name)), max_bytes=max_bytes)

    def refs(self) -> tuple[Segment, ...]:
        """Size and SHA-256 of every attachment, for a manifest; each file is hashed once per instance."""
        out = []
        for name in self.names():
            key = file_key(name)
            ref = self._refs.get(key)
            if ref is None:
                data = self.store.get(key, max_bytes=MAX_BYTES)
                ref = self._refs[key] = Segment(key, len(data), hashlib.sha256(data).hexdigest())
            out.append(ref)
        return tuple(out)
