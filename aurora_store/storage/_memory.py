"""``memory://``: fsspec's in-memory filesystem, one per process (tests, single-process runs).

Create-only: check and set under one process-wide lock. That is atomic because the filesystem
lives in this process only: every writer to it takes the same lock.
"""

from __future__ import annotations

import threading

from aurora_store.storage.base import Backend, Capabilities

_LOCK = threading.Lock()


class MemoryBackend(Backend):
    """fsspec's ``MemoryFileSystem``, which reports when each object was ``created``."""

    capabilities = Capabilities(atomic_create=True, staged_write=False, positional_read=False, mtime=True)
    modified_fields = ("created",)

    def create(self, key: str, data: bytes | memoryview) -> bool:
        path = self.path(key)
        with _LOCK:
            if self.fs.exists(path):
                return False
            self.fs.pipe_file(path, bytes(data))
        self.meter("upload", len(data))
        return True
