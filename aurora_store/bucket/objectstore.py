"""Object-store I/O: immutable puts, capped gets, parallel ranged reads, over one storage backend.

Stores know keys (paths relative to a run prefix) and byte ranges only; they never parse what
they move. How each kind of storage creates an object once, stages a write or reads in place is
its backend's (:mod:`aurora_store.storage`), chosen from the URI when the store is opened; a
backend that cannot create atomically is refused then. Backend exceptions become the store's
error family in :func:`aurora_store.storage.translated`, around every backend call. Every byte a
store moves is told to its :attr:`ObjectStore.meter`, when a role set one (its metrics count them).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from aurora_store.errors import ConflictError, CorruptError, LimitError, MissingError, StoreError
from aurora_store.format.keys import RUN_DIRS, TMP_PREFIX
from aurora_store.storage import Capabilities, Meter, Staged, StagedWrite, open_backend, translated

__all__ = ["ObjectStore", "RangeRequest", "Staged", "StagedWrite"]


@dataclass(frozen=True, slots=True)
class RangeRequest:
    """Bytes ``[start, stop)`` of object ``key``."""

    key: str
    start: int
    stop: int


class ObjectStore:
    """A run prefix on one storage backend (any fsspec URI whose backend creates atomically)."""

    def __init__(self, uri: str, storage_options: dict[str, Any] | None = None, *, concurrency: int = 8) -> None:
        if not isinstance(uri, str) or not uri:
            raise StoreError(f"store URI must be a non-empty string, got {uri!r}")
        self._meter = Meter()
        self.backend = open_backend(uri, storage_options, meter=self._meter)
        """Where the bytes go; what it can do is :attr:`capabilities`."""
        self.concurrency = max(1, int(concurrency))
        self._pool: ThreadPoolExecutor | None = None
        self._part_pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    @property
    def uri(self) -> str:
        """The URI as errors and logs show it: any password in it is redacted."""
        return self.backend.uri

    @property
    def root(self) -> str:
        return self.backend.root

    @property
    def fs(self) -> Any:
        """The fsspec filesystem underneath (what only a test may go around the store through)."""
        return self.backend.fs

    @property
    def capabilities(self) -> Capabilities:
        return self.backend.capabilities

    @property
    def meter(self) -> Callable[[str, int], None] | None:
        """Told ``(direction, bytes)`` of every write (``upload``) and read (``download``) this store
        does: what crosses to and from the bucket, for a role's metrics."""
        return self._meter.sink

    @meter.setter
    def meter(self, sink: Callable[[str, int], None] | None) -> None:
        self._meter.sink = sink

    # ------------------------------------------------------------ paths

    def path(self, key: str) -> str:
        return self.backend.path(key)

    def url(self, key: str) -> str:
        return self.backend.url(key)

    # ------------------------------------------------------------ writes

    def put_if_absent(self, key: str, data: bytes | memoryview) -> bool:
        """Write ``data`` under ``key`` unless the key exists. True if written, False if it existed."""
        with translated(self.url(key)):
            return self.backend.create(key, data)

    def put_immutable(
        self,
        key: str,
        data: bytes | memoryview,
        *,
        verify: Callable[[bytes], bool],
        staged: Staged | None = None,
    ) -> bool:
        """Put-if-absent that tolerates an identical object already there (a retried write).

        Returns True if this call wrote the object. If another object holds the key and
        ``verify`` rejects its bytes, that is a ConflictError: objects are never rewritten.
        ``staged``: ``data`` was already written there (see :meth:`stage`); it is linked, not rewritten."""
        if staged.link(key) if staged is not None else self.put_if_absent(key, data):
            return True
        existing = self.get(key, max_bytes=len(data) + 1)
        if not verify(existing):
            raise ConflictError(
                f"{self.url(key)} already exists with different content; objects are immutable", url=self.url(key)
            )
        return False

    def stage(self, directory: str) -> Staged | None:
        """Start writing an object of ``directory`` whose key is not known yet, or None where the
        backend can only put whole objects (then put the bytes once the key is known)."""
        if not self.capabilities.staged_write:
            return None
        return self.backend.stage(directory, self.url(directory))

    # ------------------------------------------------------------ reads

    def exists(self, key: str) -> bool:
        with translated(self.url(key)):
            return self.backend.exists(key)

    def size(self, key: str) -> int:
        with translated(self.url(key)):
            return self.backend.size(key)

    def get(self, key: str, *, max_bytes: int) -> bytes:
        """Read a whole object, refusing (without reading it all) one larger than ``max_bytes``."""
        data = self.get_range(RangeRequest(key, 0, max_bytes + 1))
        if len(data) > max_bytes:
            raise LimitError(f"{self.url(key)} is larger than the cap of {max_bytes} bytes", url=self.url(key))
        return bytes(data)

    def get_range(self, req: RangeRequest) -> bytes:
        """Bytes of a range; empty when the range starts at or past the object's end."""
        with translated(self.url(req.key)):
            return self.backend.read_range(req.key, req.start, req.stop)

    def get_sized(self, key: str, size: int, part_bytes: int) -> memoryview:
        """Read an object of known ``size`` with parallel ranged GETs of ``part_bytes``, into one
        writable buffer (a shard's tensors are then used in place: no second copy).

        Returns exactly ``size`` bytes or raises: a shorter object is truncated, a longer one
        is not the object the manifest describes."""
        buf = np.empty(size, dtype=np.uint8)
        if self.capabilities.positional_read:
            with translated(self.url(key)):
                got = self.backend.read_into(key, buf.data, part_bytes, self.part_pool)
        else:
            got = self._read_parts(key, buf, part_bytes)
        if got != size:
            what = "truncated" if got < size else "longer than recorded"
            raise CorruptError(f"{self.url(key)} is {what}: {got} bytes, manifest says {size}", url=self.url(key))
        return buf.data

    def _read_parts(self, key: str, buf: np.ndarray, part_bytes: int) -> int:
        """Ranged GETs into ``buf`` (one past its end, to see a longer object); the bytes seen."""
        size = buf.size
        parts = [RangeRequest(key, lo, min(lo + part_bytes, size + 1)) for lo in range(0, size + 1, part_bytes)]
        results = [self.get_range(parts[0])] if len(parts) == 1 else self.part_pool.map(self.get_range, parts)
        got = 0
        for req, data in zip(parts, results, strict=True):
            n = min(len(data), size - req.start)
            buf[req.start : req.start + n] = np.frombuffer(data, dtype=np.uint8, count=n)
            got += len(data)
        return got

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[Any]:
        """Run ``fn`` over ``items`` on the store's I/O pool, yielding results in order."""
        return self.pool.map(fn, items)

    @property
    def pool(self) -> ThreadPoolExecutor:
        """Workers for whole-object tasks (fetch, verify, decode), ``concurrency`` of them."""
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="aurora-io")
            return self._pool

    @property
    def part_pool(self) -> ThreadPoolExecutor:
        """Workers for ranged-GET parts only. Separate from :attr:`pool`, whose tasks wait on parts:
        sharing one pool deadlocks once every worker waits on parts queued behind it."""
        with self._pool_lock:
            if self._part_pool is None:
                self._part_pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="aurora-part")
            return self._part_pool

    def _listing(self, prefix: str, *, detail: bool) -> Iterator[tuple[str, Any]]:
        """``(key, info)`` of every object under ``prefix``, relative to the run root; temporary
        files of in-flight staged writes are not objects and are never listed."""
        try:
            with translated(self.url(prefix)):
                found = self.backend.find(prefix, detail=detail)
        except MissingError:
            return
        root = self.root.lstrip("/") + "/"
        for path in found:
            key = path.lstrip("/")[len(root) :]
            if path.lstrip("/").startswith(root) and not key.rsplit("/", 1)[-1].startswith(TMP_PREFIX):
                yield key, found[path] if detail else None

    def list_keys(self, prefix: str) -> list[str]:
        """Every object key under ``prefix`` (recursive), relative to the run root."""
        return sorted(key for key, _ in self._listing(prefix, detail=False))

    def list_modified(self, prefix: str) -> list[tuple[str, int, float | None]]:
        """Every object under ``prefix`` as ``(key, size, modified)``, like :meth:`list_keys`, from one
        listing; ``modified`` is when the backend says it was written (seconds since the epoch), None
        where it reports no time it can parse (:attr:`Capabilities.mtime`)."""
        out = []
        for key, info in self._listing(prefix, detail=True):
            size = info.get("size")
            out.append((key, size if isinstance(size, int) and size >= 0 else 0, self.backend.modified(info)))
        return sorted(out, key=lambda entry: entry[0])

    def sweep_temporaries(self, *, idle_s: float = 600.0) -> int:
        """Remove the temporary files (``.tmp-*``) killed writers left in a backend that stages writes:
        those not written to for ``idle_s`` seconds. Returns how many were removed; other backends have
        none (an object store's uploads are atomic, and its abandoned multipart uploads are the
        bucket's lifecycle rule's to abort)."""
        return self.backend.sweep_temporaries(idle_s)

    def delete(self, keys: Sequence[str]) -> int:
        """Remove objects ``keys`` (those already gone are fine); returns how many removals the backend
        made (S3 and GCS report a key that was already gone as removed too). Only ``aurora gc`` deletes,
        and only what it has shown no one needs (and a publisher, a stray key-rotation marker): objects
        are otherwise immutable."""
        removed = 0
        for key in keys:
            try:
                with translated(self.url(key)):
                    self.backend.remove(key)
                removed += 1
            except MissingError:
                continue
        return removed

    def require_run(self) -> None:
        """Say why no run is here, if none is: MissingError naming a missing bucket, a prefix that holds
        nothing, or one that holds other things than a run's; StoreError for an endpoint that does not
        answer (an empty listing alone cannot tell these apart from an empty run; an empty directory
        is an empty run)."""
        with translated(self.uri):
            if self.backend.holds_anything():
                names = self.backend.top_names()
                if names and not names & RUN_DIRS:
                    shown = ", ".join(sorted(names)[:5]) + (", ..." if len(names) > 5 else "")
                    raise MissingError(
                        f"{self.uri}: holds {shown} but no run (a run keeps {', '.join(sorted(RUN_DIRS))} "
                        "under its root): check the prefix"
                    )
                return
            bucket = self.backend.missing_bucket()
        if bucket is not None:
            raise MissingError(f"{self.uri}: bucket {bucket!r} does not exist (or these credentials cannot see it)")
        raise MissingError(f"{self.uri}: nothing is stored under this URI: no run here (check the prefix)")

    def close(self) -> None:
        with self._pool_lock:
            for pool in (self._pool, self._part_pool):
                if pool is not None:
                    pool.shutdown(wait=True)
            self._pool = self._part_pool = None
