"""Object-store I/O over fsspec: immutable puts, capped gets, parallel ranged reads.

Stores know keys (paths relative to a run prefix) and byte ranges only; they never
parse what they move. Backend exceptions are translated into the store's error family
by :func:`_translated`, around every backend call, and nowhere else. Every byte a store moves is
told to its :attr:`ObjectStore.meter`, when a role set one (its metrics count them).

Put-if-absent, per backend:
- ``file://``: the bytes go to a temporary file (``.tmp-...``) in the same directory, then
  ``os.link`` publishes it under the final name, which fails atomically if the name
  exists; a reader never sees a partial object.
- ``memory://``: check-and-set under a process-wide lock (the store is process-local).
- anything else (``s3://``, ``gs://``, ...): fsspec's ``mode="create"`` (S3
  ``If-None-Match: *``, GCS ``ifGenerationMatch=0``).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, BinaryIO

import fsspec
import numpy as np

from aurora_store.errors import ConflictError, CorruptError, LimitError, MissingError, StoreError, UnsupportedError
from aurora_store.format.keys import TMP_PREFIX
from aurora_store.redact import redact

log = logging.getLogger("aurora.store")

_MEMORY_LOCK = threading.Lock()
_PREADV = hasattr(os, "preadv")
_DATASYNC = getattr(os, "fdatasync", os.fsync)  # macOS has no fdatasync
_SYNC_EVERY = 32 << 20
"""A staged write makes every this many bytes durable while later pieces are still being made."""


@dataclass(frozen=True, slots=True)
class RangeRequest:
    """Bytes ``[start, stop)`` of object ``key``."""

    key: str
    start: int
    stop: int


class ObjectStore:
    """A run prefix on any fsspec filesystem."""

    def __init__(self, uri: str, storage_options: dict[str, Any] | None = None, *, concurrency: int = 8) -> None:
        if not isinstance(uri, str) or not uri:
            raise StoreError(f"store URI must be a non-empty string, got {uri!r}")
        self.uri = redact(uri.rstrip("/"))
        """The URI as errors and logs show it: any password in it is redacted."""
        try:
            self.fs, root = fsspec.core.url_to_fs(uri.rstrip("/"), **(storage_options or {}))
        except (ValueError, ImportError, TypeError) as exc:
            raise UnsupportedError(f"cannot open store {self.uri!r}: {redact(str(exc))}") from None
        self.root = root.rstrip("/")
        protocol = self.fs.protocol
        self.protocol = protocol if isinstance(protocol, str) else protocol[0]
        self.concurrency = max(1, int(concurrency))
        self._pool: ThreadPoolExecutor | None = None
        self._part_pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self.meter: Callable[[str, int], None] | None = None
        """Told ``(direction, bytes)`` of every write (``upload``) and read (``download``) this store
        does: what crosses to and from the bucket, for a role's metrics."""

    def _moved(self, direction: str, n: int) -> None:
        if self.meter is not None and n:
            self.meter(direction, n)

    # ------------------------------------------------------------ paths

    def path(self, key: str) -> str:
        return f"{self.root}/{key}"

    def url(self, key: str) -> str:
        return f"{self.uri}/{key}"

    @property
    def is_local(self) -> bool:
        return self.protocol in ("file", "local")

    # ------------------------------------------------------------ writes

    def put_if_absent(self, key: str, data: bytes | memoryview) -> bool:
        """Write ``data`` under ``key`` unless the key exists. True if written, False if it existed."""
        path = self.path(key)
        try:
            with _translated(self.url(key), creating=True):
                if self.is_local:
                    return _local_put_if_absent(self, key, data)
                if self.protocol == "memory":
                    with _MEMORY_LOCK:
                        if self.fs.exists(path):
                            return False
                        self.fs.pipe_file(path, bytes(data))
                        self._moved("upload", len(data))
                        return True
                self.fs.pipe_file(path, bytes(data), mode="create")
                self._moved("upload", len(data))
                return True
        except _Exists:
            if not self.is_local:  # a create-only PUT: its body was sent before the backend said the key is taken
                self._moved("upload", len(data))
            return False

    def put_immutable(
        self,
        key: str,
        data: bytes | memoryview,
        *,
        verify: Callable[[bytes], bool],
        staged: StagedWrite | None = None,
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

    def stage(self, directory: str) -> StagedWrite | None:
        """Start writing an object of ``directory`` whose key is not known yet, or None where the
        backend can only put whole objects (then put the bytes once the key is known)."""
        return StagedWrite(self, directory) if self.is_local else None

    # ------------------------------------------------------------ reads

    def exists(self, key: str) -> bool:
        with _translated(self.url(key)):
            self.fs.invalidate_cache(self.path(key))
            return bool(self.fs.exists(self.path(key)))

    def size(self, key: str) -> int:
        with _translated(self.url(key)):
            self.fs.invalidate_cache(self.path(key))
            return int(self.fs.size(self.path(key)))

    def get(self, key: str, *, max_bytes: int) -> bytes:
        """Read a whole object, refusing (without reading it all) one larger than ``max_bytes``."""
        data = self.get_range(RangeRequest(key, 0, max_bytes + 1))
        if len(data) > max_bytes:
            raise LimitError(f"{self.url(key)} is larger than the cap of {max_bytes} bytes", url=self.url(key))
        return bytes(data)

    def get_range(self, req: RangeRequest) -> bytes:
        """Bytes of a range; empty when the range starts at or past the object's end."""
        try:
            with _translated(self.url(req.key), ranged=True):
                data = bytes(self.fs.cat_file(self.path(req.key), start=req.start, end=req.stop))
            self._moved("download", len(data))
            return data
        except _Unsatisfiable:
            return b""

    def get_sized(self, key: str, size: int, part_bytes: int) -> memoryview:
        """Read an object of known ``size`` with parallel ranged GETs of ``part_bytes``, into one
        writable buffer (a shard's tensors are then used in place: no second copy).

        Returns exactly ``size`` bytes or raises: a shorter object is truncated, a longer one
        is not the object the manifest describes."""
        buf = np.empty(size, dtype=np.uint8)
        read = self._read_local if self.is_local and _PREADV else self._read_parts
        got = read(key, buf, part_bytes)
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

    def _read_local(self, key: str, buf: np.ndarray, part_bytes: int) -> int:
        """A local object read straight into ``buf`` by parallel ``preadv`` calls; the object's size."""
        view = buf.data
        with _translated(self.url(key)):
            fd = os.open(self.path(key), os.O_RDONLY)
            try:
                n = os.fstat(fd).st_size
                if n != buf.size:
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

                got = sum(self.part_pool.map(part, range(0, n, part_bytes)))
                self._moved("download", got)
                return got
            finally:
                os.close(fd)

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

    def list_keys(self, prefix: str) -> list[str]:
        """Every object key under ``prefix`` (recursive), relative to the run root; a local store's
        in-flight temporary files are not objects and are never listed."""
        base = self.path(prefix).rstrip("/")
        try:
            with _translated(self.url(prefix)):
                self.fs.invalidate_cache(base)
                found = self.fs.find(base)
        except MissingError:
            return []
        root = self.root.lstrip("/") + "/"
        keys = (p.lstrip("/")[len(root) :] for p in found if p.lstrip("/").startswith(root))
        return sorted(k for k in keys if not k.rsplit("/", 1)[-1].startswith(TMP_PREFIX))

    def list_modified(self, prefix: str) -> list[tuple[str, int, float | None]]:
        """Every object under ``prefix`` as ``(key, size, modified)``, like :meth:`list_keys`; ``modified``
        is the time (seconds since the epoch) the backend reports, from one listing: local ``mtime``,
        S3 ``LastModified``, GCS ``updated``, memory ``created``; None where it reports none it can parse."""
        base = self.path(prefix).rstrip("/")
        try:
            with _translated(self.url(prefix)):
                self.fs.invalidate_cache(base)
                found = self.fs.find(base, detail=True)
        except MissingError:
            return []
        root, out = self.root.lstrip("/") + "/", []
        for path, info in found.items():
            key = path.lstrip("/")[len(root) :]
            if not path.lstrip("/").startswith(root) or key.rsplit("/", 1)[-1].startswith(TMP_PREFIX):
                continue
            modified = None
            for name in ("mtime", "LastModified", "updated", "created"):
                value = info.get(name)
                with contextlib.suppress(TypeError, ValueError, OverflowError, OSError):
                    if isinstance(value, str):
                        value = datetime.fromisoformat(value)
                    if isinstance(value, datetime):  # a naive time is UTC, as object stores mean it
                        value = (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()
                    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
                        modified = float(value)
                        break
            size = info.get("size")
            out.append((key, size if isinstance(size, int) and size >= 0 else 0, modified))
        return sorted(out, key=lambda entry: entry[0])

    def sweep_temporaries(self, *, idle_s: float = 600.0) -> int:
        """Remove the temporary files (``.tmp-*``) a killed writer left in a local store: those not
        written to for ``idle_s`` seconds (a live writer touches its file with every piece). Returns
        how many were removed; other backends have none (an object store's uploads are atomic, and
        its abandoned multipart uploads are the bucket's lifecycle rule's to abort)."""
        if not self.is_local or not os.path.isdir(self.root):
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

    def delete(self, keys: Sequence[str]) -> int:
        """Remove objects ``keys`` (those already gone are fine); returns how many were there. Only
        ``aurora gc`` deletes, and only what it has shown no one needs: objects are otherwise immutable."""
        removed = 0
        for key in keys:
            try:
                with _translated(self.url(key)):
                    self.fs.rm_file(self.path(key))
                removed += 1
            except MissingError:
                continue
        if self.is_local:  # a local store's emptied directories go too (an object store has none)
            for directory in sorted({os.path.dirname(self.path(k)) for k in keys}, key=len, reverse=True):
                with contextlib.suppress(OSError):
                    os.rmdir(directory)
        return removed

    def require_run(self) -> None:
        """Say why nothing is here, if nothing is: MissingError naming a missing bucket or a prefix
        that holds nothing, StoreError for an endpoint that does not answer (an empty listing
        alone cannot tell these apart from an empty run)."""
        with _translated(self.uri):
            self.fs.invalidate_cache(self.root)
            if self.fs.exists(self.root) and (self.is_local or self.fs.find(self.root, maxdepth=None, withdirs=False)):
                return
            bucket = self.root.lstrip("/").split("/", 1)[0]
            if not self.is_local and self.protocol != "memory" and not self.fs.exists(bucket):
                raise MissingError(f"{self.uri}: bucket {bucket!r} does not exist (or these credentials cannot see it)")
        raise MissingError(f"{self.uri}: nothing is stored under this URI: no run here (check the prefix)")

    def close(self) -> None:
        with self._pool_lock:
            for pool in (self._pool, self._part_pool):
                if pool is not None:
                    pool.shutdown(wait=True)
            self._pool = self._part_pool = None


def _local_put_if_absent(store: ObjectStore, key: str, data: bytes | memoryview) -> bool:
    if os.path.exists(store.path(key)):
        return False
    staged = StagedWrite(store, key.rpartition("/")[0], url=store.url(key))
    try:
        staged.write(data)
    except BaseException:
        staged.discard()  # a full disk leaves no temporary file behind
        raise
    return staged.link(key)


class StagedWrite:
    """A local object written before its key is known: a shard whose SHA-256 (and so its key) is
    still being computed streams its pieces into a temporary file of the key's directory as they
    are made, and :meth:`link` makes it the object once the key is known. A reader never sees a
    partial object; a failed or abandoned write leaves no object (:meth:`discard`)."""

    def __init__(self, store: ObjectStore, directory: str, *, url: str | None = None) -> None:
        """``url``: what errors name (the object's, when its key is known), else the directory."""
        self._store, self._directory = store, directory
        self._url = url or store.url(directory)
        where = store.path(directory)
        with _translated(self._url, creating=True):
            os.makedirs(where, exist_ok=True)
            self._tmp = os.path.join(where, f"{TMP_PREFIX}{uuid.uuid4().hex}")
            self._file: BinaryIO | None = open(self._tmp, "xb")  # noqa: SIM115 (closed by link or discard)
        self._unsynced = 0

    def write(self, piece: bytes | memoryview) -> None:
        """Append the next piece (in order: one writer at a time)."""
        if self._file is None:
            raise StoreError("write to a staged object after it was linked or discarded")
        with _translated(self._url):
            self._file.write(piece)
            self._store._moved("upload", len(piece))
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
            with _translated(self._store.url(key), creating=True):
                self._file.flush()
                os.fsync(self._file.fileno())
                self._file.close()
                self._file = None
                try:
                    os.link(self._tmp, self._store.path(key))
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


class _Exists(Exception):
    """A create-only write found the key taken (the backend's own way of saying so)."""


class _Unsatisfiable(Exception):
    """A ranged read started at or past the object's end (HTTP 416)."""


@contextmanager
def _translated(url: str, *, creating: bool = False, ranged: bool = False) -> Iterator[None]:
    """The one place backend exceptions become the store's: every backend call runs inside it.
    ``creating``: a create-only write, where "the key exists" is an answer (:class:`_Exists`);
    ``ranged``: a ranged read, where "nothing at that offset" is one (:class:`_Unsatisfiable`)."""
    try:
        yield
    except StoreError:
        raise
    except Exception as exc:
        taken = isinstance(exc, FileExistsError) or (
            isinstance(exc, OSError) and exc.errno == errno.EINVAL and "recondition" in str(exc)
        )  # S3 412 on If-None-Match, as some servers word it
        if taken and creating:
            raise _Exists from None
        if ranged and isinstance(exc, OSError) and "not satisfiable" in str(exc).lower():
            raise _Unsatisfiable from None
        if isinstance(exc, FileExistsError):
            raise ConflictError(f"{url} already exists", url=url) from exc
        if isinstance(exc, FileNotFoundError) or getattr(exc, "errno", None) == errno.ENOENT:
            raise MissingError(f"{url} does not exist", url=url) from exc
        raise StoreError(f"{url}: storage backend error: {type(exc).__name__}: {exc}"[:500], url=url) from exc
