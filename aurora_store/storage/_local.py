"""``file://``: a run root in a local directory.

Create-only: the bytes go to a temporary file (``.tmp-...``) in the key's directory, are fsynced,
and ``link(2)`` publishes them under the final name; ``link`` fails atomically if the name
exists, so of racing writers exactly one wins and no reader ever sees a partial object.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import uuid
from typing import TYPE_CHECKING, BinaryIO

from aurora_store.errors import StoreError
from aurora_store.format.keys import TMP_PREFIX
from aurora_store.localfile import open_regular, pread_bounded
from aurora_store.storage.base import Backend, Capabilities, translated

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger("aurora.store")

_DATASYNC = getattr(os, "fdatasync", os.fsync)  # macOS has no fdatasync
_SYNC_EVERY = 32 << 20
"""A staged write makes every this many bytes durable while later pieces are still being made."""


class LocalBackend(Backend):
    """A directory on this machine, written through the OS (``link``, ``preadv``, ``fsync``)."""

    capabilities = Capabilities(
        atomic_create=True, staged_write=True, positional_read=hasattr(os, "preadv"), mtime=True
    )
    modified_fields = ("mtime",)

    def create(self, key: str, data: bytes | memoryview) -> bool:
        if os.path.exists(self.path(key)):
            return False
        staged = self.stage(key.rpartition("/")[0], self.url(key))
        try:
            staged.write(data)
        except BaseException:
            staged.discard()  # a full disk leaves no temporary file behind
            raise
        return staged.link(key)

    def stage(self, directory: str, url: str) -> StagedWrite:
        return StagedWrite(self, directory, url=url)

    def remove(self, key: str) -> None:
        try:
            super().remove(key)
        finally:  # its directory goes too once emptied (an object store has none)
            with contextlib.suppress(OSError):
                os.rmdir(os.path.dirname(self.path(key)))

    def read_range(self, key: str, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` of a regular file (a FIFO or device planted under the run is
        refused before a byte is read: :func:`~aurora_store.localfile.open_regular`)."""
        fd = open_regular(self.path(key))
        try:
            data = pread_bounded(fd, start, stop)
        finally:
            os.close(fd)
        self.meter("download", len(data))
        return data

    def read_into(self, key: str, view: memoryview, part_bytes: int, pool: ThreadPoolExecutor) -> int:
        """Parallel ``preadv`` calls straight into ``view``; the file's size (nothing is read when it
        is not ``len(view)``, nor when it is not a regular file)."""
        fd = open_regular(self.path(key))
        try:
            n = os.fstat(fd).st_size
            if n != len(view):
                return n

            def part(lo: int) -> int:
                hi = min(lo + part_bytes, n)
                at = lo
                while at < hi:
                    got = os.preadv(fd, [view[at:hi]], at)
                    if got == 0:
                        break  # shrank under us: immutable objects do not; the caller says truncated
                    at += got
                return at - lo

            got = sum(pool.map(part, range(0, n, part_bytes)))
            self.meter("download", got)
            return got
        finally:
            os.close(fd)

    def holds_anything(self) -> bool:
        return bool(self.fs.exists(self.root))  # a directory is there: an empty run, not a wrong path

    def sweep_temporaries(self, idle_s: float) -> int:
        """Remove the temporary files a killed writer left: those not written to for ``idle_s``
        seconds (a live writer touches its file with every piece)."""
        if not os.path.isdir(self.root):
            return 0
        removed, cutoff = 0, time.time() - idle_s
        for directory, _dirs, names in os.walk(self.root):
            for name in names:
                path = os.path.join(directory, name)
                try:
                    if name.startswith(TMP_PREFIX) and os.lstat(path).st_mtime < cutoff:
                        os.unlink(path)
                        removed += 1
                except OSError:
                    continue  # gone already (another sweeper), or not ours to remove
        if removed:
            log.info("%s: removed %d temporary files left by killed writers", self.uri, removed)
        return removed


class StagedWrite:
    """A local object written before its key is known: a shard whose SHA-256 (and so its key) is
    still being computed streams its pieces into a temporary file of the key's directory as they
    are made, and :meth:`link` makes it the object once the key is known. A reader never sees a
    partial object; a failed or abandoned write leaves no object (:meth:`discard`)."""

    def __init__(self, backend: LocalBackend, directory: str, *, url: str) -> None:
        """``url``: what errors name (the object's, when its key is known, else the directory's)."""
        self._backend, self._directory, self._url = backend, directory, url
        where = backend.path(directory)
        with translated(url):
            os.makedirs(where, exist_ok=True)
            self._tmp = os.path.join(where, f"{TMP_PREFIX}{uuid.uuid4().hex}")
            self._file: BinaryIO | None = open(self._tmp, "xb")  # noqa: SIM115 (closed by link or discard)
        self._unsynced = 0

    def write(self, piece: bytes | memoryview) -> None:
        """Append the next piece (in order: one writer at a time)."""
        if self._file is None:
            raise StoreError("write to a staged object after it was linked or discarded")
        with translated(self._url):
            self._file.write(piece)
            self._backend.meter("upload", len(piece))
            self._unsynced += len(piece)
            if self._unsynced >= _SYNC_EVERY:  # flush as it goes: the final fsync is then short
                self._file.flush()
                _DATASYNC(self._file.fileno())
                self._unsynced = 0

    def link(self, key: str) -> bool:
        """Make the bytes written so far durable and the object ``key`` (in the staged directory).
        False if ``key`` already exists; the temporary file is gone either way."""
        if key.rpartition("/")[0] != self._directory or self._file is None:
            self.discard()
            raise StoreError(f"staged object of {self._directory!r} cannot become {key!r}")
        try:
            with translated(self._backend.url(key)):
                self._file.flush()
                os.fsync(self._file.fileno())
                self._file.close()
                self._file = None
                try:
                    os.link(self._tmp, self._backend.path(key))
                except FileExistsError:
                    return False
                return True
        finally:
            self.discard()

    def discard(self) -> None:
        """Drop what was written; nothing was published."""
        if self._file is not None:
            self._file.close()
            self._file = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._tmp)
