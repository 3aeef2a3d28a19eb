"""Run-level files (config.json, tokenizer files, ...): immutable objects under ``files/<name>``.

A run's weights live in its versions; the files a loader needs beside them are attached
once per run. Like every object in the store they are written once: re-putting the same
bytes is a no-op, other bytes are a ConflictError.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aurora_store.errors import StoreError

if TYPE_CHECKING:
    from aurora_store.run import Run

PREFIX = "files"
MAX_NAME = 255
MAX_BYTES = 1 << 30
"""Largest attachment :func:`get_attachment` reads (tokenizer files are tens of MiB at most)."""
_TMP = ".tmp-"
"""Prefix of the store's in-flight temporary files on ``file://``; never an attachment name."""


def check_name(name: str) -> str:
    """``name`` if it is a plain file name (no path, no control characters), else a StoreError."""
    if not isinstance(name, str) or not name:
        raise StoreError(f"attachment name must be a non-empty string, got {name!r}")
    if len(name) > MAX_NAME:
        raise StoreError(f"attachment name {name[:40]!r}... is {len(name)} characters, over {MAX_NAME}")
    if "/" in name or "\\" in name or name in (".", "..") or name.startswith(_TMP):
        raise StoreError(f"attachment name {name!r} must be a plain file name (no '/', '\\', '.', '..')")
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise StoreError(f"attachment name {name!r} contains control characters")
    return name


def _key(name: str) -> str:
    return f"{PREFIX}/{check_name(name)}"


def put_attachment(run: Run, name: str, data: bytes) -> bool:
    """Attach ``data`` as ``name``; True if written, False if identical bytes were already there."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise StoreError(f"attachment {name!r}: data must be bytes, got {type(data).__name__}")
    data = bytes(data)
    return run.store.put_immutable(_key(name), data, verify=lambda existing: existing == data)


def list_attachments(run: Run) -> list[str]:
    """Names of the run's attached files, sorted."""
    out = []
    for key in run.store.list_keys(PREFIX):
        parts = key.split("/")
        if len(parts) == 2 and parts[0] == PREFIX and parts[1] and not parts[1].startswith(_TMP):
            out.append(parts[1])
    return sorted(out)


def get_attachment(run: Run, name: str, *, max_bytes: int = MAX_BYTES) -> bytes:
    """The bytes of attachment ``name`` (MissingError if the run has none by that name)."""
    return run.store.get(_key(name), max_bytes=max_bytes)
