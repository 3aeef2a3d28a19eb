"""Storage backends: one abstract :class:`Backend` with declared :class:`Capabilities`, one module
per kind of storage, and :func:`open_backend`, the one place a URI picks its backend.

- ``file://`` -> :mod:`~aurora_store.storage._local` (``link(2)`` create-only, staged writes, ``preadv``;
  the path percent-decoded, this host only: :func:`local_uri`)
- ``memory://`` -> :mod:`~aurora_store.storage._memory` (check-and-set under a process-wide lock)
- gcsfs (``gs://``, ``gcs://``) -> :mod:`~aurora_store.storage._gcs` (the fsspec backend on the upload
  paths where GCS's ``ifGenerationMatch=0`` holds)
- any other fsspec protocol -> :mod:`~aurora_store.storage._fsspec`, only where its ``mode="create"``
  is known to be atomic (S3) or declared so with :func:`trust_atomic_create`.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

import fsspec
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem

from aurora_store.errors import UnsupportedError
from aurora_store.redact import redact
from aurora_store.storage import _fsspec
from aurora_store.storage._fsspec import ATOMIC_CREATE, FsspecBackend, trust_atomic_create
from aurora_store.storage._gcs import GcsBackend, is_gcsfs
from aurora_store.storage._local import LocalBackend, StagedWrite
from aurora_store.storage._memory import MemoryBackend
from aurora_store.storage.base import Backend, Capabilities, Meter, Staged, translated

__all__ = [
    "ATOMIC_CREATE",
    "Backend",
    "Capabilities",
    "FsspecBackend",
    "GcsBackend",
    "LocalBackend",
    "MemoryBackend",
    "Meter",
    "Staged",
    "StagedWrite",
    "open_backend",
    "translated",
    "trust_atomic_create",
]

_BY_FILESYSTEM: dict[type, type[Backend]] = {LocalFileSystem: LocalBackend, MemoryFileSystem: MemoryBackend}
"""Filesystems whose create-only this package does itself. By exact type: a subclass may change
what ``exists`` or ``pipe_file`` mean, so it is an fsspec backend like any other."""


OWN_PROTOCOLS = frozenset({"file", "local", "memory"})
"""Protocols whose backends this package writes itself; every other must be in :data:`ATOMIC_CREATE`,
checked before fsspec creates a filesystem (which for ftp:// already connects to its host)."""

NO_CREDENTIALS = frozenset({"s3", "s3a", "gs", "gcs", "file", "local", "memory"})
"""Protocols whose URIs never carry credentials: their backends read ``user:password@`` as part of
the bucket's name or path, and echo it in their errors."""


def open_backend(uri: str, storage_options: dict[str, Any] | None = None, *, meter: Meter | None = None) -> Backend:
    """The backend for ``uri`` (a non-empty fsspec URI), opened with ``storage_options``; an
    :class:`~aurora_store.errors.UnsupportedError` for a URI fsspec cannot open, one with
    credentials its protocol does not read, or a protocol that cannot create objects atomically."""
    shown = redact(uri.rstrip("/"))
    protocol, sep, rest = uri.partition("://")
    if sep and protocol.lower() in NO_CREDENTIALS and shown != uri.rstrip("/"):
        raise UnsupportedError(
            f"cannot open store {shown!r}: a {protocol}:// URI takes no credentials (they would be read as part "
            "of the bucket's name); give them in the storage options' credential keys or the environment"
        )
    atomic = _fsspec.ATOMIC_CREATE  # looked up now: trust_atomic_create() may have added to it
    if "::" in uri or (sep and protocol.lower() not in OWN_PROTOCOLS and protocol.lower() not in atomic):
        what = "a chained URI (::) is not one bucket" if "::" in uri else f"fsspec protocol {protocol!r}"
        raise UnsupportedError(
            f"cannot open store {shown!r}: {what} is not known to create objects atomically (an exists-then-"
            "write emulation would let a racing writer replace an immutable object); known: "
            f"{', '.join(sorted({*OWN_PROTOCOLS, *atomic}))}. Refused before anything is contacted. If a "
            "protocol's mode='create' is one conditional request, declare it with "
            "aurora_store.storage.trust_atomic_create()",
            url=shown,
        )
    if sep and protocol.lower() == "file":
        uri = local_uri(rest, shown)
    try:
        fs, root = fsspec.core.url_to_fs(uri.rstrip("/"), **(storage_options or {}))
    except (ValueError, ImportError, TypeError) as exc:
        raise UnsupportedError(f"cannot open store {shown!r}: {redact(str(exc))}") from None
    backend = _BY_FILESYSTEM.get(type(fs)) or (GcsBackend if is_gcsfs(fs) else FsspecBackend)
    return backend(fs, root, shown, meter if meter is not None else Meter())


def local_uri(rest: str, shown: str) -> str:
    """A ``file://`` URI (``rest``: what follows ``file://``) as fsspec's local filesystem takes it:
    its path percent-decoded (as RFC 8089 and ``Path.as_uri()`` write it, so both spellings name one
    directory), on this host only (an empty host or ``localhost``)."""
    host, slash, path = rest.partition("/")
    if host.lower() not in ("", "localhost"):
        raise UnsupportedError(
            f"cannot open store {shown!r}: file://{host}/ names a host, and a file:// URI reads this machine's "
            f"files only: write file:///absolute/path (three slashes)"
        )
    return "file://" + slash + unquote(path)
