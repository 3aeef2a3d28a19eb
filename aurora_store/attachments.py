"""Run-level files (config.json, tokenizer files, ...): immutable objects under ``files/<name>``.

A run's weights live in its versions; the files a loader needs beside them are attached
once per run. Like every object in the store they are written once: re-putting the same
bytes is a no-op, other bytes are a ConflictError.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aurora_store.errors import CorruptError, StoreError
from aurora_store.manifest import FILES_DIR, check_file_name

if TYPE_CHECKING:
    from aurora_store.run import Run

PREFIX = FILES_DIR
MAX_NAME = 255
MAX_BYTES = 1 << 30
"""Largest attachment :func:`get_attachment` reads (tokenizer files are tens of MiB at most)."""
_TMP = ".tmp-"
"""Prefix of the store's in-flight temporary files on ``file://``; never an attachment name."""


def check_name(name: str) -> str:
    """``name`` if it is a plain file name of ``[A-Za-z0-9._-]`` (what manifests allow), else a StoreError."""
    if not isinstance(name, str) or not name:
        raise StoreError(f"attachment name must be a non-empty string, got {name!r}")
    if len(name) > MAX_NAME:
        raise StoreError(f"attachment name {name[:40]!r}... is {len(name)} characters, over {MAX_NAME}")
    if name.startswith(_TMP):
        raise StoreError(f"attachment name {name!r} is reserved for the store's temporary files")
    try:
        return check_file_name(name, "attachment")
    except CorruptError as exc:
        raise StoreError(str(exc)) from None


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
        if len(parts) == 2 and parts[0] == PREFIX and not parts[1].startswith(_TMP):
            try:
                out.append(check_name(parts[1]))
            except StoreError:
                continue  # not something put_attachment could have written: never listed, never signed
    return sorted(out)


def get_attachment(run: Run, name: str, *, max_bytes: int = MAX_BYTES) -> bytes:
    """The bytes of attachment ``name`` (MissingError if the run has none by that name)."""
    return run.store.get(_key(name), max_bytes=max_bytes)
